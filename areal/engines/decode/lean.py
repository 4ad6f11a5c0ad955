"""A lean forward for the Qwen2 / Llama family: the model's own weights, none of Hugging Face's per-call machinery.

At the tiny coder's size most of an HF decode step is host work: mask building, cache objects, keyword plumbing.
This forward reads the same parameters and writes each token's K/V straight into a slot cache (`SlotKV.kv`,
[layers, 2, slots, kv heads, columns, head dim]). q, k and v are one matrix, gate and up another: the HF modules'
parameters become views into them, so `load_state_dict` writes the fused storage in place and a CUDA graph
captured over it stays current. It follows HF's arithmetic where the rounding shows (the RMS norm in float32, the
rotary tables from the model's own rotary module), so in float64 it agrees with HF's forward to rounding.

Two calls: `decode` (one token a slot, slots 0..n-1, attention over each slot's first `width` columns masked to
its own filled part) and `extend` (a right-padded chunk of tokens a slot: prefill, or a re-read after new weights).

Not here: gradients, sliding windows, other attention kinds; `lean_problem` says why a model is not known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from areal.engines.decode import cpu_kernels

FAMILIES = ("qwen2", "llama")
_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")  # their tables change with the sequence's length


def lean_problem(model: Any) -> str | None:
    """Why the lean forward cannot run `model` (one clause), or None when it can."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"the lean forward knows {' and '.join(FAMILIES)} models, not {kind!r}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "its layers use sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act!r}, not silu"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind in _POSITION_DEPENDENT_ROPE:
        return f"its rotary embedding ({kind}) depends on the sequence length"
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "its modules are not laid out as transformers' Qwen2/Llama classes"
    attn = inner.layers[0].self_attn
    if len({p.bias is None for p in (attn.q_proj, attn.k_proj, attn.v_proj)}) > 1:
        return "some of its q/k/v projections have a bias and some do not"
    return None


def _fuse(modules: list[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    """One weight (and bias) holding the modules' rows in order; each module's parameters become views into it."""
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = None if modules[0].bias is None else torch.cat([m.bias.detach() for m in modules])
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


def _bias(module: nn.Linear) -> Tensor | None:
    return None if module.bias is None else module.bias


@dataclass
class _Layer:
    in_norm: Tensor
    post_norm: Tensor
    qkv: Tensor  # [(heads + 2 kv heads) * head dim, hidden]
    qkv_bias: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    gate_up: Tensor  # [2 * intermediate, hidden]
    gate_up_bias: Tensor | None
    down: Tensor
    down_bias: Tensor | None


def _within(kv: Tensor, width: int) -> None:
    """The C kernels write at each position: never past the cache."""
    if width > kv.shape[4]:
        raise ValueError(f"LeanForward: width {width} is past the cache's {kv.shape[4]} columns")


def _kept_rows(kept: Tensor | None, rows: int) -> Tensor | None:
    """The rows a chunk of `rows` goes on with past its last layer's keys (None: all of them): `kept`, its last row
    repeated up to four. torch's sgemm_ rounds a row the same for any count of rows from four on and otherwise
    below, so a kept row then rounds as in the whole chunk's multiply; a chunk of fewer than four goes on whole.
    (The packed multiplies round a row alike for any count: there the padding only costs three rows.)"""
    if kept is None or rows < 4:
        return None
    if kept.shape[0] >= 4:
        return kept
    return torch.cat([kept, kept[-1:].expand(4 - kept.shape[0])])


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's RMS norm as it rounds: in float32, cast back, then scaled by the weight in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin over the last dim (head dim), as HF applies it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanForward:
    """The forward of a Qwen2/Llama `model` over a slot cache; the model's parameters are its storage (and, where
    the kernels multiply the layers themselves, packed copies of its layers' weights: `packed=False` keeps sgemm_'s
    multiplies, with F.linear's bits)."""

    def __init__(self, model: Any, *, kernels: bool = True, packed: bool = True) -> None:
        problem = lean_problem(model)
        if problem is not None:
            raise ValueError(f"LeanForward: {problem}")
        inner, config = model.model, model.config
        attn = inner.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = int(attn.head_dim)
        self.scale = float(attn.scaling)
        self.intermediate = int(inner.layers[0].mlp.gate_proj.weight.shape[0])
        self.eps = float(inner.norm.variance_epsilon)
        self.vocab = int(model.lm_head.weight.shape[0])
        self.embed, self.norm, self.lm_head = inner.embed_tokens.weight, inner.norm.weight, model.lm_head.weight
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self._softmax_dtype = torch.promote_types(self.dtype, torch.float32)  # bf16's in float32, as HF's
        self._rotary = inner.rotary_emb
        self.layers = []
        for layer in inner.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv, qkv_bias = _fuse([a.q_proj, a.k_proj, a.v_proj])
            gate_up, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
            self.layers.append(_Layer(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qkv,
                                      qkv_bias, a.o_proj.weight, _bias(a.o_proj), gate_up, gate_up_bias,
                                      mlp.down_proj.weight, _bias(mlp.down_proj)))
        # a float32 model on the CPU decodes with the C kernels when this machine can build them
        on_cpu32 = self.device.type == "cpu" and self.dtype == torch.float32
        self.kernels = cpu_kernels.load() if kernels and on_cpu32 else None
        # ... and with the layer loop in C too when torch's sgemm_ can be called from there (its weights' addresses
        # stay valid: new weights are copied into the same storage)
        tables = [(a.in_norm, a.post_norm, a.qkv, a.qkv_bias, a.o, a.o_bias, a.gate_up, a.gate_up_bias, a.down,
                   a.down_bias) for a in self.layers]
        dense = all(t is None or t.is_contiguous() for table in tables for t in table)
        self._gemm = cpu_kernels.torch_sgemm() if self.kernels is not None and dense else None
        # where the kernels multiply the layers themselves (AVX-512), each layer's four weights packed for them
        # (refresh() packs them again after new weights), else read as they are by sgemm_
        self._packed: list[list[Tensor]] = []
        if packed and self._gemm is not None and self.kernels is not None and self.kernels.panel:
            self._packed = [[self.kernels.pack_weight(w) for w in (a.qkv, a.o, a.gate_up, a.down)] for a in self.layers]
        if self._gemm is not None:  # the weights' addresses, ten a layer (0: no bias), for decode_layers
            self._addresses = torch.tensor([[0 if t is None else t.data_ptr() for t in table] for table in tables],
                                           dtype=torch.int64)
            for i, copies in enumerate(self._packed):
                self._addresses[i, [2, 4, 6, 8]] = torch.tensor([w.data_ptr() for w in copies])
        self.cos = self.sin = torch.zeros(0, self.head_dim, dtype=self.dtype, device=self.device)
        self._index = torch.zeros(0, dtype=torch.int64, device=self.device)  # 0, 1, 2, ... for masks and rows

    def refresh(self) -> None:
        """After new weights landed in the model's storage: the packed copies the kernels multiply by, again."""
        if not self._packed:
            return
        for layer, packed in zip(self.layers, self._packed, strict=True):
            for weight, into in zip((layer.qkv, layer.o, layer.gate_up, layer.down), packed, strict=True):
                self.kernels.pack_weight(weight, into)  # type: ignore[union-attr]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def reserve(self, columns: int) -> None:
        """Rotary tables (from the model's own module, so any static rope kind rounds as HF's) for positions
        0..columns-1, and the index row; grown, never shrunk. Call it before capturing anything that reads them."""
        if self.cos.shape[0] >= columns:
            return
        self._index = torch.arange(columns, device=self.device)
        dummy = torch.zeros(0, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            cos, sin = self._rotary(dummy, self._index[None])
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()

    # ---- one token a slot -------------------------------------------------------------------------------------

    def decode(self, kv: Tensor, tokens: Tensor, positions: Tensor, width: int,
               shared: cpu_kernels.Shared | None = None, slots: Tensor | None = None) -> Tensor:
        """Logits [n, V] after feeding tokens[i] (int64 [n]) at positions[i] of slot i (of slots[i] with `slots`:
        the running slots only, when free ones sit among them). Writes each token's K/V into its slot at its
        position; the slot attends over its columns 0..positions[i], read from the first `width` columns (width >
        every position). `shared` says which slots hold the same prompt: the C kernels read it once a group (the
        torch ops read each slot's own copy: the same values)."""
        if self.kernels is not None:
            return F.linear(self._decode_kernels(kv, tokens, positions, width, shared, slots), self.lm_head)
        n, heads, kv_heads, d = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        rows = self._index[:n] if slots is None else slots
        read = slice(0, n) if slots is None else slots  # attention reads a view of slots 0..n-1, else a copy
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [n, 1, D]
        hidden = self._index[:width] > positions[:, None]  # [n, width]: columns past each slot's token
        bias = torch.zeros(n, 1, width, dtype=self.dtype, device=self.device).masked_fill_(hidden[:, None], -torch.inf)
        qk_dim = (heads + kv_heads) * d
        x = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.in_norm, self.eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            qk = rotate(qkv[:, :qk_dim].view(n, heads + kv_heads, d), cos, sin)
            keys, values = kv[i, 0], kv[i, 1]  # [S, KVH, C, D]
            keys[rows, :, positions] = qk[:, heads:]
            values[rows, :, positions] = qkv[:, qk_dim:].view(n, kv_heads, d)
            attn = self._attend(qk[:, :heads], keys[read, :, :width], values[read, :, :width], bias)
            x = x + F.linear(attn, layer.o, layer.o_bias)
            x = x + self._mlp(rms_norm(x, layer.post_norm, self.eps), layer)
        return F.linear(rms_norm(x, self.norm, self.eps), self.lm_head)

    @property
    def steps_in_c(self) -> bool:
        """Whether `decode_step` can run: the C kernels with the layer loop in C, over a dense embedding and head."""
        return self._gemm is not None and self.embed.is_contiguous() and self.lm_head.is_contiguous()

    def decode_step(self, kv: Tensor, state: cpu_kernels.SlotState, n: int, width: int, temperature: float,
                    shared: cpu_kernels.Shared | None = None, slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`decode` of each slot's pending token at its position (`state`: SlotKV's), the draw at top_p = 1 at the
        slot's next uniform, and the state's advance, in one C call: the tokens and their log-probs. The same bits
        as `decode` then `sample_rows` then DecodeStep's update (a test holds it to that)."""
        if not self.steps_in_c:
            raise ValueError("LeanForward.decode_step needs the C kernels with the layer loop in C (steps_in_c)")
        _within(kv, width)
        assert self.kernels is not None and self._gemm is not None
        return self.kernels.decode_step(self._gemm, self._addresses, (self.layers[0].in_norm, self.norm), self.embed,
                                        self.lm_head, kv, state, self.cos, self.sin, n, width, temperature,
                                        heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                                        intermediate=self.intermediate, scale=self.scale, eps=self.eps,
                                        shared=shared, slots=slots, packed=bool(self._packed))

    def _decode_kernels(self, kv: Tensor, tokens: Tensor, positions: Tensor, width: int,
                        shared: cpu_kernels.Shared | None, slots: Tensor | None = None,
                        kept: Tensor | None = None) -> Tensor:
        """`decode` with the C kernels: the layer loop in one C call when torch's sgemm_ is reachable, else per
        layer four matrix multiplies by torch and four kernel calls (see decode/csrc/). With
        `slots`, row i is a token of slot slots[i] (a prefill: a slot's rows in the order of their positions; a
        decode step: the running slots). The final norm's output of every row, or of the rows `kept` (increasing:
        a prefill's last token a prompt, whose logits alone are read) in their order."""
        _within(kv, width)
        k, n = self.kernels, tokens.shape[0]
        assert k is not None
        x = F.embedding(tokens, self.embed)  # the residual stream, updated in place
        h = torch.empty_like(x)
        k.add_rms_norm(x, None, self.layers[0].in_norm, h, self.eps)
        if self._gemm is not None:
            wanted = _kept_rows(kept, n)
            k.decode_layers(self._gemm, self._addresses, self.norm, x, h, kv, self.cos, self.sin, positions, width,
                            heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                            intermediate=self.intermediate, scale=self.scale, eps=self.eps, shared=shared, slots=slots,
                            kept=wanted, packed=bool(self._packed))
            if kept is None:
                return h
            return h[: kept.shape[0]] if wanted is not None else h[kept]
        attn = torch.empty(n, self.heads * self.head_dim)
        act = torch.empty(n, self.intermediate)
        scratch = torch.empty(self.heads // self.kv_heads * width)
        for i, layer in enumerate(self.layers):
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            k.rope_attend(qkv, self.cos, self.sin, positions, kv[i, 0], kv[i, 1], attn, scratch, self.heads,
                          self.kv_heads, self.head_dim, self.scale, shared, slots)
            k.add_rms_norm(x, F.linear(attn, layer.o, layer.o_bias), layer.post_norm, h, self.eps)
            k.silu_mul(F.linear(h, layer.gate_up, layer.gate_up_bias), act)
            following = self.layers[i + 1].in_norm if i + 1 < len(self.layers) else self.norm
            k.add_rms_norm(x, F.linear(act, layer.down, layer.down_bias), following, h, self.eps)
        return h if kept is None else h[kept]

    def _attend(self, q: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """Grouped-query attention of one query a slot without copying the cache: q [n, H, D] as [n·KVH, G, D]
        against each slot's keys [KVH, W, D]; bias [n, 1, W] (0 or -inf). Returns [n, H·D]."""
        n, width = q.shape[0], keys.shape[2]
        group, d = self.heads // self.kv_heads, self.head_dim
        scores = torch.bmm((q * self.scale).reshape(n * self.kv_heads, group, d),
                           keys.reshape(n * self.kv_heads, width, d).transpose(1, 2))
        probs = torch.softmax(scores.view(n, self.heads, width) + bias, dim=-1, dtype=self._softmax_dtype).to(q.dtype)
        out = torch.bmm(probs.view(n * self.kv_heads, group, width), values.reshape(n * self.kv_heads, width, d))
        return out.view(n, self.heads * d)

    def _mlp(self, h: Tensor, layer: _Layer) -> Tensor:
        gate_up = F.linear(h, layer.gate_up, layer.gate_up_bias)
        return F.linear(F.silu(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :], layer.down,
                        layer.down_bias)

    # ---- a chunk of tokens a slot -----------------------------------------------------------------------------

    def extend(self, kv: Tensor, slots: Tensor, ids: Tensor, starts: Tensor, lengths: Tensor) -> Tensor:
        """Logits [m, V] after each slot's last real token: row r feeds ids[r, :lengths[r]] (right-padded [m, T])
        at positions starts[r]... of slot slots[r], over what the slot holds before starts[r]. The padding writes
        K/V past each row's end (the cache needs max(starts) + T columns); nothing reads it."""
        m, width = ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        positions = starts[:, None] + self._index[:width]  # [m, T]
        if self.kernels is not None:  # the real tokens as rows of their slots, no padding
            real = self._index[:width] < lengths[:, None]
            h = self._decode_kernels(kv, ids[real], positions[real], int(positions.max()) + 1, None,
                                     slots[:, None].expand(m, width)[real], kept=lengths.cumsum(0) - 1)
            return F.linear(h, self.lm_head)
        columns = int(starts.max()) + width
        visible = self._index[:columns] <= positions[:, :, None]  # [m, T, columns]: causal within the slot
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [m, T, 1, D]
        qk_dim = (heads + kv_heads) * d
        x = F.embedding(ids, self.embed)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.in_norm, self.eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            qk = rotate(qkv[..., :qk_dim].view(m, width, heads + kv_heads, d), cos, sin)
            keys, values = kv[i, 0], kv[i, 1]
            keys[slots[:, None], :, positions] = qk[:, :, heads:]
            values[slots[:, None], :, positions] = qkv[..., qk_dim:].view(m, width, kv_heads, d)
            group = heads // kv_heads
            k = keys[slots, :, :columns].repeat_interleave(group, dim=1)  # [m, H, columns, D]
            v = values[slots, :, :columns].repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(qk[:, :, :heads].transpose(1, 2), k, v, attn_mask=visible[:, None],
                                                  scale=self.scale)
            x = x + F.linear(attn.transpose(1, 2).reshape(m, width, heads * d), layer.o, layer.o_bias)
            x = x + self._mlp(rms_norm(x, layer.post_norm, self.eps), layer)
        last = x[self._index[:m], lengths - 1]
        return F.linear(rms_norm(last, self.norm, self.eps), self.lm_head)
