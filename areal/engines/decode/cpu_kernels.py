"""The CPU decode kernels (csrc/): built once per machine with the system's C compiler, called by ctypes.

Profiled at the tiny coder's shape, one thread, 128 rows, the eager lean step spent less than half its time in
its matrix multiplies: attention as MKL's batched multiply of 256 tiny matrices ran at a few GFLOP/s, and the
norms, rotary embedding, cache writes and activation were ~35 torch ops a layer, each costing more to dispatch than
to compute. torch.compile of the step took 43 s and ran slower than eager (it copied the mutated cache). These
loops do that work in four calls a layer, and `decode_layers` runs the whole layer loop in one call: its matrix
multiplies are its own over packed copies of the weights where the machine has AVX-512 (`pack_weight`,
`linear_packed`: MKL re-packed them on every call), else MKL's `sgemm_`, which torch's CPU library exports, called
as torch's F.linear calls it (same bits); the head's is `sgemm_`. `decode_step` runs a whole eager decode step in
one call: the embedding, the layers, the head, the draw and the slot state's advance (their dozen torch ops were 6-7 %
of a 128-row generate).

The sources are in csrc/ by job (attention.c, multiply.c, step.c, the header they share). The library is built
with `cc -O3 -march=native` (no -ffast-math: loaded into a process, its start-up code would flush denormals for
torch too) into $AREAL_CACHE/kernels (keyed by the sources and the CPU), in
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
from typing import Protocol

import torch
from torch import Tensor

from areal.models.cache import cache_root

SOURCES = Path(__file__).with_name("csrc")  # attention.c, multiply.c, step.c and the header they share
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "add_rms_norm": [_P, _P, _P, _P, _I, _I, _F],
    "silu_mul": [_P, _P, _I, _I],
    "rope_attend": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _F],
    "decode_layers": [_P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _P,
                      _I, _I, _I, _I, _I, _I, _I, _I, _I, _F, _F, _P, _I, _I],
    "sample_rows": [_P, _P, _I, _I, _F, _P, _P, _P],
    "ahead_plan": [_P, _I, _P, _I, _I, _P],
    "pack_weight": [_P, _P, _I, _I],
    "linear_packed": [_P, _P, _P, _P, _I, _I, _I],
    "decode_step": [_P, _P, _I, _P, _P, _P, _P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _P, _I, _I, _P, _P,
                    _I, _I, _I, _I, _I, _I, _I, _I, _F, _F, _F, _I, _P, _P, _P, _I],
}


def _cpu_key() -> str:
    """What the built code depends on besides its source: the machine and its instruction set."""
    flags = ""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def _sources() -> list[Path]:
    """The kernels' C sources and header, in a fixed order; OSError when the package holds none."""
    sources = sorted(p for p in SOURCES.iterdir() if p.suffix in (".c", ".h"))
    if not any(p.suffix == ".c" for p in sources):
        raise FileNotFoundError(f"no C sources in {SOURCES}")
    return sources


def _build(compiler: str, target: Path, sources: list[Path]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:  # two workers may build at once: rename wins
        built = Path(scratch) / target.name
        flags = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
        units = [str(p) for p in sources if p.suffix == ".c"]
        subprocess.run([compiler, *flags, "-o", str(built), *units], check=True, capture_output=True, timeout=120)
        os.replace(built, target)


@cache
def load() -> CpuKernels | None:
    """The kernels of this machine, built on first use; None (said once on stderr, with why) when they cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("areal: generation: the CPU decode kernels need a C compiler (cc or $CC) and found none; the lean "
              "forward runs on torch ops alone (slower; install gcc to build them)", file=sys.stderr)
        return None
    try:
        sources = _sources()
        digest = hashlib.sha256(_cpu_key().encode())
        for p in sources:
            digest.update(p.name.encode() + b"\0" + p.read_bytes())
        target = cache_root() / "kernels" / digest.hexdigest()[:16] / "decode_kernels.so"
        if not target.exists():
            _build(compiler, target, sources)
        return CpuKernels(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        print(f"areal: generation: building the CPU decode kernels with {compiler} failed ({e}; "
              f"{detail.decode(errors='replace')[:300]}); the lean forward runs on torch ops alone", file=sys.stderr)
        return None


class CpuKernels:
    """The library's calls over float32 CPU tensors (contiguous where csrc/ says so)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        for name, arguments in _SIGNATURES.items():
            getattr(library, name).argtypes = arguments
            getattr(library, name).restype = None
        library.decode_step_work.argtypes, library.decode_step_work.restype = [_I] * 8, _I
        library.packed_panel.argtypes, library.packed_panel.restype = [], _I
        self.panel = int(library.packed_panel())  # rows a packed weight's panel holds; 0: the layers use sgemm_
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
        slots[i]) at its position (keys and values [S, KVH, C, D], strided alike with each column's D floats
        adjacent: either of SlotKV's layouts), attend over the slot's
        columns up to it; out [n, H D]. `shared`: the rows taken in an order that puts a group together, and the
        columns each reads from the group's source."""
        order, source, cut = (None, None, None) if shared is None else (
            shared.order.data_ptr(), shared.source.data_ptr(), shared.columns.data_ptr())
        self._lib.rope_attend(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                              None if slots is None else slots.data_ptr(), order, source, cut, keys.data_ptr(),
                              values.data_ptr(), out.data_ptr(), scratch.data_ptr(), qkv.shape[0], heads, kv_heads,
                              head_dim, keys.stride(0), keys.stride(1), keys.stride(2), scale)

    def decode_layers(self, gemm: int, weights: Tensor, final_norm: Tensor, x: Tensor, h: Tensor, kv: Tensor,
                      cos: Tensor, sin: Tensor, positions: Tensor, width: int, *, heads: int, kv_heads: int,
                      head_dim: int, intermediate: int, scale: float, eps: float, shared: Shared | None = None,
                      slots: Tensor | None = None, kept: Tensor | None = None, packed: bool = False) -> None:
        """Every layer of the lean forward in one call (see csrc/step.c), its multiplies by the packed kernel
        where `packed` (weights' addresses of pack_weight's copies), else by `gemm` (the address torch_sgemm gives,
        as F.linear): x [n, hidden] updated in place; h [n, hidden] from the first layer's normed input to the
        final norm's output; weights [layers, 10] int64 addresses; kv [L, 2, S, KVH, C, D] as SlotKV lays it out;
        rows, slots and `shared` as in rope_attend, attending over at most `width` columns. `kept` (int64 [m],
        increasing, any repeated; no `shared` with it): only these rows' outputs are wanted, in h's first m rows."""
        n = x.shape[0]
        order, source, cut = (None, None, None) if shared is None else (
            shared.order.data_ptr(), shared.source.data_ptr(), shared.columns.data_ptr())
        qkv, attn = torch.empty(n, (heads + 2 * kv_heads) * head_dim), torch.empty(n, heads * head_dim)
        delta, gate_up, act = torch.empty_like(x), torch.empty(n, 2 * intermediate), torch.empty(n, intermediate)
        scratch = torch.empty(heads // kv_heads * width)
        self._lib.decode_layers(gemm, weights.data_ptr(), weights.shape[0], final_norm.data_ptr(), x.data_ptr(),
                                h.data_ptr(), qkv.data_ptr(), attn.data_ptr(), delta.data_ptr(), gate_up.data_ptr(),
                                act.data_ptr(), cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                                None if slots is None else slots.data_ptr(), order, source, cut, kv.data_ptr(),
                                kv.stride(0), kv.stride(1), scratch.data_ptr(), n, x.shape[1], intermediate, heads,
                                kv_heads, head_dim, kv.stride(2), kv.stride(3), kv.stride(4), scale, eps,
                                None if kept is None else kept.data_ptr(), 0 if kept is None else kept.shape[0],
                                int(packed))

    def decode_step(self, gemm: int, weights: Tensor, norms: tuple[Tensor, Tensor], embed: Tensor, head: Tensor,
                    kv: Tensor, state: SlotState, cos: Tensor, sin: Tensor, n: int, width: int, temperature: float, *,
                    heads: int, kv_heads: int, head_dim: int, intermediate: int, scale: float, eps: float,
                    shared: Shared | None = None, slots: Tensor | None = None, packed: bool = False,
                    ) -> tuple[Tensor, Tensor]:
        """A decode step of slots 0..n-1 (or slots[i]) in one call (see csrc/step.c): the embedding, decode_layers
        (`norms`: the first layer's input norm and the final one; `packed` as there), the head, the draw at top_p =
        1 and the slot state's advance; the tokens [n] int64 and their log-probs [n] float32."""
        vocab, hidden = head.shape
        order, source, cut = (None, None, None) if shared is None else (
            shared.order.data_ptr(), shared.source.data_ptr(), shared.columns.data_ptr())
        work = torch.empty(self._lib.decode_step_work(n, hidden, intermediate, heads, kv_heads, head_dim, vocab,
                                                      width))
        tokens, logp = torch.empty(n, dtype=torch.int64), torch.empty(n)
        self._lib.decode_step(gemm, weights.data_ptr(), weights.shape[0], norms[0].data_ptr(), norms[1].data_ptr(),
                              embed.data_ptr(), head.data_ptr(), vocab, n, None if slots is None else slots.data_ptr(),
                              order, source, cut, state.pending.data_ptr(), state.positions.data_ptr(),
                              state.produced.data_ptr(), state.live.data_ptr(), state.uniforms.data_ptr(),
                              state.uniforms.stride(0), kv.data_ptr(), kv.stride(0), kv.stride(1), cos.data_ptr(),
                              sin.data_ptr(), hidden, intermediate, heads, kv_heads, head_dim, kv.stride(2),
                              kv.stride(3), kv.stride(4), scale, eps, temperature, width, work.data_ptr(),
                              tokens.data_ptr(), logp.data_ptr(), int(packed))
        return tokens, logp

    def pack_weight(self, weight: Tensor, out: Tensor | None = None) -> Tensor:
        """A weight [rows, cols] (float32, contiguous) as decode_layers' multiplies read it when `panel` > 0:
        panels of `panel` rows, [ceil(rows / panel), cols, panel], the last one's missing rows zero; into `out`
        (that shape) if given, so that the addresses decode_layers was given stay valid."""
        rows, cols = weight.shape
        if out is None:
            out = torch.empty(-(-rows // self.panel), cols, self.panel)
        self._lib.pack_weight(weight.data_ptr(), out.data_ptr(), rows, cols)
        return out

    def linear_packed(self, x: Tensor, packed: Tensor, bias: Tensor | None, rows: int) -> Tensor:
        """x [n, cols] . w^T (+ bias) [n, rows], w packed by pack_weight: the layers' multiply in decode_layers."""
        out = torch.empty(x.shape[0], rows)
        self._lib.linear_packed(x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                                out.data_ptr(), x.shape[0], rows, x.shape[1])
        return out

    def sample_rows(self, logits: Tensor, u: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
        """`sampling.sample_tokens` at top_p = 1 (temperature > 0) in one call: logits [n, V] float32, u [n]
        float64, both contiguous; tokens [n] int64 and their log-probs [n] float32."""
        n, vocab = logits.shape
        tokens, logp, scratch = torch.empty(n, dtype=torch.int64), torch.empty(n), torch.empty(2 * vocab)
        self._lib.sample_rows(logits.data_ptr(), u.data_ptr(), n, vocab, temperature, tokens.data_ptr(),
                              logp.data_ptr(), scratch.data_ptr())
        return tokens, logp


@cache
def torch_sgemm() -> int | None:
    """The address of the BLAS `sgemm_` torch's CPU library exports (MKL's on x86 builds), for `decode_layers`;
    None when the library has none or a product through it differs from torch's (then the layer loop stays in
    Python, one torch call per multiply)."""
    try:
        sgemm = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).sgemm_
    except (OSError, AttributeError):
        return None
    x, w = torch.arange(6.0).reshape(2, 3), torch.arange(12.0).reshape(4, 3) - 5  # exact in float32
    out = torch.empty(2, 4)
    rows, n, cols = (ctypes.byref(ctypes.c_int64(v)) for v in (4, 2, 3))
    one, zero = ctypes.byref(ctypes.c_float(1.0)), ctypes.byref(ctypes.c_float(0.0))
    sgemm.restype = None
    sgemm(b"T", b"N", rows, n, cols, one, _P(w.data_ptr()), cols, _P(x.data_ptr()), cols, zero,
          _P(out.data_ptr()), rows)
    return ctypes.cast(sgemm, ctypes.c_void_p).value if torch.equal(out, x @ w.T) else None


class SlotState(Protocol):
    """The per-slot decode state decode_step reads and advances (SlotKV's): int64 [slots] each, and the requests'
    uniforms, float64 [slots, draws], rows contiguous."""

    pending: Tensor
    positions: Tensor
    produced: Tensor
    live: Tensor
    uniforms: Tensor


@dataclass(frozen=True)
class Shared:
    """Which slots read the same leading columns (a group's prompt, held by one of its slots): slot b's first
    columns[b] columns are read from slot source[b]; `order` takes the slots group by group. [n] int64 each."""

    order: Tensor
    source: Tensor
    columns: Tensor
