"""The trainer's rows with a prompt shared by a group computed once: the group's prompt, then each member's own
tokens, in one row whose attention mask lets each member see the prompt and itself only.

A GRPO batch holds each prompt `group_size` times. As plain rows the trainer runs the prompt's forward and
backward once per member; here once per group. Each member's tokens see the same prompt states, at the same
positions, as in a row of their own, so the log-probs and the gradients are the plain rows' up to rounding (the
tests hold them to float64 agreement). On one step of the default recipe (benchmarks/bench_microbatches.py) the
positions fall from 8252 to 2223 (sampled programs often share their first tokens too) and the trainer's two
passes take 0.36x the time.

A unit is (shared length, members): members share their first `shared` tokens; a sequence no other shares
enough of stands alone as (its length, [it]), a plain row. Only the token ids are read to find
units, so the compute-logprob pass (which has no prompt lengths) and the update find the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from areal.kernels.packing import PackingError

Unit = tuple[int, list[int]]  # (shared length, members): one row; a lone sequence is (its length, [it])

MIN_SHARED_TOKENS = 8  # a shorter common prefix (a template's opening, not a prompt) is left alone
# a row's masked attention runs dense over its positions squared, so it grows faster than a longer row saves; the
# cap is not tuned: a group of the default recipe (8 x up to 48 tokens after its prompt) fits in one row
MAX_ROW_TOKENS = 1024
# families whose Hugging Face forward applies a 4D attention mask and position ids as given
FAMILIES = ("qwen2", "llama")
MASKED_ATTENTION = ("sdpa", "eager")  # flash attention ignores a 4D mask: such a model keeps plain rows


def shares_prefixes(model: object) -> bool:
    """Whether `model`'s forward runs a unit's row exactly (its family and attention take the mask as given)."""
    config = getattr(model, "config", None)
    return (getattr(config, "model_type", None) in FAMILIES
            and getattr(config, "_attn_implementation", None) in MASKED_ATTENTION)


def unit_length(sequences: Sequence[Tensor], unit: Unit) -> int:
    shared, of = unit
    return shared + sum(len(sequences[i]) - shared for i in of)


def row_positions(sequences: Sequence[Tensor], microbatches: Sequence[Sequence[Unit]]) -> int:
    """The positions the rows of `microbatches` hold for `sequences` (a shared prefix once), before padding."""
    return sum(unit_length(sequences, unit) for units in microbatches for unit in units)


def members(units: Sequence[Unit]) -> list[int]:
    """The sequences of `units`, row by row: the order a micro-batch's log-probs come in."""
    return [i for _, of in units for i in of]


def prefix_units(sequences: Sequence[Tensor], index: Sequence[int], max_tokens: int) -> list[Unit]:
    """The sequences of `index` as units, each at most `max_tokens` positions: runs of the sorted sequences whose
    common prefix is at least MIN_SHARED_TOKENS long (and leaves each member a token of its own to predict from
    it). A run takes the next sequence only if the row then holds fewer positions than the two apart (so groups
    whose prompts share only a template stay apart) and stays within the budget and MAX_ROW_TOKENS. Every index
    appears once. Raises PackingError for a sequence over the budget on its own."""
    ids = {i: torch.as_tensor(sequences[i]) for i in index}
    for i, seq in ids.items():
        if len(seq) > max_tokens:
            raise PackingError(i, len(seq), max_tokens)
    order = sorted(index, key=lambda i: (ids[i].tolist(), i))  # a shared prefix's sequences side by side
    units: list[Unit] = []
    run: list[int] = []
    shared = tokens = 0  # the run's common prefix (a lone sequence's is its whole length), its members' lengths
    for i in order:
        if run:
            common = min(shared, _common(ids[run[-1]], ids[i]))
            # joining must save positions: i's first `common` tokens are not repeated, while every member but one
            # now holds shared - common more of its own (the row's positions fall by n common - (n - 1) shared)
            row = tokens + len(ids[i]) - len(run) * common  # the joined row's positions: its prefix held once
            if (common >= MIN_SHARED_TOKENS and len(run) * common > (len(run) - 1) * shared
                    and row <= min(max_tokens, MAX_ROW_TOKENS)):
                run, shared, tokens = [*run, i], common, tokens + len(ids[i])
                continue
            units.append((shared, run))
        run, shared, tokens = [i], len(ids[i]), len(ids[i])
    if run:
        units.append((shared, run))
    return units


def _common(a: Tensor, b: Tensor) -> int:
    """Their common prefix, short of the shorter one's last token: every member keeps a token of its own."""
    n = min(len(a), len(b)) - 1
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else max(n, 0)


@dataclass(frozen=True)
class UnitRows:
    """One forward's input for some units (a row each, right-padded) and where each member's predictions sit."""

    ids: Tensor  # [rows, width] int64
    positions: Tensor | None  # [rows, width] int64; None: every row is a plain sequence (default positions)
    mask: Tensor | None  # [rows, 1, width, width] additive, in the model's dtype; None: plain causal rows
    predict: dict[int, Tensor]  # by sequence: the flat positions (row * width + column) of the logits predicting it


def unit_rows(sequences: Sequence[Tensor], units: Sequence[Unit], starts: dict[int, int],
              dtype: torch.dtype) -> UnitRows:
    """Rows for `units`; `predict[i]`: the flat logit positions that predict tokens starts[i]..L_i-1 of member i."""
    width = max(unit_length(sequences, u) for u in units)
    ids = torch.zeros(len(units), width, dtype=torch.int64)
    positions = torch.zeros(len(units), width, dtype=torch.int64)
    segment = torch.full((len(units), width), -2, dtype=torch.int64)  # -1: the shared part; -2: padding
    predict: dict[int, Tensor] = {}
    for r, (shared, of) in enumerate(units):
        first = sequences[of[0]]
        ids[r, :shared] = torch.as_tensor(first[:shared])
        positions[r, :shared] = torch.arange(shared)
        segment[r, :shared] = -1
        at = shared
        for k, i in enumerate(of):
            sequence, own = sequences[i], len(sequences[i]) - shared
            ids[r, at : at + own] = torch.as_tensor(sequence[shared:])
            positions[r, at : at + own] = torch.arange(shared, shared + own)
            segment[r, at : at + own] = k
            # the logits at position p predict token p + 1: p < shared in the shared part, else in the member's own
            p = torch.arange(starts[i] - 1, len(sequence) - 1)
            predict[i] = r * width + torch.where(p < shared, p, at + p - shared)
            at += own
        positions[r, at:] = torch.arange(width - at) + shared  # padding: seen by no real token
    if all(len(of) == 1 for _, of in units):
        return UnitRows(ids, None, None, predict)
    query, key = torch.arange(width)[:, None], torch.arange(width)[None, :]
    seen = (key <= query) & ((segment[:, None, :] == -1) | (segment[:, None, :] == segment[:, :, None]))
    seen |= torch.eye(width, dtype=torch.bool)  # a padding position sees itself: no row of -inf
    mask = torch.zeros(len(units), 1, width, width, dtype=dtype).masked_fill_(~seen[:, None], torch.finfo(dtype).min)
    return UnitRows(ids, positions, mask, predict)
