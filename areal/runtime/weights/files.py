"""transport.weights=files: each version is a safetensors file in `weights/MODEL/` (runtime/storage/weight_files.py
names it). The trainer writes it through a hidden temporary name renamed into place, so a reader never
sees half of it, and keeps the newest `keep`; a follower reads the whole file. The checkpoint copies the
published file (checkpoint.Sealing), so the trainer writes nothing more for it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from areal.errors import NodeContractError
from areal.graph.roles import Follower
from areal.nodes.workers.policy import load_weights
from areal.runtime.storage import weight_files
from areal.runtime.weights.transport import Source, Transport
from areal.runtime.wire.weight_update import Via

KIND = "files"
logger = logging.getLogger(__name__)


class FilesPublisher:
    def __init__(self, source: Source) -> None:
        self.source = source

    def publish(self, version: int) -> Via | None:
        source = self.source
        if source.rank_follower:
            source.save(None)  # its part of gathering the weights
            return None
        weights_dir, model = source.plan.weights_dir, source.model
        weight_files.model_dir(weights_dir, model).mkdir(parents=True, exist_ok=True)
        final = weight_files.published(weights_dir, model, version)
        tmp = weight_files.partial(weights_dir, model, version)
        source.save(str(tmp))
        if not tmp.exists():
            raise NodeContractError(f"trainer pool '{model}': save_weights(path) wrote no file at its path (the "
                                    "policy's weights as safetensors, which every follower loads)")
        os.replace(tmp, final)  # readers never see a half-written file
        for older, path in weight_files.published_versions(weights_dir, model).items():
            # keep the newest; a file above this version is rolled-back work from before a resume
            if not version - source.keep < older <= version:
                path.unlink(missing_ok=True)
        return Via(KIND, str(final), weights=source.weights)

    def reported(self) -> None:
        pass

    def sent_bytes(self) -> None:
        return None

    def checkpoint(self, folder: Path) -> None:
        pass  # the controller copies the published file into the checkpoint as it seals it

    def close(self) -> None:
        pass  # the newest files stay: a resumed or restarted follower starts from them


def receive(via: Via, follower: Follower, version: int) -> bool:
    """Load the file; False if it is gone because the trainer published `keep` newer versions meanwhile (a slow
    follower: the newest's update follows, and the follower keeps what it holds until then)."""
    try:
        state = load_weights(via.where)
    except FileNotFoundError:
        newer = weight_files.published_since(via.where)
        if not newer:
            raise
        logger.info("weights v%d were superseded by v%d before they could be read; waiting for its update",
                    version, max(newer))
        return False
    follower.load_weights(state, version)
    return True


TRANSPORT = Transport(publisher=FilesPublisher, receive=receive)
