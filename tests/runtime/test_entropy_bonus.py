"""trainer.entropy_coef in a real run: the step's `entropy` (π_θ's own, over the trained tokens) climbs under the
bonus where the same run without it lets the policy sharpen."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from areal.cli.progress import summary_table
from areal.cli.run import build_controller
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")


def step_entropies(run_dir: Path) -> list[float]:
    return [json.loads(line)["entropy"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"kind": "step"' in line]


def test_an_entropy_bonus_raises_the_policys_entropy_where_the_same_run_without_it_lets_it_fall(tmp_path):
    model = make_checkpoint(tmp_path / "ckpt")
    # temperature 0.1: the random model's tempered policy starts far from uniform, with room to spread
    settings = [f"model={model}", "trainer.lr=0.05", "generation.temperature=0.1"]
    entropy, summary = {}, Console(file=io.StringIO(), width=300)
    for coef in (0.0, 1.0):
        controller = build_controller(TINY_RL, [*settings, f"trainer.entropy_coef={coef}"], tmp_path / f"run-{coef}")
        controller.run()
        entropy[coef] = step_entropies(tmp_path / f"run-{coef}")
        summary.print(summary_table(controller))
    assert len(entropy[0.0]) == len(entropy[1.0]) == 4
    assert entropy[0.0][0] == entropy[1.0][0]  # the same policy at the first update's forward
    assert all(b > a for a, b in zip(entropy[1.0], entropy[1.0][1:])), entropy  # rises at every step
    assert entropy[1.0][-1] > 2 * entropy[1.0][0] and entropy[1.0][-1] > entropy[0.0][-1] + 1.0, entropy
    said = summary.file.getvalue()  # the run's end says where the entropy went
    for coef in (0.0, 1.0):
        row = f"{entropy[coef][0]:.3f} → {entropy[coef][-1]:.3f} nats per trained token"
        assert re.search(rf"policy entropy +│ {row}", said), said
