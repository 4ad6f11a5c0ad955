"""The step record: one metrics line per version of the counted trainer, and the warnings a step can raise.

It gathers what the trainer reported (rewards, stats, staleness), what the accounting knows, the
throughput since start (a resumed run counts only its own work), each worker's busy fraction,
and the METRICS numbers nodes returned since the last step (averaged).
"""

from __future__ import annotations

import logging
from typing import Any

from areal.runtime.wire import messages as msg

log = logging.getLogger("areal.controller")


class StepRecorder:
    def __init__(self, trained_before: int, group_size: int, several_trainers: bool,
                 solved: tuple[str, float] = ("", 1.0)) -> None:
        self.trained_before = trained_before
        self.group_size = group_size
        self.several_trainers = several_trainers
        self.solved_field, self.solved_at = solved  # ("score.reward", 1.0): a sample is solved from 1 on
        self.node_metrics: dict[str, list[float]] = {}
        self.said: dict[str, str] = {}  # the warnings said so far, by kind (each once a run; the summary lists them)

    def on_metrics(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.node_metrics.setdefault(name, []).append(value)

    def record(self, m: msg.VersionPublished, *, elapsed: float, versions: dict[str, int], trained: int,
               accounting: dict[str, int], generated_tokens: int, trained_tokens: int,
               busy: dict[str, float]) -> dict[str, Any]:
        node_metrics = {k: sum(v) / len(v) for k, v in self.node_metrics.items() if v}
        self.node_metrics.clear()
        rewards = m.rewards
        return {
            "kind": "step", "version": m.version, "wall_s": elapsed,
            **({"model": m.model, **{f"{t}_version": v for t, v in versions.items()}} if self.several_trainers
               else {}),
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "solved": sum(m.solved) / len(m.solved) if m.solved else None,
            "samples": len(m.sample_ids), "trained_samples": trained, "tokens": m.tokens,
            "samples_per_s": (trained - self.trained_before) / elapsed,
            "generated_tokens_per_s": generated_tokens / elapsed,
            "trained_tokens_per_s": trained_tokens / elapsed,
            "staleness": {str(k): v for k, v in sorted((int(k), v) for k, v in m.staleness.items())},
            "busy": {worker: round(value, 3) for worker, value in busy.items()},
            **accounting,
            **node_metrics,
            **{k: v for k, v in m.stats.items() if isinstance(v, (int, float))},
        }

    def warnings(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Metrics lines for what a step or a held-out round says is wrong, each said once a run (logged too)."""
        version, found = record["version"], []
        rule, top = f"{self.solved_field} ≥ {self.solved_at:g}", record.get("reward_max") or 0
        if record.get("kind") == "eval" and record["pass@1"] == 0 and top > 0:
            found.append(("none_solved", f"no sample of the held-out round at version {version} counted as solved "
                          f"({rule}), though its rewards reached {top:.3g}: held-out pass@1 reads 0. If another "
                          "output says a sample is solved (a reward before it was combined with others), name it "
                          "with eval.solved=NODE.PORT, or set eval.solved_at"))
        if record.get("kind") == "eval" and self.solved_at > 0 and top >= 2 * self.solved_at:
            found.append(("above_solved", f"the held-out round at version {version} has rewards up to {top:.3g}, "
                          f"several times the {self.solved_at:g} from which a sample counts as solved ({rule}): "
                          "if the reward's scale is not 0 to 1, set eval.solved_at to the score that means solved, "
                          "or held-out pass@1 counts every sample at or above it"))
        if record.get("zero_advantage") == 1.0:
            why = ("group_size=1: a group-relative advantage is 0 for a group of one sample; sample more per prompt"
                   if self.group_size == 1 else "every group's samples had equal rewards: all solved or all failed?")
            found.append(("zero_advantage", f"every advantage of step {version} is 0: the update cannot move the "
                          f"policy ({why})"))
        if record.get("empty_share") == 1.0:
            found.append(("empty", f"every sample step {version} trained had an empty completion: the model wrote "
                          "nothing before a stop string or its end token. Check generation.stop (or the generate "
                          "node's stop) against what the model writes for these prompts"))
        if record.get("over_long_share") == 1.0:
            found.append(("over_long", f"every sample step {version} trained was cut at generation.max_new_tokens: "
                          "raise it, or leave cut completions out of the loss (trainer.truncated=mask)"))
        lines = []
        for kind, warning in found:
            if kind not in self.said:
                self.said[kind] = warning
                log.warning("%s", warning)
                lines.append({"kind": "warning", "version": version, "warning": warning, "wall_s": record["wall_s"]})
        return lines
