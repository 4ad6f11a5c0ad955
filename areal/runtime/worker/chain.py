"""A pool's nodes run one after another on a batch whose fields are named by their producers.

Each node sees a view: its input ports bound to the fields the plan resolved for them
(`score.reward` on port `reward`), plus `sample_id` and `group_id`, and nothing else; what it
returns is checked against its ports (runtime/worker/outputs.py) and added under its own name, so no
node can overwrite another's field. Samples a node fails (its FAILED rows, or a NaN) or a filter
drops (its DROPPED rows) leave the batch here and are reported with their ids and reasons; the
numbers a node returns under METRICS are averaged into the step's metrics. A node is never called
with no samples: a batch that lost them all goes on with empty columns of the node's declared types
(a join downstream still waits for the group).
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from areal.errors import ArealError, NodeContractError, RunError, own_frames, runtime_file
from areal.graph.batch import Batch, Ragged
from areal.graph.node import Node
from areal.graph.roles import DROPPED, FAILED, METRICS
from areal.runtime.compiler.plan import IMPLICIT, Plan
from areal.runtime.records.sample_log import SampleLog
from areal.runtime.records.spans import Spans
from areal.runtime.wire.messages import Message, SamplesFailed, SamplesFiltered
from areal.runtime.worker.outputs import checked_outputs, empty_outputs

Report = Callable[[Message], None]  # the worker's control.send
log = logging.getLogger("areal.worker")


class NodeFailure(Exception):
    """A node's own code raised: the message names the node at its recipe line, then the frames of the code that
    raised (the researcher's, not the runtime's); the cause keeps the whole traceback for the worker's log."""

    def __init__(self, node: Node, err: BaseException) -> None:
        self.node = node.name
        frames = "" if isinstance(err, ArealError) else own_frames(err)  # a user error's message says it all
        super().__init__(f"{node.describe()} raised {type(err).__name__}: {err}" + (f"\n{frames}" if frames else ""))


def guard(node: Node, fn: Any, *args: Any) -> Any:
    """Call a node's code, timed by LONG_CALLS; anything it raises becomes a NodeFailure that names it."""
    try:
        method = getattr(getattr(fn, "__func__", None), "__name__", "__call__")  # a bound method's, else a call
        with LONG_CALLS.timing(node, "a call" if method == "__call__" else f"{method}()"):
            return fn(*args)
    except (NodeFailure, RunError):
        raise
    except Exception as err:
        raise NodeFailure(node, err) from err


class LongCalls:
    """The node call the worker's main thread is in, and the longest each kind of call (node, method) took so far.

    The pulse thread asks `said()` every beat: a call that has lasted more than `floor_s` and more than `factor`
    times its kind's longest is said (the node, its seconds, where its code is), and its whole stack goes to the
    worker's log once. A node that hangs in Python (a reward waiting on a dead service, a lock never released)
    keeps the worker's pulses coming, so nothing else would say why the run stopped moving."""

    factor = 10.0

    def __init__(self, floor_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.floor_s, self.clock = floor_s, clock
        self._longest: dict[tuple[str, str], float] = {}
        self._current: tuple[Node, str, float, int] | None = None  # node, method, began, thread
        self._where: str | None = None  # the current call's frames, once found long

    @contextmanager
    def timing(self, node: Node, method: str) -> Iterator[None]:
        if self._current is not None:  # a call inside a timed one: the outer one is what the worker is in
            yield
            return
        self._current, self._where = (node, method, self.clock(), threading.get_ident()), None
        try:
            yield
        finally:
            key = (node.name, method)
            self._longest[key] = max(self._longest.get(key, 0.0), self.clock() - self._current[2])
            self._current = None

    def said(self) -> str:
        """What the main thread has been in for long, or "" (read from the pulse thread)."""
        current = self._current
        if current is None:
            return ""
        node, method, began, thread = current
        seconds, longest = self.clock() - began, self._longest.get((node.name, method))
        if seconds < max(self.floor_s, self.factor * (longest or 0.0)):
            return ""
        if self._where is None:
            frame = sys._current_frames().get(thread)
            stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
            last = max((i for i, f in enumerate(stack) if runtime_file(f.filename)), default=-1)
            own = stack[last + 1:] or stack[-1:]  # below the runtime's call into the node, else where it is
            shown = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in own]
            self._where = " → ".join(shown if len(shown) <= 3 else [shown[0], "…", *shown[-2:]])  # entry, innermost
            log.warning("%s has been in %s for %.0f s; its stack:\n%s", node.describe(), method, seconds,
                        "".join(traceback.format_list(stack)).rstrip())
        before = f"its longest before: {longest:.1f} s" if longest is not None else "its first"
        return f"{node.describe()} has been in {method} for {seconds:.0f} s ({before}), at {self._where}"


LONG_CALLS = LongCalls()  # the worker's one main thread calls its nodes through guard()


def returned(n: Node, out: Any) -> dict[str, Any]:
    """What a node's call returned, which must be a dict: its declared outputs by port, and FAILED, DROPPED or
    METRICS (a trainer's: numbers for the step's record). An undeclared output is refused: nothing could read it."""
    if inspect.iscoroutine(out):
        out.close()  # never to run: no "never awaited" warning after the message
        raise NodeContractError(f"{n.describe()}: returned a coroutine, and a node is called as a plain function "
                                "whose result is never awaited; make it a def (asyncio.run(...) inside it for what it "
                                "awaits)")
    if not isinstance(out, Mapping):
        wants = "numbers for the step's record ({} for none)" if n.role == "trainer" else \
            f"its outputs by port ({', '.join(n.outputs)})"
        raise NodeContractError(f"{n.describe()}: returned {type(out).__name__} {out!r:.60}, not a dict of {wants}")
    extra = [k for k in out if k not in n.outputs and k not in (FAILED, DROPPED, METRICS)]
    if extra and n.role != "trainer":
        raise NodeContractError(f"{n.describe()}: returned {', '.join(map(repr, extra))}, which it does not declare "
                                f"(its outputs: {', '.join(n.outputs)}); declare it in outputs= to keep it, or "
                                f"return it under {METRICS} as a number for the step")
    return dict(out)


def numbers(n: Node, metrics: Mapping[str, Any]) -> dict[str, float]:
    """A node's METRICS as floats (a one-element tensor is a number); anything else is a broken contract."""
    found = {}
    for name, value in metrics.items():
        try:
            found[str(name)] = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise NodeContractError(f"{n.describe()}: its {METRICS} {name!r} is {type(value).__name__} "
                                    f"{value!r:.60}, not a number") from None
    return found


def in_place_versions(view: Batch) -> dict[str, int]:
    """Each tensor field's in-place version counter (a Ragged's values' and offsets'): torch bumps it on every
    in-place write, to it or to any view of it."""
    found = {}
    for name, value in view.items():
        parts = (value.values, value.offsets) if isinstance(value, Ragged) else (value,)
        if all(isinstance(part, torch.Tensor) for part in parts):
            found[name] = sum(part._version for part in parts)
    return found


def unchanged(n: Node, view: Batch, versions: Mapping[str, int], binding: Mapping[str, str]) -> None:
    """Refuse a node that wrote into a field it was given: the field is its producer's, read by the nodes after it,
    the trainer and the run's records (a reward centred in place would be recorded, and trained on, centred)."""
    changed = [name for name, version in in_place_versions(view).items() if versions.get(name, version) != version]
    if changed:
        fields = ", ".join(f"'{name}' ({binding.get(name, name)})" for name in changed)
        raise NodeContractError(f"{n.describe()}: changed its input {fields} in place, a field of the node that made "
                                "it, which later nodes, the trainer and the run's records read; make a new tensor "
                                "instead (r = r - r.mean(), not r -= r.mean())")


class Chain:
    def __init__(self, nodes: list[Node], impls: list[Any], plan: Plan, report: Report,
                 log: SampleLog | None = None, spans: Spans | None = None) -> None:
        self.steps = [(n, impl, plan.binding(n.name)) for n, impl in zip(nodes, impls)]
        self.report = report
        self.log = log  # each sample's outputs and removals, in this worker's samples/ file
        self.spans = spans  # each node call, timed, in this worker's spans/ file
        self.busy_s = 0.0

    def run(self, batch: Batch, held_out: bool, start: int = 0, stop: int | None = None) -> tuple[Batch, dict]:
        """Run nodes [start, stop) on `batch`; the batch without the samples they failed or dropped, and their
        METRICS (name -> value)."""
        metrics: dict[str, float] = {}
        for n, impl, binding in self.steps[start:stop]:
            if batch.size == 0:  # every sample failed or was dropped: the node is not called with nothing
                batch = batch.merge({f"{n.name}.{port}": value for port, value in empty_outputs(n).items()})
                continue
            view = self.view(batch, binding)
            versions = in_place_versions(view)
            began = time.monotonic()
            out = returned(n, guard(n, impl, view))
            ended = time.monotonic()
            unchanged(n, view, versions, binding)
            self.busy_s += ended - began
            if self.spans is not None:
                self.spans.add("node", n.name, began, ended, samples=batch.size)
            batch, found = self.absorb(n, batch, view, out, held_out)
            metrics.update(found)
        return batch, metrics

    def view(self, batch: Batch, binding: Mapping[str, str]) -> Batch:
        """What a node sees: its ports, bound to the fields it reads, and the ids."""
        return Batch({**{port: batch[field] for port, field in binding.items()},
                      **{name: batch[name] for name in IMPLICIT}})

    def absorb(self, n: Node, batch: Batch, view: Batch, out: dict[str, Any], held_out: bool) -> tuple[Batch, dict]:
        """Add a node's checked outputs to the batch under its name; take out the rows it failed or dropped."""
        failed = out.pop(FAILED, None) or {}
        dropped = out.pop(DROPPED, None) or {}
        metrics = numbers(n, out.pop(METRICS, None) or {})
        if dropped and n.role != "filter":
            raise NodeContractError(f"{n.describe()}: returned {DROPPED} rows, which only a node declared with "
                                    "role='filter' may drop")
        declared, non_finite = checked_outputs(n, view, {k: v for k, v in out.items() if k in n.outputs})
        if self.log is not None and not held_out:
            self.log.outputs(n.name, batch, declared)
        batch = batch.merge({f"{n.name}.{port}": value for port, value in declared.items()})
        batch = self.fail(n, batch, {**non_finite, **failed}, held_out)
        if held_out:
            return batch, {}  # a held-out round passes filters untouched, and its numbers are not a step's
        return self.drop(n, batch, dropped), metrics

    def fail(self, n: Node, batch: Batch, failed: Mapping[int, Any], held_out: bool) -> Batch:
        """Report the failed rows with their sample ids and reasons; the batch goes on without them."""
        return self._remove(SamplesFailed, n, batch, failed, eval=held_out)

    def drop(self, n: Node, batch: Batch, dropped: Mapping[int, Any]) -> Batch:
        return self._remove(SamplesFiltered, n, batch, dropped)

    def _remove(self, message: type[SamplesFailed | SamplesFiltered], n: Node, batch: Batch, rows: Mapping[int, Any],
                **extra: Any) -> Batch:
        if not rows:
            return batch
        bad = sorted(int(r) for r in rows)
        if bad[0] < 0 or bad[-1] >= batch.size:
            raise NodeContractError(f"{n.describe()}: {message.KIND} rows {bad} outside the batch of {batch.size}")
        ids, reasons = batch["sample_id"][bad].tolist(), [str(rows[r]) for r in bad]
        self.report(message(node=n.name, sample_ids=ids, reasons=reasons, **extra))
        if self.log is not None and not extra.get("eval"):
            self.log.removed(n.name, message.KIND, ids, reasons)
        return batch.select([i for i in range(batch.size) if i not in rows])
