"""A pool's inputs joined per group: the batch it runs on once every input channel has brought its part.

Every pool sends every group it finishes on every output channel, possibly empty (its samples
failed or were filtered), so a joining pool always gets a part from each input in the end. The
join keys parts by group (a held-out round by its first group), merges them when the last one
comes, and keeps only the samples every sample-level part still holds (a sample missing from one
branch was counted failed or filtered where it went missing). Group-level parts (task fields
from the source, one row per prompt) are spread over their group's samples, and a group missing
from one takes its samples with it. Fields are named by
their producer, so parts never collide; `sample_id` and `group_id` come on every part.

Bounded: a channel that is `capacity` groups ahead of the others is not read until they catch
up, so its sender meets its high-water mark (back-pressure); unless every channel is, each on
groups the others have not brought (several generators deal groups to two paths in two orders):
then all are read, or none would ever be, and what is in flight upstream bounds them. Keys below
the trainers' frontier are dropped (`forget_below`): a part re-issued after a crash whose twin was
already joined would otherwise wait forever.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal.graph.batch import Batch, Field
from areal.graph.meta import GroupMeta


class Join:
    def __init__(self, inputs: Sequence[str], levels: dict[str, str], capacity: int) -> None:
        """`inputs`: the pools feeding this one; `levels`: each one's "group" or "sample"."""
        self.inputs = list(inputs)
        self.levels = levels
        self.capacity = capacity
        self._parts: dict[int, dict[str, tuple[Batch, GroupMeta]]] = {}

    def add(self, src: str, batch: Batch, meta: GroupMeta) -> tuple[Batch, GroupMeta] | None:
        """Take `src`'s part of a group; return the joined batch once every input has brought its own."""
        parts = self._parts.setdefault(meta.group, {})
        parts.setdefault(src, (batch, meta))  # a re-issued copy of a part already here adds nothing
        if len(parts) < len(self.inputs):
            return None
        del self._parts[meta.group]
        metas = [parts[s][1] for s in self.inputs]
        # the meta of a part that came through generation: it names the generator (a source's part does not)
        return merge({s: parts[s][0] for s in self.inputs}, self.levels), next(
            (m for m in metas if m.sampled_by is not None), metas[0])

    def ahead(self, src: str) -> bool:
        """Whether `src` is `capacity` groups ahead of another input, which is not: read it no more until that one
        catches up."""
        return self._holds_capacity(src) and not all(map(self._holds_capacity, self.inputs))

    def _holds_capacity(self, src: str) -> bool:
        return sum(1 for parts in self._parts.values() if src in parts) >= self.capacity

    def forget_below(self, group: int) -> None:
        """Drop training groups below `group`: every trainer has consumed them."""
        for key in [k for k in self._parts if 0 <= k < group]:
            del self._parts[key]

    def waiting(self) -> int:
        return len(self._parts)


def merge(parts: dict[str, Batch], levels: dict[str, str]) -> Batch:
    """One batch from the parts of one group (see the module docstring)."""
    samples = [b for src, b in parts.items() if levels[src] == "sample"]
    groups = [b for src, b in parts.items() if levels[src] == "group"]
    key = "sample_id" if samples else "group_id"
    base = (samples or groups)[0]
    keep = [int(i) for i in base[key].tolist()]
    for other in (samples or groups)[1:]:
        present = set(other[key].tolist())
        keep = [i for i in keep if i in present]
    if samples:  # a group a group-level part lacks (its row failed there) takes its samples with it
        group_of = dict(zip(base["sample_id"].tolist(), base["group_id"].tolist()))
        for b in groups:
            present = set(b["group_id"].tolist())
            keep = [i for i in keep if group_of[i] in present]
    fields: dict[str, Field] = {}
    for b in samples or groups:
        fields.update(_rows_of(b, key, keep))
    if samples:
        group_of = fields["group_id"].tolist()  # type: ignore[union-attr]
        for b in groups:
            fields.update({name: value for name, value in _rows_of(b, "group_id", group_of).items()
                           if name not in ("sample_id", "group_id")})
    return Batch(fields)


def _rows_of(batch: Batch, key: str, wanted: list[int]) -> dict[str, Field]:
    """`batch`'s rows whose `key` is each of `wanted`, in that order (a key may repeat: a group's samples)."""
    index = {int(k): row for row, k in enumerate(batch[key].tolist())}  # type: ignore[union-attr]
    rows = [index[k] for k in wanted]
    if rows == list(range(batch.size)):
        return dict(batch)
    picked = batch.select(rows)
    return dict(picked)


def empty_like(batch: Batch) -> Batch:
    """The same fields with no rows: what a pool sends for a group none of whose samples are left."""
    return batch.select([])


def expand(batch: Batch, group_ids: torch.Tensor) -> dict[str, Field]:
    """A group-level batch's fields (ids aside), one row per entry of `group_ids` (each sample's group)."""
    return {name: value for name, value in _rows_of(batch, "group_id", [int(g) for g in group_ids.tolist()]).items()
            if name not in ("sample_id", "group_id")}


