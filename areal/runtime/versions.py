"""One policy version per trained model, which version of it each follower should hold, and telling it.

A trainer owns its model's counter (it reports each new version); this module only records them.
The slowest trainer's version drives admission (every trainer then trains batch k at a version
k <= i + η for the i it had when the group started). Generators sample the policy: its newest
version, or in lagged mode the one η versions older. Weights travel as files in
`weights/MODEL/` or, for the policy with transport.weights=broadcast, over a process group.
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
from areal.runtime import weight_files
from areal.runtime.checkpoint import policy_name
from areal.runtime.commands import Command, HoldWeights
from areal.runtime.plan import Plan


class Follower(Protocol):
    worker_id: str
    pool: str


class Versions:
    def __init__(self, plan: Plan, start: int, sampling_lag: int, resumed: Path | None = None) -> None:
        """`resumed`: the checkpoint folder a resumed run starts from (it holds each model's weights at `start`)."""
        self.plan = plan
        self.current = {p.name: start for p in plan.trainer_pools()}
        self.latest_path: dict[str, str | None] = {
            model: str(resumed / policy_name(model)) for model in self.current
            if resumed is not None and (resumed / policy_name(model)).is_file()}
        self.lag = sampling_lag  # lagged mode: generators hold the policy this many versions behind; 0 at the end
        self._told: dict[str, int] = {}

    @property
    def slowest(self) -> int:
        return min(self.current.values(), default=0)

    def record(self, model: str, version: int, path: str | None) -> None:
        self.current[model] = version
        self.latest_path[model] = path

    def sampled(self, model: str | None = None) -> int:
        """The version followers of `model` (default: the policy) are to hold: generators lag in lagged mode."""
        model = model or self.plan.policy
        if not model:
            return self.slowest
        version = self.current.get(model, 0)
        return max(0, version - self.lag) if model == self.plan.policy else version

    def path(self, model: str, version: int) -> str | None:
        if version == self.current.get(model):
            return self.latest_path.get(model)
        older = weight_files.published(self.plan.weights_dir, model, version)  # the trainer keeps 3 + lag
        return str(older) if older.exists() else None  # none for v0: followers start from the checkpoint

    def news(self, model: str) -> tuple[int, str | None] | None:
        """(version, path) to tell `model`'s followers, once per version; None when they know it already."""
        version = self.sampled(model)
        if self._told.get(model) == version:
            return None
        self._told[model] = version
        return version, self.path(model, version)

    def forget_told(self, model: str) -> None:
        self._told.pop(model, None)

    # -- publication: the weights messages to each model's followers -------------------------

    def announce(self, model: str, workers: Iterable[Follower], send: Callable[[str, Command], Any],
                 broadcast: bool = False) -> None:
        """Send every follower of `model` the weights it should now hold, once per version.

        broadcast: the trainer waits in the weights group's broadcast of this version, and each generator
        must take its part."""
        news = self.news(model) if model else None
        if news is None:
            return
        version, path = news
        for w in workers:
            if w.pool in self.plan.followers(model):
                self._check_loadable(model, version, path, w.worker_id, broadcast)
                send(w.worker_id, HoldWeights(model=model, version=version, path=path, broadcast=broadcast))

    def catch_up(self, worker: Follower, send: Callable[[str, Command], Any]) -> None:
        """A (re)started follower must not run before it holds the version it is to hold, of every model it follows."""
        for model in [trainer for trainer, follower in self.plan.weights_routes if follower == worker.pool]:
            version = self.sampled(model)
            path = self.path(model, version)
            # with transport.weights=broadcast the generators took the policy when the weights group formed
            self._check_loadable(model, version, path, worker.worker_id,
                                 broadcast=model == self.plan.policy and bool(self.plan.weights_rendezvous))
            send(worker.worker_id, HoldWeights(model=model, version=version, path=path))

    def _check_loadable(self, model: str, version: int, path: str | None, worker: str, broadcast: bool) -> None:
        """Version 0 is the weights a follower is built with; any later one must come in a file or a broadcast."""
        if version > 0 and path is None and not broadcast:
            folder = weight_files.model_dir(self.plan.weights_dir, model)
            raise RunError(f"model '{model}' is at version {version}, but no file holds those weights (neither "
                           f"{folder} nor the resumed checkpoint): {worker} would run on weights it was not told "
                           "to hold")
