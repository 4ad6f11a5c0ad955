"""What `areal eval` checks before any work: the model's weight files, and where the results go.

A Hugging Face directory whose safetensors file is missing, cut short or not safetensors at all
fails deep inside transformers with a traceback; an output path that cannot be written is found
only after every sample was generated and judged, and the results are lost. Both are refused
first, naming the file. The safetensors check reads headers only (8 bytes of length, then the
JSON header whose byte ranges must fit in the file), not the tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from areal.errors import ConfigError

INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # far above any real header: a larger "length" means the file is something else


def check_weights(folder: Path) -> None:
    """Every safetensors file a checkpoint directory holds (or its index names) is there and whole."""
    index = folder / INDEX
    if index.is_file():
        try:
            files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{index} is damaged ({type(err).__name__}: {err}); it names the weight files") from None
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files and not any(folder.glob("pytorch_model*.bin")):
            raise ConfigError(f"{folder}: no weights beside config.json (model.safetensors, or {INDEX} and its "
                              "shards); copy or download the model whole")
    for path in files:
        _check_safetensors(path, named_by=index if index.is_file() else None)


def _check_safetensors(path: Path, named_by: Path | None) -> None:
    if not path.is_file():
        raise ConfigError(f"{path}: missing ({named_by.name} names it); copy or download the model whole"
                          if named_by else f"{path}: missing")
    size = path.stat().st_size
    with path.open("rb") as file:
        head = file.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(size - 8, MAX_HEADER_BYTES):
            raise ConfigError(f"{path}: not a safetensors file, or cut short ({size} B); copy or download it again")
        try:
            header = json.loads(file.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
            raise ConfigError(f"{path}: its safetensors header is damaged ({type(err).__name__}: {err}); copy or "
                              "download it again") from None
    if 8 + length + end > size:
        raise ConfigError(f"{path} is {size} B, its header describes {8 + length + end} B: cut short (an interrupted "
                          "copy or download?); copy or download it again")


def check_output(out: Path) -> None:
    """`out` can be written: its folder is made if need be, and a file is created and removed beside it."""
    if out.is_dir():
        raise ConfigError(f"-o {out}: that is a directory; give the results' file, e.g. -o {out / 'results.json'}")
    probe = out.parent / f".{out.name}.{os.getpid()}.probe"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
        if out.exists() and not os.access(out, os.W_OK):
            raise PermissionError(13, "Permission denied", str(out))
    except OSError as err:
        raise ConfigError(f"-o {out}: cannot write there ({err.strerror or err}: {err.filename or out}); choose "
                          "another path with -o, before the model is loaded and every sample generated") from None


def write_results(out: Path, text: str) -> None:
    """The results file, whole or not at all (written beside it, then renamed into place)."""
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
