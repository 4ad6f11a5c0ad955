"""Training a critic: the torch engine over a value model, whose per-token output is a value.

Everything else (token-budgeted micro-batches, the token-weighted mean, AdamW, the lr schedule,
checkpoints) is the policy engine's, so a critic trains and resumes exactly as a policy does.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from areal.engines.training.torch_train import TorchTrainEngine


class ValueTrainEngine(TorchTrainEngine):
    """`loss_fn` receives V(s_t) for each output token t: the value of the state just before it."""

    def _score(self, flat: Tensor, targets: Tensor, entropy: bool) -> tuple[Tensor, None]:
        return flat.squeeze(-1).float(), None  # the head's one output per position; no tokens, no entropy

    def sequence_values(self, sequences: Sequence[Tensor]) -> list[Tensor]:
        """For each sequence, V of the state before each token t = 1..L-1: [L-1] float32, no gradient."""
        return self.sequence_logprobs(sequences)  # the same positions; `_score` makes them values
