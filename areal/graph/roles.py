"""What a node must implement to play its part in a run: its role's Protocol.

A node's role says how the runtime drives it. Built-in kinds have theirs (`generate` is a
stream, `ppo-update` a trainer, the rest maps); a custom node declares one with
`@node(..., role=...)`, and validation checks, at the recipe line, that it has the methods its
role needs, so a mistake is never found by a `hasattr` deep in a worker loop.

- map: `__call__(batch) -> fields`, once per batch (a group of samples, or a held-out round).
- filter: a map that may drop samples: it returns `{DROPPED: {row: reason}}` among its fields.
  Dropped samples are counted `filtered` (not failed) and a group dropped whole frees its
  staleness slot, so the source admits another. Held-out rounds pass a filter untouched.
- stream: a generator-like node the worker steps (`submit`, `step`, `pending`) and hands new
  weights between steps (`load_weights`): interruptible generation. Its `version` is the policy
  version of the weights it samples with: the worker reads it to decide which admitted groups may start.
  A finished batch may hold a FAILED column, one reason (or None) per row: those samples are
  counted failed with the reason, never trained.
- trainer: `__call__(batch) -> stats` once per step of B groups; `empty_step()` for a step
  whose every sample failed or was filtered; `save_weights(path)` publishes the policy.
- episode: the researcher's agent, `async run(task, llm)` (an async function is its own `run`):
  one call per sample, awaiting `llm.generate(...)` as often as it likes with tools in between,
  returning the reward or a dict of outputs. The runtime drives it like a stream (its runner,
  nodes/episodes/worker.py, steps the policy's engine and the episodes' event loop between weight
  updates) and records one trajectory per episode: every token, a loss mask, behaviour
  log-probs and versions.

Any role may also have `setup(context)` (once per worker, before the first batch), and so may a
reward function (`reward(name, fn)` calls `fn.setup(context)` when it has one): `context` is a
`NodeContext`, below. A map node that names a trained model (`model=`) outside its trainer's pool
follows that model's weights and needs `load_weights(weights, version)` too: the tensors of that
version, however they travelled (runtime/weights/).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from areal.config import RunConfig
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta

ROLES = ("source", "map", "filter", "stream", "episode", "trainer")
KIND_ROLES = {"source": "source", "generate": "stream", "episode": "episode", "ppo-update": "trainer"}  # others map
SAMPLING_ROLES = ("stream", "episode")  # nodes that sample the policy: a pool of their own, stepped by the worker

# keys a node may return among its fields (row index -> reason, or name -> number)
FAILED = "__failed__"  # samples whose value could not be computed: counted failed, never trained
DROPPED = "__dropped__"  # a filter's drops: counted filtered
METRICS = "__metrics__"  # numbers about this batch, averaged into the step's metrics


@runtime_checkable
class NodeContext(Protocol):
    """What a node's `setup(context)` is given: this worker's view of the run.

    - `config`: the run's settings as this node sees them (its own keyword arguments applied on top);
    - `node`: the node's name; `worker_id`: `POOL[REPLICA]` (a pool runs one process per replica);
    - `run_dir`: the run directory (write your own files under it, one per worker: `run_dir / worker_id`);
    - `version`: the policy version the run is at (above 0 after `--resume`);
    - `resume_dir`: the checkpoint this run resumes from, or None;
    - `note(sample_ids, reasons)`: samples that train on but are counted (an over-long or empty generation);
    - `report(kind, **fields)`: an event for the controller (the runtime's own kinds: "metrics" with
      `values={name: number}` is averaged into the step's metrics, as METRICS returned by a call is).
    """

    config: RunConfig
    node: str
    replica: int
    version: int
    resume_dir: Path | None

    @property
    def run_dir(self) -> Path: ...
    @property
    def worker_id(self) -> str: ...
    def note(self, sample_ids: list[int], reasons: list[str]) -> None: ...
    def report(self, kind: str, **fields: Any) -> None: ...


@runtime_checkable
class SetUp(Protocol):
    """A node of any role that prepares itself once per worker, before its first batch (`context`: NodeContext)."""

    def setup(self, context: NodeContext) -> None: ...


@runtime_checkable
class Closes(Protocol):
    """A node that holds something to let go of when it is done (a judge's sandbox pool)."""

    def close(self) -> None: ...


@runtime_checkable
class ConfiguredSource(Protocol):
    """A task source that depends on the run's config (`code_tasks`): resolved once, where the run starts."""

    def configure(self, config: RunConfig) -> Any: ...


@runtime_checkable
class ResumableSource(Protocol):
    """A task source with a cursor: its state goes into each checkpoint, so a resumed run goes on from it."""

    def state(self) -> dict[str, Any]: ...


class MapNode(Protocol):
    def __call__(self, batch: Batch) -> Mapping[str, Any]: ...


class StreamNode(Protocol):
    version: int  # the policy version of the weights it samples with (a generator's: its engine's, the only count)

    def submit(self, batch: Batch, meta: GroupMeta) -> None: ...
    def step(self) -> list[tuple[Batch, GroupMeta]]: ...
    def pending(self) -> int: ...
    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None: ...


class Aborting(Protocol):
    """A stream node that can stop the groups holding a token older than a version (staleness_policy=drop):
    each one's meta, sample ids, and the tokens each sample had."""

    def abort_older_than(self, version: int) -> list[tuple[GroupMeta, list[int], list[int]]]: ...


class Recycling(Protocol):
    """A stream node that can re-queue the groups it stamped before a version, with their output
    (staleness_policy=recycle): each one's new meta and the output tokens its re-queued samples carry."""

    def recycle_stamped_before(self, version: int) -> list[tuple[GroupMeta, int]]: ...


class Follower(Protocol):
    """A node that holds a copy of a trained model: a stream node, or a map that follows a model."""

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None: ...


class GroupMember(Protocol):
    """A stream node in the weights group (transport.weights=broadcast): it takes part in each broadcast."""

    def receive_weights(self, version: int) -> None: ...


class LLM(Protocol):
    """What an episode holds of the policy: its own session, one trajectory (nodes/episodes/llm.py)."""

    sample_id: int
    base_url: str | None  # the OpenAI-compatible endpoint, when the node serves one
    api_key: str | None  # this episode's session key on it

    async def generate(self, text: str = "", *, max_new_tokens: int | None = None,
                       stop: list[str] | None = None) -> Any: ...
    async def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int | None = None,
                   stop: list[str] | None = None) -> Any: ...


class EpisodeNode(Protocol):
    async def run(self, task: Mapping[str, Any], llm: LLM) -> float | Mapping[str, Any] | None: ...


class TrainerNode(Protocol):
    version: int  # its model's policy version, the run's only counter of it: one more after each step
    def __call__(self, batch: Batch) -> Mapping[str, float]: ...
    def empty_step(self) -> None: ...
    def policy_weights(self) -> dict[str, Tensor]: ...  # the whole policy (FSDP: a collective on every rank)
    def save_weights(self, path: str | None) -> None: ...


@runtime_checkable
class Checkpointed(Protocol):
    """A trainer whose own state (optimizer, engine) goes into each checkpoint beside the policy."""

    def save_checkpoint(self, folder: str) -> None: ...


PROTOCOLS: dict[str, type] = {"map": MapNode, "filter": MapNode, "stream": StreamNode, "episode": EpisodeNode,
                              "trainer": TrainerNode}


def role_of(kind: str, declared: str | None) -> str:
    """The role of a node of `kind`, or the one it declared (a custom node)."""
    return declared or KIND_ROLES.get(kind, "map")


def missing_methods(role: str, target: Any, follows_weights: bool = False) -> list[str]:
    """The methods `target` (a class, or a function for map/filter) lacks for `role`."""
    protocol = PROTOCOLS.get(role)
    if protocol is None:
        return []
    needed = [name for name, member in vars(protocol).items()  # the methods the Protocol itself declares
              if inspect.isfunction(member) and member.__qualname__.startswith(f"{protocol.__name__}.")
              and (name == "__call__" or not name.startswith("__"))]
    if follows_weights and "load_weights" not in needed:
        needed.append("load_weights")
    if role == "episode":  # an async function is its own run; a class needs an async run
        run = target if inspect.isfunction(target) else getattr(target, "run", None)
        return [] if inspect.iscoroutinefunction(run) else ["async run(task, llm)"]
    if inspect.isfunction(target):  # a function node is its own __call__
        return [] if needed == ["__call__"] else [n for n in needed if n != "__call__"]
    return [name for name in needed if not callable(getattr(target, name, None))]


def call_problems(role: str, target: Any) -> list[str]:
    """How `target` (a custom node's class or function) could not be called as the runtime calls it, each a clause:
    an `async def` (an episode's run alone is awaited), a class that cannot be made without arguments, a `setup`
    that takes no context."""
    found = []
    if inspect.isclass(target):
        try:
            inspect.signature(target).bind()
        except TypeError:
            found.append(f"{target.__name__}{inspect.signature(target)} cannot be made without arguments, and each "
                         "worker makes its node with none; give them defaults, or read settings in setup(context)")
        except ValueError:  # a class whose signature Python cannot read: made as it is
            pass
    call = target if inspect.isfunction(target) else inspect.getattr_static(target, "__call__", None)
    if role != "episode" and inspect.iscoroutinefunction(call):
        found.append("is an async def, and a node is called as a plain function; make it a def (asyncio.run(...) "
                     "inside it for what it awaits)")
    setup = getattr(target, "setup", None) if inspect.isclass(target) else None
    if inspect.isfunction(setup):
        try:
            inspect.signature(setup).bind(None, None)  # (self, context)
        except TypeError:
            found.append(f"its setup{inspect.signature(setup)} cannot take the worker's context; define "
                         "setup(self, context)")
    return found
