"""bench_vs_trl pins areal through --set: those overrides must stay valid and mean what the TRL side runs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from areal.config import RunConfig
from areal.overrides import apply_overrides
from tests.benchmarks.loading import load_benchmark

load_benchmark("_one_evaluator")  # bench_vs_trl and _trl_side import it by name, as their folder's scripts do
bench = load_benchmark("bench_vs_trl")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_areal_overrides_validate_and_pin_the_shared_settings(mode: str) -> None:
    pinned = bench.FULL
    argv = bench.areal_overrides(pinned, mode, eta=2)
    assert argv[::2] == ["--set"] * (len(argv) // 2)
    config = apply_overrides(RunConfig(batch_size=3, group_size=5, steps=7, mode="async"), argv[1::2])
    assert (config.steps, config.batch_size, config.group_size) == (pinned.steps, pinned.batch_size, pinned.group_size)
    assert config.mode == mode and config.effective_staleness == (0 if mode == "sync" else 2)
    assert config.trainer.lr == pinned.lr and config.trainer.minibatches == 1
    assert config.eval.interval_steps == 0 and config.eval.tasks == 0  # the one evaluator scores afterwards
    assert config.checkpoint.interval_steps == pinned.save_interval and config.checkpoint.keep >= pinned.steps
    gen = config.generation
    assert (gen.max_new_tokens, gen.temperature, gen.top_p, gen.stop) == tuple(bench.GENERATION.values())
    assert config.max_minutes is None


def test_a_seed_finished_under_out_is_read_back_and_one_with_other_arms_is_refused(tmp_path: Path) -> None:
    import json
    from dataclasses import asdict

    rounds = [{"version": 0, "wall_s": 0.0, "pass@1": 0.2, "se": 0.01}]
    outcomes = [bench.Outcome(name, 96, 9.5, 200.0, [], rounds=rounds)
                for name in ("TRL 1.16.0", "areal sync", "areal async η=2")]
    path = tmp_path / "seed-1" / "outcomes.json"
    assert bench.finished(path, [2]) is None  # not run yet
    path.parent.mkdir()
    path.write_text(json.dumps([asdict(o) for o in outcomes]))
    assert bench.finished(path, [2]) == outcomes
    with pytest.raises(SystemExit, match=r"holds the arms \['areal sync', 'areal async η=2'\], this run asks for "
                                         r"\['areal sync', 'areal async η=1', 'areal async η=2'\]"):
        bench.finished(path, [1, 2])


def test_time_to_threshold_takes_the_first_round_in_time_order() -> None:
    rounds = [{"version": 20, "wall_s": 30.0, "pass@1": 0.4}, {"version": 10, "wall_s": 12.0, "pass@1": 0.3},
              {"version": 0, "wall_s": 1.0, "pass@1": 0.1}]
    assert bench.time_to(rounds, 0.3) == 12.0
    assert bench.time_to(rounds, 0.5) is None
    assert bench.final_pass(rounds) == 0.4
    assert bench.warm_pass(rounds) == 0.1
    assert bench.warm_pass(rounds[:2]) is None


def test_table_reports_ratios_against_trl_and_unreached_thresholds() -> None:
    rounds = [{"version": 0, "wall_s": 1.0, "pass@1": 0.1, "se": 0.01}, {"version": 4, "wall_s": 9.0, "pass@1": 0.2,
                                                                         "se": 0.01}]
    trl = bench.Outcome("TRL x", 64, 10.0, 500.0, [], peak_rss=2**30, peak_pss=2**29, rounds=rounds)
    areal = bench.Outcome("areal sync", 64, 25.0, 1000.0, [], peak_rss=2**31, peak_pss=2**29, rounds=rounds[:1])
    text = bench.table([trl, areal], threshold=0.15)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
            if line.startswith("| ") and "TRL x" not in line}
    assert rows["trained samples/s"] == ["10.0", "25.0", "2.50x"]
    assert rows["wall s to pass@1 >= 0.150"] == ["9.0", "not reached", "-"]
    assert rows["final held-out pass@1"] == ["0.200", "0.100", "0.50x"]
    assert rows["peak RSS, tree sum (MiB)"] == ["1024", "2048", "2.00x"]


def test_trl_side_cuts_completions_like_areal() -> None:
    """The TRL reward must see exactly the text areal's generate node hands its reward."""
    pytest.importorskip("trl")
    from areal.nodes.workers.generate import GenerateNode

    side = load_benchmark("_trl_side")
    stops = bench.GENERATION["stop"]
    areal_node = GenerateNode()
    areal_node.stops = stops
    areal_node._decode = lambda ids: "".join(map(chr, ids))
    rng = random.Random(0)
    texts = ["    return x + 1\n\n# next", "    return x\ndef g():\n#", "    return x\n", ""]
    texts += ["".join(rng.choice("ab \n#def(print)") for _ in range(rng.randint(0, 30))) for _ in range(300)]
    for text in texts:
        assert side.cut_at_stop(text, stops) == areal_node._completion([ord(c) for c in text]), text
    assert side.cut_at_stop("    return x + 1\n\n# next", stops) == "    return x + 1"
    assert side.strip_pads([5, 0, 7, 0, 0], pad_id=0) == [5, 0, 7]
    assert side.strip_pads([0, 0], pad_id=0) == []


def test_trl_generation_stops_at_stop_strings_and_trains_on_no_padding(tmp_path: Path) -> None:
    """TRL ends a completion at a stop string (as areal does) and keeps no <pad> after it."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig

    from areal.models.tiny import build_tiny_coder
    from areal.models.tokenizer import CharTokenizer

    side = load_benchmark("_trl_side")
    tokenizer = CharTokenizer()
    stops = ["a", "e", " "]  # frequent characters, so a random model hits them
    seen: list[tuple[str, list[int]]] = []

    def reward(prompts, completions, completion_ids, **_):
        seen.extend(zip(completions, completion_ids))
        return [float(len(c) % 2) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=8, num_generations=4,
                      beta=0.0, max_completion_length=24, generation_kwargs={"stop_strings": stops}, use_cpu=True,
                      report_to="none", save_strategy="no", disable_tqdm=True, shuffle_dataset=False)
    trainer = side.StopAwareGRPO(model=build_tiny_coder(0), reward_funcs=reward, args=args, processing_class=tokenizer,
                                 train_dataset=Dataset.from_dict({"prompt": ["# add 1\ndef f(x):\n"] * 2}))
    trainer.train()
    assert len(seen) == 8
    stopped = 0
    for text, ids in seen:
        assert not ids or ids[-1] != tokenizer.pad_token_id
        if ids and ids[-1] != tokenizer.eos_token_id and len(ids) < 24:
            assert any(text.endswith(s) for s in stops) and not any(s in text[:-1] for s in stops), text
            stopped += 1
    assert stopped > 0
    assert trainer.generated_tokens == sum(len(ids) for _, ids in seen)


def _rounds(start: float, end: float, se: float = 0.01) -> list[dict]:
    return [{"version": 0, "wall_s": 0.0, "pass@1": start, "se": se}, {"version": 2, "wall_s": 5.0, "pass@1": end,
                                                                       "se": se},
            {"version": 4, "wall_s": 9.0, "pass@1": end, "se": se}]


def test_the_summary_gives_each_sides_gain_over_seeds_and_its_difference_from_trls_paired_by_seed() -> None:
    by_seed = [[bench.Outcome(name, 64, rate, 1.0, [], rounds=_rounds(0.2, 0.2 + gain))
                for name, rate, gain in (("TRL x", 10.0, g_trl), ("areal sync", 20.0, g_areal))]
               for g_trl, g_areal in ((0.10, 0.12), (0.14, 0.12), (0.12, 0.15))]
    text = bench.summary(by_seed, margin=0.11)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
            if line.startswith("| ") and "trained samples/s" not in line}
    # gains 10, 14, 12 (mean 12, SE 2/sqrt(3) = 1.15) and 12, 12, 15 (mean 13, SE 1); differences 2, -2, 3
    assert rows["TRL x"][2].startswith("+12.0 ± 1.2") and rows["areal sync"][2].startswith("+13.0 ± 1.0")
    assert rows["areal sync"][3] == "+1.0 ± 1.5" and rows["TRL x"][3] == "-"
    assert rows["TRL x"][4] == "5 (2/3)"  # seeds 2 and 3 reached 0.31 at 5 s; seed 1 (0.30) never did
    assert bench.middle_pass(_rounds(0.2, 0.3)) == 0.3


def test_the_one_evaluator_scores_the_same_weights_the_same_for_a_seed() -> None:
    evaluator = load_benchmark("_one_evaluator")
    first = evaluator.heldout_pass(None, 2, 0, evaluator.GENERATION, limit=6)
    again = evaluator.heldout_pass(None, 2, 0, evaluator.GENERATION, limit=6)
    assert (first["tasks"], first["samples"]) == (6, 2) and 0 <= first["pass@1"] <= 1
    assert (first["pass@1"], first["reward_mean"]) == (again["pass@1"], again["reward_mean"])
