"""What runs inside an episode worker: many episodes at once, as coroutines, over one policy engine.

The worker drives this runner like a generator (submit, step, pending, new weights between steps);
inside, one asyncio event loop holds every episode in flight. A step lets the episodes run until
each is waiting (on the policy, a tool in a thread, an HTTP client), runs one decode step of the
engine for every turn in flight together (continuous batching), and hands the finished turns back
to their episodes. New weights land between steps, so a turn in flight continues on them (its
tokens after the update carry the new version) and a turn that starts later reads its whole
context with them. With nothing to decode, a step waits on the loop until an episode asks for
tokens or ends, for at most IDLE_WAIT_S, so the worker keeps answering the controller.

Each sample is one episode (group g's sample k has id g·G + k, held-out ones their group's id);
a group goes on when all G of its episodes have ended. An episode that raises, runs past its
time, returns no reward or samples nothing is marked failed with the reason (counted, never
trained); the others of its group go on. With `endpoint=True` an OpenAI-compatible endpoint
(nodes/episodes/openai_server.py) runs on the same loop, in this process, in front of the same engine:
each episode's `llm` carries its `base_url` and its own `api_key`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from areal.errors import raised_at
from areal.graph.batch import Batch, Ragged
from areal.graph.meta import GroupMeta
from areal.graph.ports import PortType
from areal.graph.roles import FAILED
from areal.nodes.episodes.llm import EpisodeLLM
from areal.nodes.episodes.trajectory import Trajectory

IDLE_WAIT_S = 0.05  # longest a step waits on the loop when nothing decodes
TRAJECTORY_FIELDS = ("prompt_ids", "output_ids", "loss_mask", "behav_logp", "versions")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "bool": torch.bool}


class BadReturn(ValueError):
    """What an episode returned is not a reward and its declared outputs."""


@dataclass
class Ended:
    """How one episode ended: its trajectory, and its outputs or why it failed."""

    trajectory: Trajectory
    outputs: dict[str, Any] = field(default_factory=dict)  # reward and the episode's declared outputs
    failure: str | None = None


@dataclass
class _Group:
    batch: Batch
    meta: GroupMeta
    sample_ids: list[list[int]]  # per row, its samples' ids
    ended: dict[int, Ended] = field(default_factory=dict)

    @property
    def expected(self) -> int:
        return sum(len(ids) for ids in self.sample_ids)


class EngineSampler:
    """The stepped engine as awaitables: a turn submits its request and awaits the step that finishes it."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, on_submit: Any) -> None:
        self.engine, self.loop, self.on_submit = engine, loop, on_submit
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.requests = 0

    async def sample(self, request_id: int, context: list[int], max_new_tokens: int, stop: list[str] | None) -> Any:
        from areal.engines.generation import GenRequest

        future = self.loop.create_future()
        self.engine.submit([GenRequest(request_id, context, max_new_tokens, stop)])
        self._waiting[request_id] = future
        self.requests += 1
        self.on_submit()
        return await future  # cancelled (the episode ended meanwhile): its result is dropped when it comes

    def version(self) -> int:
        return int(self.engine.version)

    def step(self) -> None:
        for result in self.engine.step():
            future = self._waiting.pop(result.request_id, None)
            if future is not None and not future.done():
                future.set_result(result)


class EpisodeRunner:
    def __init__(self, run: Any, outputs: Mapping[str, PortType], *, model: str | None = None,
                 endpoint: bool = False, timeout_s: float | None = None) -> None:
        self.target, self.declared = run, dict(outputs)
        self.model_name, self.serve, self.timeout_s = model, endpoint, timeout_s
        self._groups: list[_Group] = []
        self.server: Any = None

    # -- set up once per worker ------------------------------------------------------------------

    def setup(self, context: Any) -> None:
        from areal.nodes.workers.policy_copy import PolicyCopy

        self.report = context.report
        self.policy = PolicyCopy(context)
        gen = context.config.generation
        self.max_new_tokens = gen.max_new_tokens
        self.loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self.sampler = EngineSampler(self.policy.engine, self.loop, self._wake.set)
        agent = self.target() if inspect.isclass(self.target) else self.target
        if hasattr(agent, "setup") and inspect.isclass(self.target):
            agent.setup(context)
        self._run = agent if inspect.isfunction(agent) else agent.run
        self.sessions: dict[str, EpisodeLLM] = {}  # api key -> the episode it belongs to
        if self.serve:
            from areal.nodes.episodes.openai_server import Endpoint

            self.server = Endpoint(self.sessions, self.policy.model_name, context.config.endpoint,
                                   temperature=gen.temperature, top_p=gen.top_p, replica=context.replica)
            self.loop.run_until_complete(self.server.start())

    # -- the stream Protocol -----------------------------------------------------------------------

    def pending(self) -> int:
        return len(self._groups)

    @property
    def version(self) -> int:
        """The policy version of the weights its episodes sample with: the engine's, the only count of it here."""
        return self.sampler.version()

    @version.setter
    def version(self, version: int) -> None:
        self.sampler.engine.version = version  # the weights it holds already, named (v0, or taken in a collective)

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> None:
        self.policy.load_weights(weights, version)

    def receive_weights(self, version: int) -> None:
        self.policy.receive_weights(version)

    def abort_older_than(self, version: int) -> list[tuple[GroupMeta, list[int], list[int]]]:
        """Episodes are not stopped mid-way: a late one finishes and the trainer drops it (staleness_policy=drop)."""
        return []

    def recycle_stamped_before(self, version: int) -> list[tuple[GroupMeta, int]]:
        """Episodes are not re-queued mid-way (compile refuses staleness_policy=recycle beside one)."""
        return []

    def submit(self, batch: Batch, meta: GroupMeta) -> None:
        groups = batch["group_id"].tolist()
        sample_ids = [[g * meta.samples + k if g >= 0 else g for k in range(meta.samples)] for g in groups]
        in_flight = {sid for entry in self._groups for ids in entry.sample_ids for sid in ids}
        if any(sid in in_flight for ids in sample_ids for sid in ids):
            return  # re-issued (a crash downstream) while still running here: the episodes in flight answer for it
        entry = _Group(batch, meta, sample_ids)
        self._groups.append(entry)
        for row, ids in enumerate(sample_ids):
            task = {name: _plain(value, row) for name, value in batch.items() if name not in ("sample_id", "group_id")}
            for sid in ids:
                self.loop.create_task(self._episode(entry, sid, dict(task)))

    def step(self) -> list[tuple[Batch, GroupMeta]]:
        self.loop.run_until_complete(self._round())
        done = [g for g in self._groups if len(g.ended) == g.expected]
        self._groups = [g for g in self._groups if len(g.ended) != g.expected]
        return [(self._assemble(g), g.meta) for g in done]

    def close(self) -> None:
        if self.server is not None:
            self.loop.run_until_complete(self.server.close())

    # -- the loop ----------------------------------------------------------------------------------

    async def _round(self) -> None:
        """Episodes run to their next wait; one decode step for every turn in flight; they take their tokens."""
        await _settle()
        if self.policy.engine.pending():
            self.sampler.step()
            await _settle()
            return
        self._wake.clear()  # idle: wait for a turn to be asked for or an episode to end
        try:
            await asyncio.wait_for(self._wake.wait(), IDLE_WAIT_S)
        except asyncio.TimeoutError:
            pass

    async def _episode(self, entry: _Group, sample_id: int, task: dict[str, Any]) -> None:
        key = secrets.token_urlsafe(24)
        llm = EpisodeLLM(sample_id, self.sampler.sample, self.sampler.version, self.policy.tokenizer,
                         max_new_tokens=self.max_new_tokens, stops=self.policy.stops,
                         context_tokens=self.policy.context_tokens,
                         base_url=self.server.base_url if self.server is not None else None,
                         api_key=key if self.server is not None else None)
        self.sessions[key] = llm
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(self._run(task, llm), self.timeout_s)
            ended = Ended(llm.trajectory, self._outputs(result, llm))
        except BadReturn as err:
            ended = Ended(llm.trajectory, failure=str(err))
        except asyncio.TimeoutError:  # (TimeoutError itself from Python 3.11)
            ended = Ended(llm.trajectory, failure=f"the episode ran past timeout_s={self.timeout_s} "
                                                  f"({time.monotonic() - started:.0f} s)")
        except Exception as err:  # the episode's own code (or a turn it asked for) broke: this sample failed
            where = raised_at(err)
            unawaited = " (an llm call not awaited?)" if "'coroutine' object" in str(err) else ""
            ended = Ended(llm.trajectory, failure=f"the episode raised {type(err).__name__}: {err}{unawaited}"
                                                  + (f" (at {where})" if where else ""))
        finally:
            del self.sessions[key]
        if ended.failure is None and not llm.trajectory.turns:
            ended = Ended(llm.trajectory, failure="the episode sampled nothing (it never awaited llm.generate, "
                                                  "llm.chat or the endpoint)")
        entry.ended[sample_id] = ended
        self._wake.set()

    def _outputs(self, result: Any, llm: EpisodeLLM) -> dict[str, Any]:
        """The episode's reward and declared outputs from what `run` returned (or the reward it posted);
        BadReturn says what is wrong with them."""
        if result is None:
            if llm.posted_reward is None:
                raise BadReturn("run returned nothing and no reward was posted (POST /v1/reward)")
            result = llm.posted_reward
        if not isinstance(result, Mapping):
            result = {"reward": result}
        reward = result.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
            raise BadReturn(f"the reward must be a finite number, got {reward!r:.60}")
        unknown = sorted(set(result) - {"reward", *self.declared})
        if unknown:
            raise BadReturn(f"run returned {', '.join(map(repr, unknown))}, which the node does not declare "
                            f"(declared outputs: {', '.join(['reward', *self.declared])})")
        missing = sorted(set(self.declared) - set(result))
        if missing:
            raise BadReturn(f"run returned no {', '.join(map(repr, missing))}")
        for name, ptype in self.declared.items():
            _check_value(name, ptype, result[name])
        return dict(result)

    # -- a finished group ----------------------------------------------------------------------------

    def _assemble(self, entry: _Group) -> Batch:
        rows = [row for row, ids in enumerate(entry.sample_ids) for _ in ids]
        ended = [entry.ended[sid] for ids in entry.sample_ids for sid in ids]
        fields: dict[str, Any] = {}
        index = torch.tensor(rows, dtype=torch.int64)
        for name, value in entry.batch.items():
            if name == "sample_id":
                continue
            fields[name] = value.select(rows) if isinstance(value, Ragged) else (
                value[index] if isinstance(value, torch.Tensor) else [value[r] for r in rows])
        fields["sample_id"] = torch.tensor([sid for ids in entry.sample_ids for sid in ids], dtype=torch.int64)
        per_sample = [e.trajectory.sample_fields() for e in ended]
        for name in TRAJECTORY_FIELDS:
            fields[name] = Ragged.from_rows([s[name] for s in per_sample], dtype=per_sample[0][name].dtype
                                            if per_sample else None)
        fields["reward"] = torch.tensor([float(e.outputs.get("reward", 0.0)) for e in ended], dtype=torch.float32)
        fields["turns"] = torch.tensor([e.trajectory.turns for e in ended], dtype=torch.int64)
        fields["transcript"] = [self.policy.decode(e.trajectory.ids) for e in ended]
        for name, ptype in self.declared.items():
            fields[name] = _column(ptype, [e.outputs.get(name) for e in ended])
        fields[FAILED] = [e.failure for e in ended]
        return Batch(fields)


def local_runner(run: Any, config: Any, *, outputs: Mapping[str, PortType] | None = None, endpoint: bool = False,
                 weights: Path | None = None, timeout_s: float | None = None, report: Any = None) -> EpisodeRunner:
    """A runner set up in this process as its worker would set it up, at version 0 of `config`'s model (or on
    `weights`): to score an agent offline, benchmark it, or test it, without a run around it."""
    from types import SimpleNamespace

    runner = EpisodeRunner(run, outputs or {}, endpoint=endpoint, timeout_s=timeout_s)
    runner.setup(SimpleNamespace(config=config, run_dir=None, version=0, resume_dir=None, weights_group=None,
                                 lora_rank=0, replica=0, published_weights=lambda version: None,
                                 resumed_policy=lambda: weights,
                                 report=report or (lambda kind, **fields: None)))
    return runner


async def _settle() -> None:
    """Let every episode that can run go to its next wait (a woken task runs one loop pass later)."""
    for _ in range(3):
        await asyncio.sleep(0)


def _plain(value: Any, row: int) -> Any:
    """One row of a batch field, as a plain Python value for the episode's task."""
    if isinstance(value, Ragged):
        return value[row].tolist()
    if isinstance(value, torch.Tensor):
        return value[row].tolist()
    return value[row]


def _column(ptype: PortType, values: list[Any]) -> Any:
    """One declared output over the group's samples (checked per sample in `_outputs`); a failed sample's
    missing value is a placeholder that its FAILED reason keeps out of every later node."""
    if ptype.dtype == "json":
        return values
    dtype = DTYPES[ptype.dtype]
    if ptype.level == "token":
        return Ragged.from_rows([torch.as_tensor(v if v is not None else [], dtype=dtype) for v in values],
                                dtype=dtype)
    return torch.tensor([v if v is not None else 0 for v in values], dtype=dtype)


def _check_value(name: str, ptype: PortType, value: Any) -> None:
    """A declared output's value for one sample: a number per sample, a list of numbers per token."""
    if ptype.dtype == "json":
        return
    try:
        tensor = torch.as_tensor(value, dtype=DTYPES[ptype.dtype])
    except (TypeError, ValueError, RuntimeError):
        raise BadReturn(f"output {name!r} is declared {ptype}, got {value!r:.60}") from None
    if tensor.dim() != (1 if ptype.level == "token" else 0):
        one = "list of numbers" if ptype.level == "token" else "number"
        raise BadReturn(f"output {name!r} is declared {ptype}: one {one} per sample, got {value!r:.60}")
