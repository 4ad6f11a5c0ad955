"""Before its workers start, a run resolves the policy's checkpoint (refusing a bad one) without loading the model:
loading it on the controller cost every run's start seconds of transformers' modelling imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "code_rl.py"


def test_a_missing_model_is_refused_before_any_worker_starts(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(ConfigError, match=rf"model '{missing}': no Hugging Face checkpoint there"):
        build_controller(RECIPE, [f"model={missing}"], tmp_path / "run")
    assert not (tmp_path / "run" / "logs" / "rollout-0.log").exists()  # no worker was started


def test_the_controller_resolves_the_built_in_model_without_importing_the_modelling_code(tmp_path):
    # a fresh interpreter: this process's imports would hide the controller's own
    script = (
        "import sys\n"
        "from areal.cli.run import build_controller\n"
        f"controller = build_controller({str(RECIPE)!r}, [], {str(tmp_path / 'run')!r})\n"
        "controller.lock.release()\n"
        "print('transformers.modeling_utils' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"
