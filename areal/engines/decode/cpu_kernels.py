"""The CPU decode kernels (cpu_kernels.c): built once per machine with the system's C compiler, called by ctypes.

Profiled at the tiny coder's shape, one thread, 128 rows, the eager lean step spent less than half its time in
its matrix multiplies: attention as MKL's batched multiply of 256 tiny matrices ran at a few GFLOP/s, and the
norms, rotary embedding, cache writes and activation were ~35 torch ops a layer, each costing more to dispatch than
to compute. torch.compile of the step took 43 s and ran slower than eager (it copied the mutated cache). These
loops do that work in four calls a layer; the matrix multiplies stay torch's (MKL).

The library is built with `cc -O3 -march=native` (no -ffast-math: loaded into a process, its start-up code
would flush denormals for torch too) into $AREAL_CACHE/kernels (keyed by the source and the CPU), in
about a second, and loaded with ctypes: no torch headers, no Python extension build. Without a C compiler (or if
the build fails) `load()` says why once and the lean forward runs on torch ops alone. Float32 only: a float64
model (the tests' references) takes the torch ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from torch import Tensor

from areal.models.cache import cache_root

SOURCE = Path(__file__).with_name("cpu_kernels.c")
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "add_rms_norm": [_P, _P, _P, _P, _I, _I, _F],
    "silu_mul": [_P, _P, _I, _I],
    "rope_attend": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _F],
}


def _cpu_key() -> str:
    """What the built code depends on besides its source: the machine and its instruction set."""
    flags = ""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:  # two workers may build at once: rename wins
        built = Path(scratch) / target.name
        flags = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
        subprocess.run([compiler, *flags, "-o", str(built), str(SOURCE)], check=True, capture_output=True,
                       timeout=120)
        os.replace(built, target)


@cache
def load() -> CpuKernels | None:
    """The kernels of this machine, built on first use; None (said once on stderr, with why) when they cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("areal: generation: the CPU decode kernels need a C compiler (cc or $CC) and found none; the lean "
              "forward runs on torch ops alone (slower; install gcc to build them)", file=sys.stderr)
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + _cpu_key().encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / key / "decode_kernels.so"
    try:
        if not target.exists():
            _build(compiler, target)
        return CpuKernels(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        print(f"areal: generation: building the CPU decode kernels with {compiler} failed ({e}; "
              f"{detail.decode(errors='replace')[:300]}); the lean forward runs on torch ops alone", file=sys.stderr)
        return None


class CpuKernels:
    """The library's three calls over float32 CPU tensors (contiguous where cpu_kernels.c says so)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        for name, arguments in _SIGNATURES.items():
            getattr(library, name).argtypes = arguments
            getattr(library, name).restype = None
        self._lib = library

    def add_rms_norm(self, x: Tensor, delta: Tensor | None, weight: Tensor, out: Tensor, eps: float) -> None:
        """x += delta (in place), out = weight · x / rms(x); [n, dim] each."""
        self._lib.add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                               out.data_ptr(), x.shape[0], x.shape[1], eps)

    def silu_mul(self, gate_up: Tensor, out: Tensor) -> None:
        """out = silu(gate) · up, gate_up [n, 2 I] → out [n, I]."""
        self._lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), out.shape[0], out.shape[1])

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, keys: Tensor, values: Tensor,
                    out: Tensor, scratch: Tensor, heads: int, kv_heads: int, head_dim: int, scale: float,
                    shared: Shared | None = None, slots: Tensor | None = None) -> None:
        """Rotate q and k of each row (qkv [n, (H + 2 KVH) D], in place), write k and v into its slot (row i's, or
        slots[i]) at its position (keys and values [S, KVH, C, D] with unit column stride), attend over the slot's
        columns up to it; out [n, H D]. `shared`: the rows taken in an order that puts a group together, and the
        columns each reads from the group's source."""
        order, source, cut = (None, None, None) if shared is None else (
            shared.order.data_ptr(), shared.source.data_ptr(), shared.columns.data_ptr())
        self._lib.rope_attend(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                              None if slots is None else slots.data_ptr(), order, source, cut, keys.data_ptr(),
                              values.data_ptr(), out.data_ptr(), scratch.data_ptr(), qkv.shape[0], heads, kv_heads,
                              head_dim, keys.stride(0), keys.stride(1), scale)


@dataclass(frozen=True)
class Shared:
    """Which slots hold the same leading columns (a prompt copied to each row of its group): slot b's first
    columns[b] columns equal those of slot source[b]; `order` takes the slots group by group. [n] int64 each."""

    order: Tensor
    source: Tensor
    columns: Tensor
