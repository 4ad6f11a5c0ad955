"""One episode's trajectory: every token it put before the policy, in order, and who wrote each.

An episode's context grows: each turn the policy reads everything so far and its sampled ids are
appended exactly as sampled (the one exception: what it sampled after a reply's text that the
agent's next request does not hold, a stop string not sent back or an <eos> that text cannot hold, is
taken back before the next turn, so the policy never reads what the agent did not send); what the
environment adds between turns (a tool's output, a user message, the closing text a chat template
writes after a reply) is tokenised on its own and appended. Nothing is ever re-tokenised, so the ids
the trainer sees are the ids the policy read and wrote, and the log-probs recorded while sampling
are of exactly those tokens in exactly that context.

Per token: the loss mask (1: the policy sampled it; 0: the environment wrote it), the behaviour
log-prob (0 for environment tokens) and the policy version (the version that sampled a model token;
for an environment token the version the engine held when it was appended, so `min(versions)`
stays the episode's staleness record). The prompt is everything before the first sampled token;
environment tokens after the last sampled one are dropped (nothing trained reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Trajectory:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 sampled by the policy, 0 written by the environment
    logprobs: list[float] = field(default_factory=list)  # log π_behav of sampled tokens; 0.0 elsewhere
    versions: list[int] = field(default_factory=list)
    turns: int = 0  # completions sampled

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first sampled one (all of them before the first turn)."""
        return next((i for i, m in enumerate(self.mask) if m), len(self.ids))

    def add_environment(self, ids: Sequence[int], version: int) -> None:
        self.ids += [int(i) for i in ids]
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [int(version)] * len(ids)

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        if not len(ids) == len(logprobs) == len(versions):
            raise ValueError(f"a completion of {len(ids)} ids came with {len(logprobs)} log-probs and "
                             f"{len(versions)} versions")
        self.ids += [int(i) for i in ids]
        self.mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.versions += [int(v) for v in versions]
        self.turns += 1

    def retract(self, n: int) -> None:
        """Take back the last `n` ids, which the policy sampled at the end of its last turn: what the agent's next
        request does not hold (a stop string, an <eos>; nodes/episodes/conversation.py), so the context reads what
        the agent sent."""
        if n == 0:
            return
        if not 0 < n <= len(self.ids) or not all(self.mask[-n:]):
            raise ValueError(f"only ids the policy sampled last can be taken back; asked for the last {n} of "
                             f"{len(self.ids)}")
        del self.ids[-n:], self.mask[-n:], self.logprobs[-n:], self.versions[-n:]

    def sample_fields(self) -> dict[str, Tensor]:
        """prompt_ids, output_ids, loss_mask, behav_logp and versions of this one sample (1-D tensors)."""
        start = self.prompt_len
        end = max((i + 1 for i, m in enumerate(self.mask) if m), default=start)  # trailing environment: dropped
        return {
            "prompt_ids": torch.tensor(self.ids[:start], dtype=torch.int64),
            "output_ids": torch.tensor(self.ids[start:end], dtype=torch.int64),
            "loss_mask": torch.tensor(self.mask[start:end], dtype=torch.int32),
            "behav_logp": torch.tensor(self.logprobs[start:end], dtype=torch.float32),
            "versions": torch.tensor(self.versions[start:end], dtype=torch.int32),
        }
