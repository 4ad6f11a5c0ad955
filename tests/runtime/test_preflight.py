"""A node's own check that this machine can run it comes before any worker or run directory exists."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import RunError
from areal.rewards import code_reward, detect_layers

CODE_RL = Path(__file__).resolve().parents[2] / "recipes" / "code_rl.py"


def test_a_sandbox_that_cannot_be_had_stops_the_run_before_it_starts_naming_the_node(tmp_path, monkeypatch):
    refused = dataclasses.replace(
        detect_layers(), namespaces=False,
        problem="/usr/bin/bwrap: cannot create namespaces: bwrap: setting up uid map: Permission denied "
                "(unprivileged user namespaces are off: kernel.apparmor_restrict_unprivileged_userns = 1; ...)",
    )
    monkeypatch.setattr(code_reward, "detect_layers", lambda: refused)
    with pytest.raises(RunError) as caught:
        build_controller(CODE_RL, ["steps=2"], tmp_path / "run")
    message = str(caught.value)
    line = next(i for i, text in enumerate(CODE_RL.read_text().splitlines(), 1) if 'reward("score"' in text)
    assert f"code_rl.py:{line}: node 'score' (reward): code sandbox: missing PID namespace, network" in message
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in message and "Ways out:" in message
    assert not (tmp_path / "run").exists()  # nothing was started or written
