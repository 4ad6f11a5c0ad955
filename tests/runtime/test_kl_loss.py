"""trainer.kl_coef: GRPO's KL loss to a frozen reference reaches the loss as the kernel defines it, grows as the policy
leaves the reference in a real run, and is refused where no frozen reference feeds the trainer."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from areal.cli.run import build_controller
from areal.config import RunConfig
from areal.errors import ConfigError
from areal.graph.batch import Batch, Ragged
from areal.graph.recipe import load_recipe
from areal.nodes.workers.trainer import ProximalNode, TrainerNode
from areal.runtime.compiler.compile import compile_plan
from tests.local_model import make_checkpoint

TINY_RL = Path(__file__).with_name("tiny_rl.py")


def recipe_with(tmp_path: Path, line: str) -> Path:
    """tiny_rl.py with one more node."""
    path = tmp_path / "kl_rl.py"
    path.write_text(TINY_RL.read_text() + line + "\n")
    return path


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_the_kl_term_is_beta_times_the_mean_k3_against_the_reference(tmp_path, beta):
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), trainer={"kl_coef": beta})
    trainer, proximal = TrainerNode(), ProximalNode()
    trainer.setup(types.SimpleNamespace(config=config, resume_dir=None, version=0, node="actor", run_dir=tmp_path))
    proximal.setup(types.SimpleNamespace(config=config, pool=types.SimpleNamespace(name="actor")))
    prompt, outputs = torch.randint(4, 90, (6,)), [torch.randint(4, 90, (5,)) for _ in range(4)]
    batch = Batch({"prompt_ids": Ragged.from_rows([prompt] * 4), "output_ids": Ragged.from_rows(outputs),
                   "advantage": torch.zeros(4),  # no policy-gradient term: the loss is the KL term alone
                   "versions": Ragged.from_rows([torch.zeros(5, dtype=torch.int32)] * 4)})
    now = proximal(Batch({k: batch[k] for k in ("prompt_ids", "output_ids")}))["prox_logp"]
    ref = Ragged(now.values + torch.linspace(-0.5, 0.5, now.values.numel()), now.offsets)
    stats = trainer(Batch({**{k: batch[k] for k in batch}, "behav_logp": now, "prox_logp": now, "ref_logp": ref}))
    d = ref.values.double() - now.values.double()
    k3 = float((d.exp() - d - 1).mean())  # KL(π_θ ‖ π_ref) per token, float64
    assert stats["loss"] == pytest.approx(beta * k3, rel=1e-4, abs=1e-9)
    assert stats.get("kl_to_ref") == (pytest.approx(k3, rel=1e-4) if beta else None)


def test_a_run_with_a_kl_loss_reports_the_kl_growing_from_zero_as_the_policy_leaves_its_reference(tmp_path):
    recipe = recipe_with(tmp_path, 'g.add(compute_logprob("reference", frozen=True, output="ref_logp"))')
    model = make_checkpoint(tmp_path / "ckpt")
    build_controller(recipe, [f"model={model}", "trainer.kl_coef=0.1", "trainer.lr=0.01"], tmp_path / "run").run()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"kind": "step"' in line]
    kl = [step["kl_to_ref"] for step in steps]
    assert len(kl) == 4 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-4, kl


def test_a_kl_loss_without_a_frozen_reference_feeding_the_trainer_is_refused_naming_what_to_add(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.kl_coef=0.04: no node outputs `ref_logp` for .*ppo-update.*; add "
                                          r"compute_logprob\(\"reference\", frozen=True, output=\"ref_logp\"\)"):
        loaded = load_recipe(TINY_RL, ["trainer.kl_coef=0.04"])
        compile_plan(loaded.graph, loaded.config)
    itself = recipe_with(tmp_path, 'g.add(compute_logprob("shadow", output="ref_logp"))')
    with pytest.raises(ConfigError, match=r"reads `ref_logp` from .*'shadow'.*, which is no frozen reference"):
        loaded = load_recipe(itself, ["trainer.kl_coef=0.04"])
        compile_plan(loaded.graph, loaded.config)
    loaded = load_recipe(Path(__file__).parents[2] / "recipes" / "kl_rl.py", ["trainer.kl_coef=0.04"])
    assert ("actor", "ref_logp", "reference.ref_logp") in compile_plan(loaded.graph, loaded.config).bindings
