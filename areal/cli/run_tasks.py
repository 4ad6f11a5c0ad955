"""`areal eval -b code-tasks | math-tasks`: held-out tasks scored as a run's reward scores them.

MODEL a run directory: the tasks its held-out rounds scored (its config's held-out set, the first `eval.tasks`),
its stop strings and length; `--task` (builtin:NAME or a JSONL file) and `--max-new-tokens` override them. Else
the schema's built-in held-out set, or the one `--task` names, with its own stop strings (a file's: none) and the
generation default length. A run trained on one schema is refused under the other's benchmark, naming the right
one: the code tasks were silently scored for a math run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from areal.errors import ArealError, ConfigError

if TYPE_CHECKING:
    from areal.config import GenerationConfig

SCHEMAS: dict[str, Literal["code", "math"]] = {"code-tasks": "code", "math-tasks": "math"}
MAX_TASKS = 10_000  # without --limit: every held-out task (one pass of the set)
# the field a task source of each schema sends and the other's does not: how a run's plan tells which it trained on
TELLING_FIELD = {"code": "tests", "math": "answer"}


@dataclass(frozen=True)
class HeldOutTasks:
    judge: Any  # a reward function, called as the run's reward node calls it
    tasks: list[dict[str, Any]]
    generation: GenerationConfig  # the run's (else the defaults): its length and stops, tasks_stop these tasks' own
    named: str  # the set, as data.heldout_path would name it (builtin:NAME or a file)


def run_tasks(model: str, benchmark: str, task: str | None, limit: int | None, timeout_s: float) -> HeldOutTasks:
    """What `benchmark` scores MODEL on, and with what; `task` and `limit` as `--task` and `--limit` give them."""
    from areal.cli.export import is_run_dir
    from areal.config import RunConfig
    from areal.data.sources import ConfiguredTasks
    from areal.graph.settings import task_stops
    from areal.overrides import validate_config
    from areal.runtime.records.evaluation import first_pass

    schema = SCHEMAS[benchmark]
    path = Path(model).expanduser()
    run = path.is_dir() and is_run_dir(path)
    if run and not task:
        _check_trained_schema(path, schema)
    config = validate_config(json.loads((path / "config.json").read_text())) if run else RunConfig()
    declared = _declared_heldout(path) if run and not task else None
    if declared is not None:  # the recipe's own held-out tasks (a file, a list): what the run's rounds scored
        tasks = first_pass(declared, limit or config.eval.tasks)
        named = str(getattr(declared, "path", "")) or f"the recipe's {len(tasks)} held-out tasks"
        return HeldOutTasks(_judge(schema, timeout_s), tasks, config.generation, named)
    if task:
        config = config.model_copy(update={"data": config.data.model_copy(update={"heldout_path": task})})
    heldout = ConfiguredTasks(schema, "test")
    _, named = heldout.named(config)
    if named is None:
        raise ConfigError(f"{model}: the run trained on {config.data.path} and named no data.heldout_path, so it has "
                          "no held-out tasks; name some with --task FILE (or --task builtin:NAME)")
    source = heldout.configure(config)  # a bad name or file is refused here, naming it
    rounds_read = config.eval.tasks if run and not task else 0  # a run's rounds scored its first eval.tasks
    tasks = first_pass(source, limit or rounds_read or MAX_TASKS)
    generation = config.generation.model_copy(update={"tasks_stop": list(task_stops(source, config))})
    return HeldOutTasks(_judge(schema, timeout_s), tasks, generation, named)


def _declared_heldout(run_dir: Path) -> Any:
    """The held-out source the run's recipe declared (`heldout=`), when it is its own: not a configured one
    (`code_tasks("test")`), which the run's config resolves; None when there is none. The recipe is read where the
    run found it (its modules beside it), else the run's copy of it."""
    from areal.graph.recipe import load_recipe
    from areal.graph.roles import ConfiguredSource
    from areal.runtime.storage.resume import RECIPE_COPY

    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else {}
    recipe = next((p for p in (Path(plan.get("recipe", "")), run_dir / RECIPE_COPY) if p.suffix and p.is_file()), None)
    if recipe is None:
        return None
    try:
        heldout = load_recipe(recipe, plan.get("overrides", [])).graph.heldout
    except ArealError as err:
        raise ConfigError(f"{run_dir}: its recipe {recipe} does not load ({err}); name the tasks with --task") from None
    source = next(iter(heldout.values()), None)
    return None if source is None or isinstance(source, ConfiguredSource) else source


def _judge(schema: str, timeout_s: float) -> Any:
    """The code reward in the sandbox (checked before any generation), or the math reward as recipes/math_rl.py
    uses it (refusing answers that restate the prompt)."""
    if schema == "math":
        from areal.rewards.math.answer import MathReward

        return MathReward(timeout_s=timeout_s, use_prompt=True)
    from areal.rewards.code_reward import CodeTests

    judge = CodeTests(timeout_s=timeout_s)
    judge.preflight()
    return judge


def _trained_fields(run_dir: Path) -> set[str]:
    """The fields the run's task sources sent, by their names (none for a run directory without its plan)."""
    plan_path = run_dir / "plan.json"
    if not plan_path.is_file():
        return set()
    plan = json.loads(plan_path.read_text())
    sources = {node for pool in plan["pools"] if pool["role"] == "source" for node in pool["nodes"]}
    return {field.rpartition(".")[2] for c in plan["channels"] if c["src"] in sources for field in c["fields"]}


def _check_trained_schema(run_dir: Path, schema: str) -> None:
    """Refuse a run whose task source sent the other schema's telling field (a graph of its own, or a run directory
    without its plan, is not judged)."""
    sent = _trained_fields(run_dir)
    trained = [s for s, field in TELLING_FIELD.items() if field in sent]
    if len(trained) == 1 and trained[0] != schema:
        right = next(b for b, s in SCHEMAS.items() if s == trained[0])
        raise ConfigError(f"{run_dir} trained on {trained[0]} tasks (its source sends "
                          f"'{TELLING_FIELD[trained[0]]}'): score it with -b {right}, or name a {schema} set with "
                          f"--task builtin:NAME or a JSONL file")


def default_benchmark(model: str) -> str:
    """What `areal eval` scores when no --benchmark is given: HumanEval, except for a run directory that trained on
    answers rather than programs, which is refused naming the benchmarks of its tasks: HumanEval scored every math
    run 0.000 on syntax errors, silently."""
    from areal.cli.export import is_run_dir

    path = Path(model).expanduser()
    sent = _trained_fields(path) if path.is_dir() and is_run_dir(path) else set()
    if "tests" in sent or not sent & {"answer", "rg"}:
        return "humaneval"
    kind, right, field = (("reasoning-gym", "-b reasoning-gym --task NAME", "rg") if "rg" in sent
                          else ("math", "-b math-tasks", "answer"))
    raise ConfigError(f"{model} trained on {kind} tasks (its source sends '{field}', not 'tests'), and the default "
                      f"benchmark, HumanEval, scores code: score it with {right} (its held-out tasks), or give "
                      "-b humaneval to score its code anyway")
