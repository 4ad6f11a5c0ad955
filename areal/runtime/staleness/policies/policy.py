"""What every staleness policy is made of, and the one record each re-checks its guarantee on.

A `Policy` is a row of the table in `__init__.py`: its name, what η bounds (in words, for the
gate's label and the run summary), the order its trainer takes groups in, whether a group that
can no longer be trained within η is dropped or re-queued in its generator, and whether its
trainer masks the tokens older than η. Its `check` reads a `TrainedStep`: the version stamped on
every output token by the generator that sampled it, the loss mask the update reads, and each
group's admission record (and its generator's stamp). Nothing in it is a timing, so a broken
guarantee is named on the step that broke it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch import Tensor

from areal.graph.batch import Ragged
from areal.graph.meta import GroupMeta


@dataclass(frozen=True)
class TrainedStep:
    """One trainer step as recorded: each trained sample's token versions and loss mask, each group's meta.

    Tokens stay packed (one tensor for the whole step, as the update reads them): a step of 32 generators holds
    ~500k of them, and a loop over its samples cost the trainer 70-150 ms of every step (bench_policy_check.py)."""

    step: int  # the version the step trains: a token sampled by version v is step - v versions behind
    staleness: int  # η
    batch_size: int  # B
    versions: Ragged  # per sample: [T] the version that sampled each output token
    masks: Tensor  # [N] bool, packed like `versions`: True where the loss reads the token
    group_ids: list[int]  # per sample: its group
    groups: list[GroupMeta]  # the groups the step trains, as the controller admitted them

    def _per_sample(self, reduce: np.ufunc, empty: int) -> Tensor:
        """[S] `reduce` over each sample's token versions, `empty` for a sample with none (one reduceat pass)."""
        out = np.full(len(self.versions), empty, dtype=np.int64)
        lengths = self.versions.lengths.numpy()
        some = lengths > 0
        if some.any():
            starts = self.versions.offsets[:-1].numpy()[some]
            out[some] = reduce.reduceat(self.versions.values.numpy(), starts)
        return torch.from_numpy(out)

    @cached_property
    def oldest(self) -> Tensor:
        """[S] each sample's oldest token's version (the step's own for a sample with no tokens)."""
        return self._per_sample(np.minimum, self.step)

    @cached_property
    def newest(self) -> Tensor:
        """[S] each sample's newest token's version (-1 for a sample with no tokens)."""
        return self._per_sample(np.maximum, -1)

    def lags(self) -> list[int]:
        """Per sample: how many versions behind its oldest token is (0 for a sample with no tokens)."""
        return (self.step - self.oldest).tolist()

    def histogram(self) -> Counter[int]:
        return Counter(self.lags())

    def stale_trained_tokens(self) -> int:
        """Tokens the loss reads that are more than η versions behind."""
        return int(((self.versions.values < self.step - self.staleness) & self.masks).sum())


Check = Callable[[TrainedStep], str | None]  # the first broken promise of a step, in words; None when kept


def versions(n: int) -> str:
    """"1 version", "2 versions": a count of policy versions in words."""
    return f"{n} version" if n == 1 else f"{n} versions"


@dataclass(frozen=True)
class Policy:
    name: str
    bound: str  # what η bounds, in words, with {versions} for η: the gate's label and the run summary's staleness line
    check: Check
    in_order: bool = False  # the trainer takes groups in admission order (else: the oldest finished first)
    drops: bool = False  # a group with a token older than η at the next step is aborted, or dropped unread
    masks: bool = False  # the trainer gives loss mask 0 to every token older than η
    recycles: bool = False  # a generator re-queues a group stamped more than η versions ago, with its output

    def bound_at(self, staleness: int) -> str:
        """What this policy bounds at η = `staleness`, in words."""
        return self.bound.format(versions=versions(staleness))

    def describe(self, staleness: int) -> str:
        return f"{self.name}: {self.bound_at(staleness)}"

    def pick(self, waiting: Mapping[int, int], next_group: int, consumed: set[int], per_step: int) -> list[int]:
        """The groups of the next step (`waiting`: arrived group -> its samples), empty ones included; [] while
        it cannot be formed. `consumed`: groups above `next_group` an earlier step took."""
        if self.in_order:
            return in_admission_order(waiting, next_group, consumed, per_step)
        return oldest_finished(waiting, per_step)


def in_admission_order(waiting: Mapping[int, int], next_group: int, consumed: set[int], per_step: int) -> list[int]:
    """From `next_group` on, skipping the consumed, up to the `per_step`-th non-empty group; [] when one of them
    has not arrived. Empty groups in between are consumed with the step."""
    step: list[int] = []
    filled = 0
    group = next_group
    while filled < per_step:
        if group in consumed:
            group += 1
            continue
        if group not in waiting:
            return []
        step.append(group)
        filled += bool(waiting[group])
        group += 1
    return step


def oldest_finished(waiting: Mapping[int, int], per_step: int) -> list[int]:
    """The `per_step` lowest-numbered non-empty groups that have arrived, with every empty one that has, in
    admission order; [] while fewer have arrived. A group still generating never holds a step back."""
    full = sorted(g for g, size in waiting.items() if size)
    if len(full) < per_step:
        return []
    return sorted(full[:per_step] + [g for g, size in waiting.items() if not size])
