"""The map role of a worker: a group in (joined from every input channel), the pool's nodes run, the group out
on every output. A map node that follows a trained model (a critic's value pass) takes that model's newest
weights between groups. A mixin of `Worker` (main.py), which holds the state these methods read."""

from __future__ import annotations

from areal.runtime import weights


class MapRole:
    """What a worker of a map pool does beyond the common loop."""

    def _map_loop(self) -> None:
        routed = [m for m in self.followers if self.pool.name in self.plan.followers(m)]
        while any(m not in self._latest_weights for m in routed) and not self.stopping:
            self._wait(100)  # the controller answers "ready" with each followed model's version: run nothing before
        while not self.stopping:
            self._wait(int(self.config.faults.heartbeat_s * 1000))
            self._follow_weights()
            for batch, meta in self._drain():
                done, metrics = self.chain.run(batch, held_out=meta.eval)
                self._report_metrics(metrics)
                self._send(done, meta)

    def _follow_weights(self) -> None:
        """Map nodes that follow a trained model take its newest weights between groups."""
        for model, impls in self.followers.items():
            update = self._apply_weights(model)
            if update is not None and update.via is not None:
                with self.spans.timed("weights", "load weights", model=model, version=update.version):
                    for impl in impls:
                        weights.receive(update, impl)
