"""The built-in models, built once by the project and shipped in the package, and how to rebuild them.

The tiny coder's supervised warm start is deterministic on one machine, but CPU kernels round differently
from one processor to the next and ~50 s of training amplifies the difference: warm-started on three machines
from the same code and seed, it solved 17 %, 24 % and 36 % of the held-out tasks. So every user starts from
the same weights: `areal/models/builtin/NAME/` holds the checkpoint (3 MB in float32), and the hashes below
say which. `python -m areal.models.builtin_weights --check` rebuilds each into a temporary folder and compares
(a rebuild matches bit for bit only on a machine that rounds like the one that built it: say which when you
`--write` new ones).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("builtin")
BUILD_SEED = 0
# supervised steps of each built-in's warm start: the tiny coder's 360 take 44-89 s on 2 shared cores and it solves
# 17-31 % of held-out tasks at T=1. The chainer's 560 take about 3 minutes and it solves 49 % of the held-out chains
# (74 % of one line, about 20 % of six or more); it learns to count lines abruptly: 500 steps solved 10 %, 620 95 %.
# The mather's 1200 take about 4 minutes and it answers 39 % of the held-out arithmetic at T=1 (900 steps: 13 %,
# 1500: 60 %, where little is left for RL to learn)
WARMSTART_STEPS = {"tiny-coder": 360, "tiny-repairer": 360, "tiny-chainer": 560, "tiny-mather": 1200}
WEIGHTS_FILE = "model.safetensors"
# sha256 of each shipped model.safetensors (built on the 2-core x86-64 development VM, torch 2.13.0+cpu)
HASHES = {
    "tiny-coder": "bc3aef942e9c718ec81a01e28972eaddffc8b06409128c8e8a0149a37ad5ba6a",
    "tiny-repairer": "c71b10d6452edd7cb2eca2193bdc3d320054d97f80bea014b5fc9ee603bbc122",
    "tiny-chainer": "dcf165c45224bd1eb425b5e3209405f76bd6d4324473e603b2dc1d50c322e993",
    "tiny-mather": "7a1496b6af68027c7b10276f5824625feab298c72a579799fd9349278dda6032",
}


def shipped_dir(name: str) -> Path:
    """The shipped checkpoint of built-in `name` (a Hugging Face directory the loaders read as it is)."""
    return SHIPPED / name


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rebuild(name: str, into: Path) -> Path:
    """Warm-start built-in `name` from scratch into `into` (1-3 minutes on 2 cores); the checkpoint folder."""
    from areal.models.tiny import tiny_coder_config
    from areal.models.warmstart import warm_start

    return warm_start(tiny_coder_config(), training_tasks(name), WARMSTART_STEPS[name], BUILD_SEED, cache_dir=into)


def training_tasks(name: str) -> Sequence[Mapping[str, Any]]:
    """What built-in `name` is warm-started on: the code tasks' train split (and, for the repairer, one repair
    example per task); the chain tasks' train split for the chainer; the arithmetic's train split, each task's
    worked solution, for the mather."""
    from areal.data.chain_tasks import builtin_chain_tasks
    from areal.data.code_repair import repair_examples
    from areal.data.code_tasks import builtin_code_tasks
    from areal.data.math_tasks import builtin_math_tasks

    if name == "tiny-chainer":
        return builtin_chain_tasks("train").tasks
    if name == "tiny-mather":
        return builtin_math_tasks("train").tasks
    tasks: Sequence[Mapping[str, Any]] = builtin_code_tasks("train").tasks
    return [*tasks, *repair_examples(tasks, BUILD_SEED)] if name == "tiny-repairer" else tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the shipped checkpoints with the rebuilt ones")
    parser.add_argument("names", nargs="*", default=sorted(HASHES))
    args = parser.parse_args(argv)
    same = True
    for name in args.names:
        with tempfile.TemporaryDirectory(prefix=f"areal-{name}-") as tmp:
            built = rebuild(name, Path(tmp))
            got, want = digest(built / WEIGHTS_FILE), HASHES.get(name, "")
            same &= got == want
            print(f"{name}: rebuilt {got} · shipped {want or '(none)'} · {'same' if got == want else 'DIFFERENT'}")
            if args.write:
                shutil.rmtree(shipped_dir(name), ignore_errors=True)
                shutil.copytree(built, shipped_dir(name))
                print(f"{name}: wrote {shipped_dir(name)}; set HASHES[{name!r}] = {got!r}")
    return 0 if same or args.write else 1


if __name__ == "__main__":
    sys.exit(main())
