"""trainer.truncated=mask: every token of an output cut at max_new_tokens leaves the loss, beside an episode's own
mask and under the token policy's, and each mask counts only what it took out itself."""

from __future__ import annotations

import torch

from areal.graph.batch import Batch, Ragged
from areal.runtime.staleness.policies.enforce import with_policy_mask
from areal.runtime.staleness.policies.loss_mask import with_truncated_masked


def view(versions: list[list[int]], truncated: list[int], loss_mask: list[list[int]] | None = None) -> Batch:
    fields = {"versions": Ragged.from_rows([torch.tensor(v, dtype=torch.int32) for v in versions]),
              "truncated": torch.tensor(truncated)}
    if loss_mask is not None:
        fields["loss_mask"] = Ragged.from_rows([torch.tensor(m, dtype=torch.int32) for m in loss_mask])
    return Batch(fields)


def rows(batch: Batch) -> list[list[int]]:
    return [m.tolist() for m in batch["loss_mask"].rows()]


def test_a_cut_output_leaves_the_loss_whole_and_the_others_keep_their_own_mask():
    masked, cut = with_truncated_masked(view([[3, 3, 4], [], [5, 6], [6]], [0, 1, 1, 0],
                                             loss_mask=[[1, 0, 1], [], [1, 1], [1]]))
    assert rows(masked) == [[1, 0, 1], [], [0, 0], [1]] and cut == 2
    masked, cut = with_truncated_masked(view([[3, 4], [4]], [0, 0]))  # none cut, no mask brought: all trained
    assert rows(masked) == [[1, 1], [1]] and cut == 0


def test_the_token_policy_counts_only_the_old_tokens_a_cut_output_had_not_taken_out_already():
    truncated, _ = with_truncated_masked(view([[3, 3, 6], [3, 6]], [1, 0]))
    masked, count = with_policy_mask(truncated, 6, 2)
    assert rows(masked) == [[0, 0, 0], [0, 1]] and count == 1

