"""What the emulated engines share: a device profile, a clock that pays modelled time, and fake tokens.

An emulated engine computes nothing. It charges each piece of work the time a real device would
take (a decode step of b sequences over C cached tokens, a prefill, a forward or training pass over
N tokens, a weight transfer), from a small profile file (`profiles/*.json`: one device and model,
each figure with where it comes from), and waits that long, scaled by `emulation.time_scale`.
Waiting is the point: the runtime around it then runs exactly as it would beside a GPU, with the
host CPU free for the runtime's own work, so the runtime's overhead and scaling can be measured
with dozens of "devices" on a laptop.

What the engines produce is valid for the runtime, not for learning: token ids of a byte-level
tokenizer (`ByteTokenizer`), output lengths from a seeded long-tailed distribution
(`OutputLengths`), and log-probabilities that are a fixed function of (token, position)
(`token_logprobs`), so π_behav, π_prox and π_θ agree exactly and the PPO loss runs on real numbers.

Not here: modelling memory (KV-cache capacity, preemption), tensor parallelism, or the network
between machines beyond a per-transfer time.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from areal.errors import ConfigError

PROFILES = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "h100-qwen2.5-1.5b"


@dataclass(frozen=True)
class DeviceProfile:
    """Modelled seconds of one device's work; `sources` says where each figure comes from."""

    name: str
    decode_step_s: float  # one decode step, whatever the batch: reading the weights, host work
    decode_per_seq_s: float  # each running sequence's compute in a decode step
    decode_per_context_token_s: float  # each cached token attention reads in a decode step
    prefill_step_s: float
    prefill_per_token_s: float  # prompt (or re-read context) tokens of a prefill
    logprob_step_s: float
    logprob_per_token_s: float  # the proximal forward pass
    train_step_s: float  # the optimizer step and fixed launches of one update
    train_per_token_s: float  # forward + backward of one trained token
    train_sync_s: float  # the gradient reduction data-parallel ranks do not hide, per update
    weights_publish_s: float  # the trainer's side of publishing a version
    weights_load_s: float  # a generator's side of taking a version (the re-prefill is charged apart)
    device: str = ""
    model: str = ""
    sources: tuple[tuple[str, str], ...] = ()

    @classmethod
    def load(cls, spec: str) -> DeviceProfile:
        """A profile by name (`profiles/NAME.json`) or a path to a JSON file of the same keys."""
        path = Path(spec) if spec.endswith(".json") or "/" in spec else PROFILES / f"{spec}.json"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.json")))
            raise ConfigError(f"emulation.profile={spec!r}: no such profile file ({path}); built-in: {known}")
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except ValueError as err:
            raise ConfigError(f"emulation.profile: {path} is not JSON: {err}") from None
        names = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(raw) - names), sorted(n for n in names - set(raw) if n not in _OPTIONAL)
        if unknown or missing:
            raise ConfigError(f"emulation.profile: {path}: " + "; ".join(
                ([f"unknown keys {unknown}"] if unknown else []) + ([f"missing keys {missing}"] if missing else [])))
        timings = {k: v for k, v in raw.items() if k.endswith("_s")}
        bad = [k for k, v in timings.items() if not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v)]
        if bad:
            raise ConfigError(f"emulation.profile: {path}: {', '.join(bad)} must be finite numbers >= 0 (seconds)")
        return cls(**{**raw, "sources": tuple((str(k), str(v)) for k, v in raw.get("sources", {}).items())})

    # -- the cost model ------------------------------------------------------------------------

    def decode_s(self, batch: int, context: int, steps: int = 1) -> float:
        """`steps` decode steps of `batch` sequences holding `context` cached tokens before the first
        (each step adds one token per sequence, so step j reads context + j·batch)."""
        per_step = self.decode_step_s + self.decode_per_seq_s * batch
        reads = context * steps + batch * steps * (steps - 1) / 2
        return per_step * steps + self.decode_per_context_token_s * reads

    def decode_steps_within(self, batch: int, context: int, budget_s: float) -> int:
        """The most decode steps whose `decode_s` fits in `budget_s` (0 when not even one does)."""
        if math.isinf(budget_s):
            return 1 << 30
        a = self.decode_step_s + self.decode_per_seq_s * batch + self.decode_per_context_token_s * context
        q = self.decode_per_context_token_s * batch / 2  # decode_s = q·k² + (a − q)·k
        if q == 0:
            return int(budget_s // a) if a > 0 else 1 << 30
        b = a - q
        return max(0, int((-b + math.sqrt(b * b + 4 * q * budget_s)) / (2 * q)))

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_step_s + self.prefill_per_token_s * tokens if tokens else 0.0

    def logprob_s(self, tokens: int) -> float:
        return self.logprob_step_s + self.logprob_per_token_s * tokens

    def train_s(self, tokens: int) -> float:
        return self.train_step_s + self.train_per_token_s * tokens


_OPTIONAL = {"device", "model", "sources"}


class ModelledClock:
    """Pays modelled device seconds in real time: `time_scale` real seconds per modelled second.

    The device is busy until `free_at`; work queued while it is busy starts when it frees, and work
    given to an idle device starts now (time the host spent elsewhere is time the device sat idle).
    `time_scale` 0 pays nothing: the clock only counts, for working out phase times offline.
    """

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.modelled_s = 0.0  # all the work charged so far, in modelled seconds
        self._free_at = time.monotonic()

    def spend(self, seconds: float) -> None:
        self.modelled_s += seconds
        if self.time_scale <= 0 or seconds <= 0:
            return
        now = time.monotonic()
        self._free_at = max(self._free_at, now) + seconds * self.time_scale
        time.sleep(max(0.0, self._free_at - now))  # the modelled work itself, not a wait on anyone


def token_logprobs(tokens: Tensor, positions: Tensor) -> Tensor:
    """log π of `tokens` at `positions` (of the whole sequence, prompt included): one fixed function of
    (token, position) in [log 1e-3, 0), shared by the emulated generator and trainer, so π_behav, π_prox
    and π_θ of a token agree exactly. [L] int64, [L] int64 -> [L] float32."""
    mixed = (tokens.to(torch.int64) * 2654435761 + positions.to(torch.int64) * 40503) % 1_000_003
    return torch.log(1e-3 + (1 - 1e-3) * mixed.to(torch.float64) / 1_000_003).to(torch.float32)


@dataclass(frozen=True)
class OutputLengths:
    """Output lengths, log-normal around `median` tokens with spread `sigma` (0: all equal), capped.

    Drawn per sample id from its own seeded stream, so a regenerated sample has the length it had.
    A log-normal's tail is what reasoning traces show: most outputs near the median, a few many times
    longer; with sigma 1, one output in 20 is more than 5x the median.
    """

    median: int
    sigma: float
    seed: int = 0

    def draw(self, request_id: int, limit: int) -> int:
        if self.sigma == 0:
            return max(1, min(self.median, limit))
        rng = random.Random(f"lengths:{self.seed}:{request_id}")
        return max(1, min(limit, math.ceil(rng.lognormvariate(math.log(self.median), self.sigma))))

    def mean(self, limit: int, draws: int = 20_000) -> float:
        """The mean capped length, by drawing (the cap makes the closed form awkward)."""
        return sum(self.draw(-1 - i, limit) for i in range(draws)) / draws


class ByteTokenizer:
    """A byte-level tokenizer with no files: <pad> 0, <bos> 1, <eos> 2, byte b is id b + 3.

    The emulated generator samples printable ASCII (no newline, so no stop string ever matches),
    and the runtime decodes completions through it as through a real tokenizer.
    """

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    OFFSET = 3
    vocab_size = 256 + OFFSET
    chat_template = None
    SAMPLED = (32 + OFFSET, 127 + OFFSET)  # the ids the emulated generator draws from: printable ASCII

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + self.OFFSET for b in text.encode()]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        data = torch.as_tensor(ids, dtype=torch.int64)
        data = data[data >= self.OFFSET] - self.OFFSET
        return data.to(torch.uint8).numpy().tobytes().decode("utf-8", errors="replace")
