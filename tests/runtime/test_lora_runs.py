"""Real runs of a LoRA policy and the mismatch alarm: a LoRA trainer publishes its adapters alone over every
transport and its generators sample exactly the policy it scores (every token at lag 0 within the tolerance, so a
clean run never trips the alarm, with or without LoRA); a generator that skips one weight update stops the run at
the step that trains its tokens, naming it, the version and the gap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal.cli.run import build_controller
from areal.engines.lora import adapter_file
from areal.errors import RunError
from areal.runtime.worker.mismatch import DEFAULT_TOLERANCE
from tests.local_model import make_checkpoint

HERE = Path(__file__).parent
TINY_RL = HERE / "tiny_rl.py"  # mode=sync: every token is trained at the version that sampled it (lag 0)
SKIP_UPDATE_RL = HERE / "skip_update_rl.py"  # the same, with a generator that skips the update of version 2


def _run(tmp_path: Path, recipe: Path, *overrides: str):
    model = make_checkpoint(tmp_path / "model")
    controller = build_controller(recipe, [f"model={model}", *overrides], tmp_path / "run")
    return controller, controller.run()


def _steps(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "step"]


def _clean(tmp_path: Path, *overrides: str) -> list[dict]:
    _, state = _run(tmp_path, TINY_RL, *overrides)
    steps = _steps(tmp_path)
    assert state.version == 4 and len(steps) == 4
    # every step compared every token it trained (sync: all at lag 0), and none was off by more than the numerics
    assert all(s["lag0_tokens"] == s["tokens"] > 0 and s["lag0_over"] == 0 for s in steps)
    assert max(s["lag0_gap_max"] for s in steps) < DEFAULT_TOLERANCE["float32"] / 10
    return steps


def test_a_lora_run_publishes_its_adapter_alone_and_its_generator_samples_what_the_trainer_scores(tmp_path):
    _clean(tmp_path, "trainer.lora.rank=4")
    published = sorted((tmp_path / "run" / "weights" / "actor").glob("v*.safetensors"))
    assert published and all(adapter_file(p) is not None for p in published)
    full = (tmp_path / "model" / "model.safetensors").stat().st_size
    assert all(p.stat().st_size < full / 2 for p in published)
    checkpoint = max((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert adapter_file(checkpoint / "policy-actor.safetensors") is not None
    assert (checkpoint / "trainer-actor" / "lora_base.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["files", "shm", "broadcast", "tcp"])
@pytest.mark.parametrize("lora", [0, 4])
def test_a_clean_run_never_trips_the_alarm_on_any_transport_with_or_without_lora(tmp_path, transport, lora):
    _clean(tmp_path, f"transport.weights={transport}", f"trainer.lora.rank={lora}")


@pytest.mark.parametrize("lora", [0, 4])
def test_a_generator_that_skips_one_weight_update_is_caught_at_the_step_that_trains_its_tokens(tmp_path, lora,
                                                                                              monkeypatch):
    from areal.nodes.workers.generate import GenerateNode

    # the recipe patches GenerateNode where it is loaded, this process too: put the class back after the test
    monkeypatch.setattr(GenerateNode, "load_weights", GenerateNode.load_weights)
    with pytest.raises(RunError, match=r"generator rollout\[0\] is not sampling version 2: \d+ of its \d+ tokens "
                                       r"stamped version 2 .* by up to [0-9.e-]+ nats"):
        # a LoRA adapter's first steps move the policy little (B starts at 0): at the full model's lr, version 2 is
        # only ~3e-4 nats from version 1, under the float32 tolerance; at a LoRA's usual 10x lr it is ~4e-3
        _run(tmp_path, SKIP_UPDATE_RL, f"trainer.lora.rank={lora}", f"trainer.lr={1e-2 if lora else 1e-3}")
    steps = _steps(tmp_path)
    assert [s["version"] for s in steps] == [1, 2]  # versions 0 and 1 trained clean; version 2's step stopped it
    assert all(s["lag0_over"] == 0 for s in steps)


def test_a_frozen_reference_of_a_lora_policy_runs_inside_its_trainer_with_what_reads_it():
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan

    recipe = HERE.parents[1] / "recipes" / "kl_rl.py"
    pools = {}
    for sets in ([], ["trainer.lora.rank=8"]):
        loaded = load_recipe(recipe, sets)
        pools[bool(sets)] = {p.name: p.nodes for p in compile_plan(loaded.graph, loaded.config).pools}
    assert pools[False]["reference"] == ("reference",)  # a second model, in a pool of its own
    assert pools[True]["actor"] == ("reference", "kl_advantage", "proximal", "actor") and "reference" not in pools[True]
