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

import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from areal.errors import NodeContractError, RunError
from areal.graph.batch import Batch
from areal.graph.node import Node
from areal.graph.roles import DROPPED, FAILED, METRICS
from areal.runtime.compiler.plan import IMPLICIT, Plan
from areal.runtime.records.sample_log import SampleLog
from areal.runtime.records.spans import Spans
from areal.runtime.wire.messages import Message, SamplesFailed, SamplesFiltered
from areal.runtime.worker.outputs import checked_outputs, empty_outputs

Report = Callable[[Message], None]  # the worker's control.send


class NodeFailure(Exception):
    """A node's own code raised: the message names the node at its recipe line, then the frames of the code that
    raised (the researcher's, not the runtime's); the cause keeps the whole traceback for the worker's log."""

    def __init__(self, node: Node, err: BaseException) -> None:
        self.node = node.name
        frames = own_frames(err)
        super().__init__(f"{node.describe()} raised {type(err).__name__}: {err}" + (f"\n{frames}" if frames else ""))


def guard(node: Node, fn: Any, *args: Any) -> Any:
    """Call a node's code; anything it raises becomes a NodeFailure that names it."""
    try:
        return fn(*args)
    except (NodeFailure, RunError):
        raise
    except Exception as err:
        raise NodeFailure(node, err) from err


def own_frames(err: BaseException, limit: int = 8) -> str:
    """The traceback from the first frame outside areal's own runtime, graph and errors (the node's code, and
    what it called), at most `limit` frames: what a researcher reads to find their bug."""
    frames = traceback.extract_tb(err.__traceback__)
    first = next((i for i, f in enumerate(frames) if not _runtime_file(f.filename)), len(frames))
    return "".join(traceback.format_list(frames[first:][-limit:])).rstrip()


def _runtime_file(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(folder) for folder in _RUNTIME_FOLDERS)


_AREAL = Path(__file__).resolve().parents[2]
_RUNTIME_FOLDERS = (_AREAL / "runtime", _AREAL / "graph")


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
            began = time.monotonic()
            out = dict(guard(n, impl, view))
            ended = time.monotonic()
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
        metrics = {str(k): float(v) for k, v in (out.pop(METRICS, None) or {}).items()}
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
