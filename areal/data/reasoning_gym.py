"""reasoning-gym's procedural tasks as a task source (reasoning-gym: Apache-2.0, `pip install 'areal[eval]'`).

reasoning-gym generates each task from (dataset name, options, seed, index), so a task need not
travel with its metadata: it carries a small reference `rg = {name, options, seed, size, index}`
and the reward (`areal/rewards/reasoning_gym.py`) rebuilds the same entry to call the dataset's own
`score_answer`. Nothing is downloaded; every question is generated here.

Splits: one generated set is split 80/20 by a hash of each question's text (as the built-in tasks
split by id), so a question never sits on both sides, even where a small task space repeats it;
a repeated question is kept once. `split=None` keeps every distinct generated task (what `areal
eval` scores).
"""

from __future__ import annotations

from typing import Any

from areal.data.builtin import SPLITS, BuiltinTaskSource, split_of
from areal.errors import ConfigError

INSTALL = "pip install 'areal[eval]'"
# after each question. A 135 M model given reasoning-gym's own convention (TAGS) answered in prose
# and never used the tags (0 of 32 chain_sum answers); asked for the answer alone it gave a bare
# number far more often. The reward reads the last <answer> tag when there is one, else falls back.
INSTRUCTION = "\nGive only the final answer."
TAGS = "\nPut your final answer inside <answer></answer> tags."


class ReasoningGymTasks(BuiltinTaskSource):
    """reasoning-gym tasks as {task_id, prompt, answer, rg}, replayable like the built-in sets."""

    fields = ("task_id", "prompt", "answer", "rg")


def reasoning_gym_tasks(
    name: str,
    split: str | None = "train",
    *,
    size: int = 2000,
    seed: int = 0,
    instruction: str = INSTRUCTION,
    options: dict[str, Any] | None = None,
) -> ReasoningGymTasks:
    """Distinct tasks of reasoning-gym dataset `name` generated from `seed` (`size` before the split).

    `options` are the dataset's own config fields (e.g. chain_sum's `max_terms`); `instruction`
    follows each question.
    """
    options = dict(options or {})
    if split is not None and split not in SPLITS:
        raise ConfigError(f"reasoning_gym_tasks: unknown split {split!r}; use one of {', '.join(SPLITS)}, or None")
    dataset = create_dataset(name, size, seed, options)
    tasks, seen = [], set()
    for index in range(size):
        entry = dataset[index]
        if entry["question"] in seen or (split is not None and split_of(entry["question"]) != split):
            continue
        seen.add(entry["question"])
        ref = {"name": name, "options": options, "seed": seed, "size": size, "index": index}
        tasks.append({"task_id": f"{name}/{seed}/{index}", "prompt": entry["question"] + instruction,
                      "answer": str(entry["answer"]), "rg": ref})
    if not tasks:
        raise ConfigError(f"reasoning_gym_tasks({name!r}): no task in split {split!r} of {size}; raise size")
    return ReasoningGymTasks(tuple(tasks), split or "all", seed)


def create_dataset(name: str, size: int, seed: int, options: dict[str, Any]) -> Any:
    """reasoning-gym's dataset object; an unknown name or option is a ConfigError that lists the choices."""
    try:
        import reasoning_gym  # type: ignore[import-untyped]
        from reasoning_gym.factory import DATASETS  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(f"reasoning-gym tasks need the 'reasoning-gym' package ({INSTALL})") from None
    if name not in DATASETS:
        close = [n for n in sorted(DATASETS) if n.startswith(name[:3])] or sorted(DATASETS)[:8]
        listing = "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'"
        raise ConfigError(f"reasoning-gym has no task {name!r} (like it: {', '.join(close)}; "
                          f"all {len(DATASETS)}: {listing})")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"reasoning-gym task {name!r}: size must be an integer >= 1, got {size!r}")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **options)
    except (TypeError, ValueError, AssertionError) as exc:  # how its config dataclasses refuse a field or value
        fields = ", ".join(f for f in DATASETS[name][1].__dataclass_fields__ if f not in ("size", "seed"))
        raise ConfigError(f"reasoning-gym task {name!r} refuses options {options}: {exc} "
                          f"(its options: {fields})") from None
