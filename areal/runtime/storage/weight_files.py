"""The names of the weights files a trainer publishes (transport.weights=files), kept in one place.

The trainer writes `weights/MODEL/vNNNNNN.safetensors` (through a hidden `.vNNNNNN.tmp` renamed into
place, so a reader never sees half a file); the controller's version table, every follower and the
checkpoint find the file again by its name. Were any of them to spell it differently, a follower
would find no weights and the checkpoint no policy, so they all ask this module.
"""

from __future__ import annotations

import re
from pathlib import Path

_PUBLISHED = re.compile(r"v(\d+)\.safetensors")


def model_dir(weights_dir: Path | str, model: str) -> Path:
    """The folder holding every published version of `model`."""
    return Path(weights_dir) / model


def published(weights_dir: Path | str, model: str, version: int) -> Path:
    """Where the trainer of `model` publishes version `version`."""
    return model_dir(weights_dir, model) / f"v{version:06d}.safetensors"


def partial(weights_dir: Path | str, model: str, version: int) -> Path:
    """The file version `version` is written to before it is renamed to `published(...)`."""
    return model_dir(weights_dir, model) / f".v{version:06d}.tmp"


def published_versions(weights_dir: Path | str, model: str) -> dict[int, Path]:
    """Every version of `model` on disk, with its file; names that are not a published version are ignored."""
    folder = model_dir(weights_dir, model)
    found = ((_PUBLISHED.fullmatch(path.name), path) for path in folder.glob("v*.safetensors"))
    return {int(match[1]): path for match, path in found if match}


def published_since(path: Path | str) -> list[int]:
    """The versions published beside the published file `path` that are newer than its own."""
    path = Path(path)
    match = _PUBLISHED.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path}: not a published weights file (vNNNNNN.safetensors)")
    versions = published_versions(path.parent.parent, path.parent.name)
    return sorted(v for v in versions if v > int(match[1]))
