"""The step and held-out metrics mirrored to the experiment trackers a run asks for (`records.trackers`).

metrics.jsonl stays the record: a tracker is a view of it, so one that fails is said once and dropped, and the
run goes on. Each line of kind step or eval goes to every tracker as its numbers, under `step/` or `eval/`, at
its policy version:

- tensorboard: event files under the run directory's `tensorboard/`. A resumed run purges what its checkpoint
  rolled back (the versions after it), as it cuts metrics.jsonl, so a curve holds one point a version.
- wandb: one W&B run per areal run, named after its directory, its id kept there (`wandb-id`) so a resume
  continues it; the run's config as W&B's; plotted against `version`. Entity, group, tags, mode and key come from
  W&B's own environment (`WANDB_ENTITY`, `WANDB_RUN_GROUP`, `WANDB_TAGS`, `WANDB_MODE=offline` writes under the
  run directory for `wandb sync`), the project from `records.wandb_project`, else `WANDB_PROJECT`, else areal. W&B has
  no purge: a version a checkpoint rolled back shows both its points there.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from areal.errors import ConfigError

if TYPE_CHECKING:
    from areal.config import RunConfig

log = logging.getLogger("areal.controller")
INSTALL = "pip install -c constraints.txt -e '.[track]'"
WANDB_ID_FILE = "wandb-id"


class Tracker(Protocol):
    where: str  # where to look: the run summary says it

    def log(self, kind: str, version: int, values: dict[str, float]) -> None: ...

    def close(self, failed: bool) -> None: ...


def tracker_problems(config: RunConfig) -> list[str]:
    """Each asked-for tracker whose package (named as the tracker) this machine lacks, said before the run starts."""
    return [f"records.trackers: {name} needs the '{name}' package ({INSTALL})"
            for name in config.records.trackers if importlib.util.find_spec(name) is None]


def open_trackers(config: RunConfig, run_dir: Path, resumed_at: int | None) -> list[Tracker]:
    """The run's trackers, opened; `resumed_at`: the version a resumed run starts from (its checkpoint's)."""
    opened: list[Tracker] = []
    for name in config.records.trackers:
        if name == "tensorboard":
            opened.append(TensorBoardTracker(run_dir / "tensorboard", resumed_at))
        else:
            opened.append(WandbTracker(run_dir, config))
    return opened


class TensorBoardTracker:
    def __init__(self, folder: Path, resumed_at: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # what a resumed run writes again (the versions after its checkpoint) replaces what it had written
        self.writer = SummaryWriter(str(folder), purge_step=None if resumed_at is None else resumed_at + 1)
        self.where = f"tensorboard --logdir {folder}"

    def log(self, kind: str, version: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{kind}/{key}", value, version)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, config: RunConfig) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:16]
        id_file.write_text(run_id + "\n")
        quiet = wandb.Settings(console="off", silent=True, show_info=False)  # the run's own console is areal's
        project = config.records.wandb_project or os.environ.get("WANDB_PROJECT") or "areal"
        try:
            self.run: Any = wandb.init(project=project, name=run_dir.name, id=run_id,
                                       resume="allow", dir=str(run_dir), config=config.model_dump(mode="json"),
                                       settings=quiet)
        except Exception as err:  # no key, no network, a project it may not write: W&B's own words
            raise ConfigError(f"records.trackers=wandb: W&B did not start the run's W&B run ({type(err).__name__}: "
                              f"{err}); log in (wandb login, or WANDB_API_KEY), or set WANDB_MODE=offline to keep it "
                              "under the run directory for wandb sync") from None
        self.run.define_metric("version")
        for kind in ("step", "eval"):
            self.run.define_metric(f"{kind}/*", step_metric="version")
        self.where = (f"W&B offline run {run_id}: wandb sync {run_dir / 'wandb'}/offline-run-*" if self.run.offline
                      else f"W&B run {self.run.url}")
        log.info("%s (project %s)", self.where, project)

    def log(self, kind: str, version: int, values: dict[str, float]) -> None:
        self.run.log({"version": version, **{f"{kind}/{key}": value for key, value in values.items()}})

    def close(self, failed: bool) -> None:
        import wandb

        self.run.finish(exit_code=1 if failed else 0)  # W&B shows a run that ended on an error as failed
        wandb.teardown()  # its service process ends with the run, not with the process that ran it (a test's)
