"""The rate a runtime with no overhead would reach on the emulated devices: bench_scale's ideal under η.

bench_scale's first ideal is N × one generator. Under a hard staleness bound that line is out of
reach when outputs have a long tail, whatever the runtime: a trainer step needs every group of its
batch, a group started at version i must be trained by version i + η, and the longest of B·G
outputs grows with B, which weak scaling grows with N. This model replays the schedule the runtime
follows on the same profile, prompts and output lengths, with every host cost zero:

- the gate: a group may start while floor(started / B) <= i + η; started groups are dealt to the
  generators round-robin (the rollout channel's ZeroMQ PUSH);
- each generator batches continuously as `EmulatedGenerationEngine` does: new weights cost
  `weights_load_s` and a re-prefill of every running context; free slots take waiting requests
  after a prefill that samples their first token; it decodes for at most `quantum_s` before it
  looks for new weights and requests again;
- the trainer takes groups in admission order, B per step, and pays the proximal pass, the update
  (tokens over the GPUs it stands for, plus the reduction) and publishing, as `EmulatedTrainEngine`.

The measured rate over this one is then the runtime's own efficiency.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from areal.engines.emulated_device import DeviceProfile, OutputLengths


@dataclass(frozen=True)
class Schedule:
    """The run being modelled: what bench_scale sets, and the prompts' token counts in the source's order."""

    profile: DeviceProfile
    lengths: OutputLengths
    prompts: tuple[int, ...]
    generators: int
    batch_size: int  # groups per trainer step
    group_size: int
    staleness: int
    steps: int
    max_batch: int
    max_new_tokens: int
    trainer_gpus: int = 1
    quantum_s: float = 0.02  # modelled seconds of decoding between looks for weights and requests


@dataclass
class _Generator:
    waiting: deque[tuple[int, int, int]] = field(default_factory=deque)  # (sample id, prompt tokens, output tokens)
    active: list[list[int]] = field(default_factory=list)  # [sample id, context tokens, output tokens left]
    version: int = 0
    busy: bool = False


def step_times(s: Schedule) -> list[float]:
    """Modelled seconds at which each trainer step published its version (the runtime's step records)."""
    gens = [_Generator() for _ in range(s.generators)]
    events: list[tuple[float, int, int, list[int]]] = []  # (time, order, generator or -1 for the trainer, finished)
    left_in_group: dict[int, int] = {}
    tokens_of: dict[int, int] = {}  # group -> prompt + output tokens of its samples (what the trainer trains)
    state = {"version": 0, "started": 0, "order": 0, "training": False}
    published: list[float] = []

    def push(at: float, who: int, finished: list[int]) -> None:
        state["order"] += 1
        heapq.heappush(events, (at, state["order"], who, finished))

    def admit(now: float) -> None:
        while state["started"] // s.batch_size <= state["version"] + s.staleness:
            group = state["started"]
            state["started"] += 1
            gen = gens[group % s.generators]
            prompt = s.prompts[group % len(s.prompts)]
            left_in_group[group] = s.group_size
            tokens_of[group] = 0
            for k in range(s.group_size):
                sid = group * s.group_size + k
                length = min(s.lengths.draw(sid, s.max_new_tokens + 1), s.max_new_tokens)
                gen.waiting.append((sid, prompt, length))
                tokens_of[group] += prompt + length
            wake(gen, now)

    def wake(gen: _Generator, now: float) -> None:
        if not gen.busy:
            work(gens.index(gen), now)

    def work(index: int, now: float) -> None:
        """One engine step of generator `index` from `now`: weights, admissions and prefill, then decoding."""
        gen, p = gens[index], s.profile
        cost, finished = 0.0, []
        rebuild = 0
        if gen.version < state["version"]:
            cost += p.weights_load_s
            rebuild = sum(seq[1] for seq in gen.active)  # the KV cache built on old weights is gone
            gen.version = state["version"]
        admit_n = min(s.max_batch - len(gen.active), len(gen.waiting))
        newcomers = [gen.waiting.popleft() for _ in range(admit_n)]
        if rebuild or newcomers:
            cost += p.prefill_s(rebuild + sum(prompt for _, prompt, _ in newcomers))
            for sid, prompt, length in newcomers:  # the prefill samples each newcomer's first token
                if length <= 1:
                    finished.append(sid)
                else:
                    gen.active.append([sid, prompt + 1, length - 1])
        if gen.active:
            batch, context = len(gen.active), sum(seq[1] for seq in gen.active)
            to_next = min(seq[2] for seq in gen.active)
            steps = max(1, min(to_next, p.decode_steps_within(batch, context, s.quantum_s)))
            cost += p.decode_s(batch, context, steps)
            for seq in gen.active:
                seq[1] += steps
                seq[2] -= steps
            finished += [seq[0] for seq in gen.active if seq[2] == 0]
            gen.active = [seq for seq in gen.active if seq[2] > 0]
        gen.busy = cost > 0
        if gen.busy:
            push(now + cost, index, finished)

    def train(now: float) -> None:
        step = len(published)
        batch = range(step * s.batch_size, (step + 1) * s.batch_size)
        if state["training"] or len(published) >= s.steps or any(left_in_group.get(g, 1) for g in batch):
            return
        tokens = sum(tokens_of[g] for g in batch) / s.trainer_gpus
        p = s.profile
        cost = p.logprob_s(tokens) + p.train_s(tokens) + (p.train_sync_s if s.trainer_gpus > 1 else 0.0)
        state["training"] = True
        push(now + cost + p.weights_publish_s, -1, [])

    admit(0.0)
    while events and len(published) < s.steps:
        now, _, who, finished = heapq.heappop(events)
        if who < 0:  # a version is published: the gate opens, every generator takes the weights at its next step
            state["training"] = False
            state["version"] += 1
            published.append(now)
            admit(now)
            for gen in gens:
                wake(gen, now)
        else:
            for sid in finished:
                left_in_group[sid // s.group_size] -= 1
            gens[who].busy = False
            work(who, now)
        train(now)
    return published


def samples_per_s(s: Schedule) -> float:
    """Trained samples per modelled second from the first step record to the last, as bench_scale counts."""
    times = step_times(s)
    if len(times) < 2:
        raise ValueError(f"need at least 2 steps to measure a rate, the model ran {len(times)}")
    return (len(times) - 1) * s.batch_size * s.group_size / (times[-1] - times[0])
