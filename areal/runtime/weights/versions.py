"""One policy version per trained model, which version of it each follower should hold, and telling it.

A trainer owns its model's counter (it reports each new version); this module only records them.
The slowest trainer's version drives admission (every trainer then trains batch k at a version
k <= i + η for the i it had when the group started). Generators sample the policy: its newest
version, or in lagged mode the one η versions older. Weights travel as files in
`weights/MODEL/` or, for the policy, as transport.weights says (runtime/weights/): each recorded
version keeps how it travels.
A resumed run's current version of each model is the checkpoint's copy (`policy-MODEL.safetensors`),
so a follower of any model, not only the policy, starts from the trained weights; a follower told
a version past 0 with no file to load it from stops the run, naming the model, instead of running
on the weights it was built with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from areal.errors import RunError
from areal.runtime.compiler.plan import Plan
from areal.runtime.storage import weight_files
from areal.runtime.storage.checkpoint import policy_name
from areal.runtime.weights import Via, WeightUpdate, collective, files
from areal.runtime.wire.commands import Command, HoldWeights


class Follower(Protocol):
    worker_id: str
    pool: str


class Versions:
    def __init__(self, plan: Plan, start: int, sampling_lag: int, resumed: Path | None = None) -> None:
        """`resumed`: the checkpoint folder a resumed run starts from (it holds each model's weights at `start`)."""
        self.plan = plan
        self.current = {p.name: start for p in plan.trainer_pools()}
        self.keep = 3 + sampling_lag  # the versions a trainer keeps published (weights.transport.Source.keep)
        # model -> version -> how it travels, the newest `keep` of each (a resumed run's: the checkpoint's file)
        self.published: dict[str, dict[int, Via]] = {
            model: {start: Via(files.KIND, str(resumed / policy_name(model)))} for model in self.current
            if resumed is not None and (resumed / policy_name(model)).is_file()}
        self.lag = sampling_lag  # lagged mode: generators hold the policy this many versions behind; 0 at the end
        self._told: dict[str, int] = {}

    @property
    def slowest(self) -> int:
        return min(self.current.values(), default=0)

    def record(self, model: str, version: int, via: Via | None) -> None:
        self.current[model] = version
        kept = self.published.setdefault(model, {})
        if via is not None:
            kept[version] = via
        for old in [v for v in kept if not version - self.keep < v <= version]:
            del kept[old]

    def sampled(self, model: str | None = None) -> int:
        """The version followers of `model` (default: the policy) are to hold: generators lag in lagged mode."""
        model = model or self.plan.policy
        if not model:
            return self.slowest
        version = self.current.get(model, 0)
        return max(0, version - self.lag) if model == self.plan.policy else version

    def update(self, model: str, version: int) -> WeightUpdate:
        """`version` of `model` and how to load it; no `via` for v0 (followers start from the checkpoint)."""
        via = self.published.get(model, {}).get(version)
        if via is None:  # published before this controller started (a restarted run): found on disk by its name
            older = weight_files.published(self.plan.weights_dir, model, version)
            via = Via(files.KIND, str(older)) if older.exists() else None
        return WeightUpdate(model, version, via)

    def news(self, model: str) -> WeightUpdate | None:
        """The update to tell `model`'s followers, once per version; None when they know it already."""
        version = self.sampled(model)
        if self._told.get(model) == version:
            return None
        self._told[model] = version
        return self.update(model, version)

    def forget_told(self, model: str) -> None:
        self._told.pop(model, None)

    # -- publication: the weights messages to each model's followers -------------------------

    def announce(self, model: str, workers: Iterable[Follower], send: Callable[[str, Command], Any]) -> None:
        """Send every follower of `model` the weights it should now hold, once per version (a collective
        transport's followers take their part in it when told)."""
        update = self.news(model) if model else None
        if update is None:
            return
        for w in workers:
            if w.pool in self.plan.followers(model):
                self._check_loadable(update, w.worker_id)
                send(w.worker_id, HoldWeights(update=update))

    def catch_up(self, worker: Follower, send: Callable[[str, Command], Any]) -> None:
        """A (re)started follower must not run before it holds the version it is to hold, of every model it follows."""
        for model in [trainer for trainer, follower in self.plan.weights_routes if follower == worker.pool]:
            update = self.update(model, self.sampled(model))
            if collective(update.via) or (update.via is None and self._in_weights_group(model)):
                # the generators took the policy when the weights group formed: nothing to load, the version noted
                update = WeightUpdate(model, update.version)
            else:
                self._check_loadable(update, worker.worker_id)
            send(worker.worker_id, HoldWeights(update=update))

    def _in_weights_group(self, model: str) -> bool:
        return model == self.plan.policy and bool(self.plan.weights_rendezvous)

    def _check_loadable(self, update: WeightUpdate, worker: str) -> None:
        """Version 0 is the weights a follower is built with; any later one must say how it travels."""
        if update.version > 0 and update.via is None:
            folder = weight_files.model_dir(self.plan.weights_dir, update.model)
            raise RunError(f"model '{update.model}' is at version {update.version}, but no file holds those weights "
                           f"(neither {folder} nor the resumed checkpoint): {worker} would run on weights it was not "
                           "told to hold")
