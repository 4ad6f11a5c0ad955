"""The GPU suite's dry run: every section of benchmarks/gpu on the CPU at tiny shapes, through the same processes,
code paths and tables a lent GPU runs, so the suite cannot rot between the rare sessions that have a GPU."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.gpu.suite import SECTIONS, run_suite
from benchmarks.gpu.tables import render

# the recipe section runs the default recipe twice (sync, async) in processes of its own, as other tests do:
# it is left to the slow run, the other sections run here
WITHOUT_RECIPE = tuple(s.key for s in SECTIONS if s.key != "recipe")


@pytest.mark.timeout(900)  # about 50 s on 2 idle cores: each section's process imports torch; more under load
def test_every_section_runs_on_the_cpu_and_its_tables_say_what_was_measured(tmp_path):
    results = run_suite(tmp_path, device="cpu", tiny=True, budget_s=900, only=WITHOUT_RECIPE)
    assert {k: r.get("error") for k, r in results.items()} == {key: None for key in WITHOUT_RECIPE}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "suite.log", "tables.md"]  # ≤ 8 files
    assert json.loads((tmp_path / "results.json").read_text()) == results
    tables = (tmp_path / "tables.md").read_text()
    assert tables == render(results)

    generation = results["generation"]["rows"]
    assert {r["tokens"] for k, r in generation.items() if k.startswith("tails")} == {
        round(results["generation"]["lengths"]["mean"] * results["generation"]["sizes"]["requests"])}
    training = {results[k]["engine"]: results[k]["rows"] for k in ("training torch", "training fsdp")}
    assert set(training) == {"torch", "fsdp"} and all(r["tokens_per_s"] > 0 for e in training.values()
                                                       for r in e.values())
    assert all(r["mfu_datasheet"] is None for e in training.values() for r in e.values())  # no peak on a CPU
    shared, plain = results["training groups"]["rows"].values()
    assert shared["positions"] < plain["positions"] == 4 * 24  # the group's prompt once a row, in the rows run
    assert shared["tokens_per_s"] > 0 and plain["tokens_per_s"] > 0
    weights = results["weights"]["rows"]
    assert set(weights) == {"files", "broadcast-gloo"}  # NCCL is tried only on a GPU
    assert all(r["latency_s"] > 0 and r["gb_per_s"] > 0 for r in weights.values())
    api = results["vllm api"]  # vLLM is checked where it is installed; the project's environment has none
    assert api["vllm"] is None and "not installed" in api["skipped"] and "## vLLM's API: vLLM is not" in tables



@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_recipe_section_runs_both_modes_and_its_table_shows_their_ratio(tmp_path):
    results = run_suite(tmp_path, device="cpu", tiny=True, budget_s=600, only=("recipe",))
    recipe = results["recipe"]
    assert recipe.get("error") is None
    assert recipe["recipe"] == "code_rl.py" and "generation.device=cpu" in recipe["overrides"]
    assert [r["trained"] for r in recipe["rows"].values()] == [8, 8]  # 2 steps × 2 groups × 2 samples, each mode
    shown = re.search(r"\| async η=2 \| [\d.]+ \| ([\d.]+)x \|", (tmp_path / "tables.md").read_text())
    assert shown and float(shown.group(1)) == pytest.approx(recipe["async_vs_sync"], abs=0.006)


def test_a_section_that_fails_is_a_line_saying_why_and_the_others_still_print():
    tables = render({"generation": {"error": "ran past its 70 s", "wall_s": 70.0},
                     "weights": {"model": {"shape": "tiny", "params": 10}, "dtype": "float32", "bytes": 4e9,
                                 "tensors": 3, "rounds": 2, "wall_s": 5.0,
                                 "rows": {"files": {"latency_s": 2.0, "gb_per_s": 2.0, "trainer_blocked_s": 1.0,
                                                    "trainer_peak_gib": None}}}})
    assert "**generation**: ran past its 70 s" in tables
    assert "| files | 2 | 2 | 1 | — |  |" in tables and "4.00 GB, best of 2" in tables


def test_an_unknown_section_is_refused_naming_the_sections(tmp_path):
    with pytest.raises(SystemExit, match="no section recipes; sections: training torch, generation, recipe"):
        run_suite(tmp_path, device="cpu", tiny=True, budget_s=10, only=("recipes",))


def test_a_spare_section_runs_on_what_the_others_leave_and_never_shrinks_their_share(tmp_path, monkeypatch):
    """On a GPU each section is capped at its share of the budget; a spare one is left out of the shares and gets
    what the others did not use, up to its own limit."""
    from benchmarks.gpu import suite

    caps: dict[str, float] = {}

    def fake_run(section, device, tiny, timeout_s, folder, log):
        caps[section.key] = timeout_s
        return {"error": "not measured here", "wall_s": 0.0}

    monkeypatch.setattr(suite, "run_section", fake_run)
    sections = (suite.Section("a", "m", "", 100), suite.Section("b", "m", "", 300),
                suite.Section("extra", "m", "", 60, spare=True))
    monkeypatch.setattr(suite, "SECTIONS", sections)
    run_suite(tmp_path, device="cuda", tiny=False, budget_s=200)
    assert caps["a"] == pytest.approx(50) and caps["b"] == pytest.approx(150)  # 200 s over 400 s of limits
    assert 59 < caps["extra"] <= 60  # the others returned at once: its own limit
