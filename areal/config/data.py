"""What a run reads and keeps: tasks (data), held-out rounds (eval), records, checkpoints and injected faults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from areal.config.section import Section


class DataConfig(Section):
    path: str | None = Field(None, description="a JSONL or .parquet file of training tasks, or builtin:NAME "
                             "(builtin:chains: code answers with a heavy tail of lengths); None uses the recipe's "
                             "built-in tasks")
    heldout_path: str | None = Field(None, description="a JSONL or .parquet file of held-out tasks for pass@1, or "
                                     "builtin:NAME; None: the test split of data.path's built-in set, or of the "
                                     "recipe's built-in tasks without data.path; none for a data.path file (no "
                                     "held-out rounds)")
    seed: int = Field(0, description="task order (shuffling) seed")


class EvalConfig(Section):
    interval_steps: NonNegativeInt = Field(20, description="held-out pass@1 every N steps; 0 = only at start/end")
    # tasks x samples stays under the controller's 1e6 held-out sample ids a round
    tasks: int = Field(256, ge=0, le=10_000, description="held-out tasks scored per evaluation (the first N); "
                       "0: no held-out evaluation (interval_steps=0 still evaluates at the start and the end)")
    samples: int = Field(2, ge=1, le=64, description="samples per held-out task; pass@1 is their mean")
    reward: str | None = Field(None, description="'node.port' of the reward the run reports (step metrics); "
                               "default: the only port named 'reward'")
    solved: str | None = Field(None, description="'node.port' that says a sample is solved (held-out pass@1, the "
                               "step's `solved`): solved when it is at least solved_at; default: the reward")
    solved_at: float = Field(1.0, description="the value of eval.solved from which a sample counts as solved")


class RecordsConfig(Section):
    """What each worker records where it happens: every sample's story (runtime/records/sample_log.py; read by `areal
    samples`) and the spans of its work (runtime/records/spans.py; read by `areal trace` and `areal view`)."""

    samples: bool = Field(True, description="write samples/WORKER.jsonl: each node's declared outputs per sample, "
                          "its prompt, what was trained at which step and lag, what failed or was filtered and why")
    max_mb: PositiveFloat = Field(64.0, description="the most one worker writes (MB); past it the file says it was "
                                  "cut and stops growing")
    max_chars: PositiveInt = Field(2000, description="a text value (a prompt, a completion) longer than this is cut")
    spans: bool = Field(True, description="write spans/WORKER.jsonl: each worker's timed work (decode steps, node "
                        "calls, weight loads, sends, train steps and the waits before them), for `areal trace` and "
                        "`areal view`")
    spans_max_mb: PositiveFloat = Field(16.0, description="the most one worker's span files hold (MB): the file is "
                                        "rotated at half of it and the older half dropped, so the newest spans stay")
    trackers: list[Literal["tensorboard", "wandb"]] = Field(
        [], description="experiment trackers that get each step's and held-out round's numbers at its version, "
        "beside metrics.jsonl (pip install -c constraints.txt -e '.[track]'): tensorboard (tensorboard/ in the run "
        "directory), wandb (a W&B run named after the run directory, continued on resume; WANDB_MODE, "
        "WANDB_ENTITY as W&B reads them)")
    wandb_project: str | None = Field(None, min_length=1, description="the W&B project of records.trackers=wandb; "
                                      "None: $WANDB_PROJECT, else areal")

    @field_validator("trackers", mode="before")
    @classmethod
    def _names_as_typed(cls, value: object) -> object:
        """`--set records.trackers=wandb` or `=tensorboard,wandb` (or `[tensorboard,wandb]`) as the list it means."""
        if isinstance(value, str):
            return [name.strip() for name in value.strip("[] ").split(",") if name.strip()]
        return value


class CheckpointConfig(Section):
    interval_steps: NonNegativeInt = Field(10, description="checkpoint every N steps; 0 = only at exit")
    keep: PositiveInt = 2


class FaultConfig(Section):
    policy: Literal["restart", "fail-fast"] = Field(
        "restart", description="what a dead worker gets: restart and re-issue its work, or stop the run")
    nodes: dict[str, Literal["restart", "fail-fast"]] = Field(default_factory=dict, description="per-node policy")
    node_errors: Literal["stop", "restart"] = Field(
        "stop", description="a Python exception in a node's own code: stop the run at once with the recipe line and "
        "the node's frames (the same input would raise it again), or restart the worker like a dead one (for errors "
        "known to be transient, such as a service that timed out)")
    max_restarts: NonNegativeInt = Field(3, description="restarts of one node within window_s before the run stops")
    window_s: PositiveFloat = 300.0
    heartbeat_s: PositiveFloat = Field(1.0, description="worker heartbeat interval")
    dead_after_s: PositiveFloat = Field(10.0, description="a worker silent this long is declared dead")
    ready_timeout_s: PositiveFloat = Field(
        600.0, description="how long a worker may take to start (imports, loading its model, a warm-up) before the run "
        "stops: raise it for a model that loads slowly")
    long_call_s: PositiveFloat = Field(
        300.0, description="a node call longer than this and than 10x its kind's longest so far is said (the node, "
        "its seconds, where its code is) until it returns: a reward stuck on a dead service, a deadlock")

    @model_validator(mode="after")
    def _dead_after_outlasts_heartbeats(self) -> FaultConfig:
        if self.dead_after_s <= 2 * self.heartbeat_s:
            raise ValueError(f"dead_after_s={self.dead_after_s} must be more than twice heartbeat_s="
                             f"{self.heartbeat_s}: a healthy worker is heard from only every heartbeat_s, so it "
                             "would be declared dead")
        return self
