"""Training and log-probability passes on a Hugging Face causal LM, in plain torch.

One engine serves the `compute-logprob` node (π_prox: `sequence_logprobs`) and the `ppo-update`
node (`train_step`: one AdamW step over a whole batch, accumulated over micro-batches).

Micro-batches: each runs as right-padded rows of one [rows, longest] forward. Right padding needs
no attention mask (causal attention never lets a real token see the pads after it). The
alternative, one packed row with a block-diagonal mask, was measured 3-9x slower on this CPU (SDPA
with an arbitrary mask is dense over all N² token pairs of the pack): 16 sequences of 32-256
tokens, 1.6 M params: padded 120 ms, packed 348 ms; 16-512 tokens: 365 ms vs 1771 ms. So the
sequences are grouped by length (`areal.kernels.packing.padded_microbatches`): the budget bounds
rows x longest, the positions a forward really holds, and few of them are pads. The one mask worth
its cost: sequences that share a prompt (a group's samples) run as one row, the prompt once and each
sample's own tokens after it, masked from the others' (`areal.kernels.shared_prefix`, `trainer.shared_prefixes`);
the planner then packs those rows, a group's positions falling by its size less one prompt.

Loss weighting: `loss_fn` sees one micro-batch and returns its loss as a mean over that
micro-batch's output tokens (`loss_reduction="mean"`, what the kernels return) or as a sum
(`"sum"`); the engine scales it by n_mb / N (or 1 / N), N = output tokens in the whole batch, so
the accumulated gradient is that of the token-weighted mean over the batch, the same for any
micro-batch split.

Checkpoints hold no pickle: weights via `save_pretrained` (safetensors, Hugging Face layout),
optimizer moments via safetensors keyed by parameter name, the torch RNG state (a model with
dropout draws from it, so a resumed run continues the same draws), and step, version and
hyperparameters as JSON. The lr schedule is the settings' (trainer_settings.py), a pure function of the step.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import safetensors.torch
import torch
from torch import Tensor

from areal.engines.lora.training import is_lora, load_adapter_checkpoint
from areal.engines.training.micro_batch import ExtraField, KeptForward, LossFn, MicroBatch
from areal.engines.training.step_stats import StepStats, Total
from areal.engines.training.trainer_settings import TrainSettings, enter_update_mode
from areal.kernels.logprob import token_logprobs
from areal.kernels.packing import padded_microbatches
from areal.kernels.shared_prefix import Unit, members, prefix_units, shares_prefixes, unit_length, unit_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKPOINT_FORMAT = 1
# what one forward + backward call costs beyond its positions, in padded positions: measured on the tiny
# coder on one CPU thread (benchmarks/bench_microbatches.py); a larger model makes it matter less
CALL_COST_TOKENS = 64


class TorchTrainEngine:
    """AdamW over an HF causal LM with token-budgeted micro-batches; see the module doc."""

    def __init__(self, model: PreTrainedModel, settings: TrainSettings | None = None, *,
                 device: torch.device | None = None) -> None:
        """`device`: where the model trains (it is moved there); None keeps it where it is."""
        self.settings = settings or TrainSettings()
        self.model = model if device is None else model.to(device)
        self.device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype  # a shared row's mask is added to scores of this dtype
        self._named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW([p for _, p in self._named_params], lr=self.settings.lr,
                                           betas=self.settings.betas, weight_decay=self.settings.weight_decay)
        self.step = 0  # optimizer steps taken (the policy version is the trainer node's, not the engine's)
        self._kept: KeptForward | None = None  # a forward sequence_logprobs kept for the next train_step
        # a prompt shared by a group runs once a step, not once a sample (shared_prefix.py); `False` for plain rows
        self.shared_prefixes = self.settings.shared_prefixes and shares_prefixes(self.model)

    # ---- forward passes -------------------------------------------------------------------------

    def sequence_logprobs(self, sequences: Sequence[Tensor], no_grad: bool = True,
                          keep_for_update: bool = False) -> list[Tensor]:
        """For each sequence, log π_θ(token_t | tokens before t) for t = 1..L-1: [L-1] float32.

        With no_grad they come back on the CPU, wherever the model is: they leave the process as a batch.
        With keep_for_update the forward keeps its autograd graph, and the next `train_step` over the same
        sequences, before any other step, backpropagates through it instead of running its own forward:
        one forward fewer per step, for holding the whole batch's activations in between."""
        self.model.eval()
        out: list[Tensor] = [torch.empty(0)] * len(sequences)
        parts: list[tuple[list[Unit], Tensor, Tensor | None, Tensor]] = []
        with torch.set_grad_enabled(keep_for_update or not no_grad):
            for units in self._microbatches(sequences):
                logp, entropy, cu = self._logprobs(sequences, [1] * len(sequences), units,
                                                   entropy=keep_for_update and self.settings.token_entropy)
                if keep_for_update:
                    parts.append((units, logp, entropy, cu))
                rows = logp.detach().cpu() if no_grad else logp
                for j, i in enumerate(members(units)):
                    out[i] = rows[int(cu[j]) : int(cu[j + 1])]
        self._kept = KeptForward(self.step, list(sequences), parts) if keep_for_update else None
        return out

    def _units(self, sequences: Sequence[Tensor], index: Sequence[int]) -> list[Unit]:
        """The sequences of `index` as rows: a group's prompt shared once where the model allows (shared_prefix.py),
        else one row a sequence."""
        if self.shared_prefixes:
            return prefix_units(sequences, index, self.settings.microbatch_tokens)
        return [(len(sequences[i]), [i]) for i in index]

    def _microbatches(self, sequences: Sequence[Tensor]) -> list[list[Unit]]:
        """The rows of each micro-batch, planned once a pass: `_logprobs` runs them as given."""
        units = self._units(sequences, range(len(sequences)))
        lengths = [unit_length(sequences, unit) for unit in units]
        return [[units[u] for u in b] for b in padded_microbatches(lengths, self.settings.microbatch_tokens,
                                                                     CALL_COST_TOKENS)]

    def _logprobs(self, sequences: Sequence[Tensor], starts: Sequence[int], units: list[Unit],
                  entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Packed log π_θ of tokens starts[i]..L_i-1 of each sequence of `units`, in `members(units)` order, π_θ's
        entropy at each when asked (else None), and their cu_seqlens."""
        index = members(units)
        rows = unit_rows(sequences, units, {i: starts[i] for i in index}, self._dtype)
        shared = {} if rows.mask is None else {"attention_mask": rows.mask.to(self.device),
                                               "position_ids": rows.positions.to(self.device)}
        # right padding: no real token attends to a later pad (and in a shared row, to another member's tokens)
        logits = self.model(input_ids=rows.ids.to(self.device), use_cache=False, **shared).logits
        predict = torch.cat([rows.predict[i] for i in index])  # logits at position t predict token t + 1
        targets = torch.cat([torch.as_tensor(sequences[i], dtype=torch.int64)[starts[i] :] for i in index])
        counts = torch.tensor([len(sequences[i]) - starts[i] for i in index], dtype=torch.int64)
        cu = torch.zeros(len(index) + 1, dtype=torch.int64)
        cu[1:] = counts.cumsum(0)
        flat = logits.flatten(0, 1)[predict.to(self.device)]
        return (*self._score(flat, targets.to(self.device), entropy), cu)

    def _score(self, flat: Tensor, targets: Tensor, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """What the engine trains per output token, from the model's outputs at the positions before it:
        log π_θ(token) and, with `entropy`, π_θ's entropy there; a value model's engine (value_train.py) reads its
        value head instead."""
        if entropy:
            logp, token_entropy = token_logprobs(flat, targets, temperature=self.settings.temperature,
                                                 with_entropy=True)
            return logp, token_entropy
        logp = token_logprobs(flat, targets, temperature=self.settings.temperature)
        assert isinstance(logp, Tensor)
        return logp, None

    # ---- training ---------------------------------------------------------------------------------

    def train_step(
        self,
        sequences: Sequence[Tensor],
        prompt_lens: Sequence[int],
        loss_fn: LossFn,
        extra: dict[str, ExtraField] | None = None,
        *,
        loss_reduction: Literal["mean", "sum"] = "mean",
        lr_step: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over the batch; the loss is the token-weighted mean over output tokens.

        sequences[i] is prompt + output ids; positions >= prompt_lens[i] are the output tokens
        that logp covers. `lr_step` is the lr schedule's position: a trainer passes the policy
        version it is training, so the M minibatch steps of one version share its lr and the
        schedule spans the run's versions; by default, the optimizer steps taken. Returns loss,
        grad_norm, lr, tokens, sequences, microbatches, time_s, and loss_fn's own stats, each combined
        over the micro-batches as its kind says (step_stats.py: counts summed, maxima maxed, the rest
        token-weighted means).
        """
        start = time.perf_counter()
        per_token, per_sample = self._check_batch(sequences, prompt_lens, extra or {})
        out_lens = [len(s) - p for s, p in zip(sequences, prompt_lens, strict=True)]
        total = sum(out_lens)
        enter_update_mode(self.model, self.settings)
        self.optimizer.zero_grad(set_to_none=True)
        numbers = StepStats()
        kept, self._kept = self._kept, None
        if kept is not None and not kept.serves(self.step, sequences):
            kept = None  # of other sequences or older weights: this step runs its own forward
        microbatches = [units for units, *_ in kept.parts] if kept else self._microbatches(sequences)
        for n, units in enumerate(microbatches):
            index = members(units)
            logp, entropy, cu = (kept.output_logprobs(n, prompt_lens) if kept else
                                 self._logprobs(sequences, prompt_lens, units, entropy=self.settings.token_entropy))
            mb = MicroBatch.gathered(index, cu, per_token, per_sample, entropy, total, self.device)
            loss, stats = loss_fn(logp, mb)
            weight = 1.0 / total if loss_reduction == "sum" else mb.n_tokens / total
            (loss * weight).backward()
            loss_mean = loss.detach() * (1.0 / mb.n_tokens if loss_reduction == "sum" else 1.0)
            numbers.add({"loss": float(loss_mean), **stats}, mb.n_tokens)
        params = [p for _, p in self._named_params]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.settings.grad_clip or math.inf)
        result = numbers.result()
        refuse_non_finite(result["loss"], float(grad_norm), self.step, self.optimizer)
        lr = self.settings.lr_at(self.step if lr_step is None else lr_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.step += 1
        result |= {
            "grad_norm": float(grad_norm),
            "lr": lr,
            "tokens": Total(total),
            "sequences": Total(len(sequences)),
            "microbatches": Total(len(microbatches)),
            "reused_forward": float(kept is not None),
            "time_s": Total(time.perf_counter() - start),
        }
        return result

    def _check_batch(
        self, sequences: Sequence[Tensor], prompt_lens: Sequence[int], extra: dict[str, ExtraField]
    ) -> tuple[dict[str, list[Tensor]], dict[str, Tensor]]:
        """Validate the batch; split extras into per-token rows and per-sample tensors."""
        if len(sequences) != len(prompt_lens) or not sequences:
            raise ValueError(
                f"train_step: need one prompt_len per sequence and at least one sequence, "
                f"got {len(sequences)} sequences and {len(prompt_lens)} prompt_lens"
            )
        if self.settings.token_entropy and "entropy" in extra:
            raise ValueError("train_step: extra['entropy'] is a name the engine gives (TrainSettings.token_entropy)")
        for i, (s, p) in enumerate(zip(sequences, prompt_lens, strict=True)):
            if not 1 <= p < len(s):
                raise ValueError(
                    f"train_step: sequence {i} has {len(s)} tokens and prompt_len {p}; "
                    "need 1 <= prompt_len < len(sequence) (a prompt token and at least one output token)"
                )
        per_token: dict[str, list[Tensor]] = {}
        per_sample: dict[str, Tensor] = {}
        for name, value in extra.items():
            if isinstance(value, Tensor):
                if value.dim() == 0 or value.shape[0] != len(sequences):
                    raise ValueError(
                        f"train_step: extra[{name!r}] is a Tensor, read as per-sample, so its first dim "
                        f"must be S={len(sequences)}; got shape {tuple(value.shape)}. Give per-token values "
                        "as a list of per-sample tensors or a Ragged"
                    )
                per_sample[name] = value
                continue
            rows = [torch.as_tensor(r) for r in value]  # a list of rows, or a Ragged (it indexes its rows)
            for i, (row, s, p) in enumerate(zip(rows, sequences, prompt_lens, strict=True)):
                if len(row) != len(s) - p:
                    raise ValueError(
                        f"train_step: extra[{name!r}] row {i} has {len(row)} values but sequence {i} has "
                        f"{len(s) - p} output tokens (len {len(s)} - prompt_len {p})"
                    )
            if len(rows) != len(sequences):
                raise ValueError(f"train_step: extra[{name!r}] has {len(rows)} rows for {len(sequences)} sequences")
            per_token[name] = rows
        return per_token, per_sample

    # ---- weights and checkpoints -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Tensor]:
        """The model's weights (detached, aliasing the live parameters: copy before the next step if kept)."""
        return self.model.state_dict()

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        self._kept = None  # computed with the weights being replaced
        self.model.load_state_dict(state_dict)

    def save(self, directory: str | Path, version: int) -> None:
        """Write model/ (HF layout), optimizer.safetensors, rng.safetensors and trainer_state.json under directory.

        `version` is the policy version these weights are (the trainer's count, recorded for readers).
        """
        self.write_checkpoint(directory, self.optimizer_moments(), version=version)

    def load(self, directory: str | Path) -> int:
        """Restore what `save` wrote into this engine's model and optimizer; return the version it recorded."""
        directory = Path(directory)
        self._kept = None  # computed with the weights being replaced
        scalars = read_trainer_state(directory)
        if is_lora(self.model):  # its model part is the adapter (PeftModel.save_pretrained)
            load_adapter_checkpoint(self.model, directory / "model")
        else:
            safetensors.torch.load_model(self.model, str(directory / "model" / "model.safetensors"),
                                         device=str(self.device))
        moments = safetensors.torch.load_file(str(directory / "optimizer.safetensors"))
        self.load_training_state(directory, moments, scalars)
        return int(scalars["version"])

    # the pieces of save and load that the FSDP engine shares (it gathers and shards around them)

    def optimizer_moments(self) -> dict[str, Tensor]:
        """The optimizer's state keyed "<parameter name>::<field>", as it holds it (FSDP: sharded)."""
        index = {id(p): name for name, p in self._named_params}
        return {f"{index[id(p)]}::{key}": value for p, state in self.optimizer.state.items()
                for key, value in state.items()}

    def write_checkpoint(self, directory: str | Path, moments: dict[str, Tensor], *, version: int,
                         model_state: dict[str, Tensor] | None = None) -> None:
        """Write a checkpoint from full moments; `model_state` gives full weights when the model is sharded."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / "model", state_dict=model_state)
        safetensors.torch.save_file({k: torch.as_tensor(v).detach().cpu().contiguous() for k, v in moments.items()},
                                    str(directory / "optimizer.safetensors"))
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        safetensors.torch.save_file(rng, str(directory / "rng.safetensors"))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        scalars = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "version": version,
            "param_groups": groups,
        }
        (directory / "trainer_state.json").write_text(json.dumps(scalars, indent=1))

    def load_training_state(self, directory: Path, moments: dict[str, Tensor], scalars: dict[str, Any]) -> None:
        """The optimizer's moments (placed like their parameters), its step, and the RNG state."""
        # on CPU: the optimizer moves each moment to its parameter's device and keeps `step` as it is
        position = {name: i for i, (name, _) in enumerate(self._named_params)}
        state: dict[int, dict[str, Tensor]] = {}
        for key, value in moments.items():
            name, _, field = key.rpartition("::")
            if name not in position:
                raise ValueError(f"{directory / 'optimizer.safetensors'}: state for unknown parameter {name!r}")
            state.setdefault(position[name], {})[field] = value
        groups = [dict(g, params=list(range(len(position)))) for g in scalars["param_groups"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        self.step = int(scalars["step"])
        if (directory / "rng.safetensors").exists():  # absent from checkpoints written before it was kept
            rng = safetensors.torch.load_file(str(directory / "rng.safetensors"))
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], self.device)


class NonFiniteUpdate(ValueError):
    """A loss or gradient that is NaN or infinite: the step is not taken, so the weights stay finite."""


def refuse_non_finite(loss_sum: float, grad_norm: float, step: int, optimizer: torch.optim.Optimizer) -> None:
    """Raise `NonFiniteUpdate` before `optimizer.step()` when the batch's loss or gradient is not finite."""
    if math.isfinite(loss_sum) and math.isfinite(grad_norm):
        return
    optimizer.zero_grad(set_to_none=True)  # nothing of this batch may leak into a later step
    raise NonFiniteUpdate(f"optimizer step {step}: the loss is {loss_sum} and the gradient norm {grad_norm}; "
                          "the update was not applied")


def read_trainer_state(directory: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint, refused when written in another format."""
    scalars: dict[str, Any] = json.loads((directory / "trainer_state.json").read_text())
    if scalars.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{directory / 'trainer_state.json'}: checkpoint format {scalars.get('format')!r}, "
            f"this areal reads format {CHECKPOINT_FORMAT}"
        )
    return scalars
