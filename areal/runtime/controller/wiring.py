"""Dynamic endpoints (Ray): each worker binds a free port where it lands, and the controller wires its
neighbours to it, again after a restart (where the new process binds anew)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from areal.runtime.compiler.plan import Plan
from areal.runtime.wire.commands import Command, Rewire
from areal.runtime.worker.outbox import Outbox


class Wired(Protocol):
    worker_id: str
    pool: str
    replica: int
    ready: bool


class Wiring:
    def __init__(self, plan: Plan, source: str, source_out: dict[str, Outbox],
                 send: Callable[[str, Command], Any]) -> None:
        self.plan = plan
        self.source = source
        self.source_out = source_out
        self.send = send  # ControlServer.send
        self.listening: dict[tuple[str, str], str] = {}  # (worker id, input channel's source) -> endpoint bound

    def wire(self, worker: Wired, endpoints: dict[str, str], workers: Iterable[Wired]) -> bool:
        """Point each sender of `worker`'s inputs at the endpoint it bound (instead of the one of the process
        it replaces), and `worker` at every endpoint its outputs' receivers have bound.

        True when `worker` replaced a process: what its senders dealt to the old endpoint since that one died
        is dropped with the disconnect, so the caller must re-issue it (the replacement binds a new port, where
        a local worker binds the same endpoint again and gets what was queued for it)."""
        workers = list(workers)
        replaced = False
        for src, endpoint in endpoints.items():
            old = self.listening.get((worker.worker_id, src))
            self.listening[(worker.worker_id, src)] = endpoint
            replaced |= old is not None
            if src == self.source:
                outbox = self.source_out[worker.pool]
                if old is not None:
                    outbox.disconnect(worker.replica, old)
                outbox.connect(worker.replica, endpoint)
                continue
            for w in workers:
                if w.pool == src and w.ready:
                    self.send(w.worker_id, Rewire(channel=worker.pool, replica=worker.replica, connect=endpoint,
                                                  disconnect=old))
        for channel in self.plan.outputs_of(worker.pool):
            for receiver in workers:
                bound = self.listening.get((receiver.worker_id, worker.pool))
                if receiver.pool == channel.dst and bound is not None:
                    self.send(worker.worker_id, Rewire(channel=channel.dst, replica=receiver.replica, connect=bound))
        return replaced
