"""The rate a runtime with no overhead would reach on the emulated devices, under each staleness policy.

bench_scale's first ideal is N × one generator. Under the strict staleness policy that line is out
of reach when outputs have a long tail, whatever the runtime: a trainer step needs every group of
its batch, a group started at version i must be trained by version i + η, and the longest of B·G
outputs grows with B, which weak scaling grows with N. The other policies (areal/runtime/
staleness_policies.py) trade that wait for something else, and this model measures the price. It
replays the schedule the runtime follows on the same profile, prompts and output lengths, with
every host cost zero:

- the gate: a group may start while the groups holding a slot (started, not dropped) number fewer
  than (i + η + 1)·B (+ `slack` for drop); started groups are dealt to the generators round-robin
  (the rollout channel's ZeroMQ PUSH);
- each generator batches continuously as `EmulatedGenerationEngine` does: new weights cost
  `weights_load_s` and a re-prefill of every running context; free slots take waiting requests
  after a prefill that samples their next token; it decodes for at most `quantum_s` before it
  looks for new weights and requests again; every token records the version that sampled it;
- the trainer takes B groups per step (strict: the next B in admission order; every other policy:
  the B oldest finished) and pays the proximal pass, the update (tokens over the GPUs it stands
  for, plus the reduction) and publishing, as `EmulatedTrainEngine`;
- when version v is published, drop aborts every untrained group holding a token older than v − η
  (its slot starts another), and recycle sends the running samples of a group stamped before
  v − η to the front of their generator's queue, stamped v; token and recycle mask, when training,
  the tokens older than η (recycle with `keep_prefix` trains them).

The measured rate over this one is then the runtime's own efficiency.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from areal.engines.emulated.device import DeviceProfile, OutputLengths

POLICIES = ("strict", "admission", "drop", "token", "recycle")
MASKING = ("token", "recycle")  # the policies whose trainer masks the tokens older than η


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
    policy: str = "strict"
    slack: int = 0  # drop: groups admitted beyond (i + η + 1)·B, so a dropped one has a stand-in running
    keep_prefix: bool = False  # recycle: train the tokens older than η instead of masking them

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")


@dataclass(slots=True)
class _Sequence:
    sample: int
    prompt: int
    length: int  # output tokens it will have
    context: int = 0  # prompt and output tokens so far: what a (re-)prefill reads
    done: int = 0
    runs: list[list[int]] = field(default_factory=list)  # [version, tokens] of each run sampled by one version

    def sample_tokens(self, count: int, version: int) -> None:
        runs = self.runs
        if runs and runs[-1][0] == version:
            runs[-1][1] += count
        else:
            runs.append([version, count])
        self.done += count
        self.context += count

    def older_than(self, version: int) -> int:
        """Its tokens sampled by a version below `version`."""
        return sum(count for v, count in self.runs if v < version)


@dataclass
class _Group:
    generator: int
    stamp: int  # the version it was admitted at (recycle: or last re-queued at)
    sequences: list[_Sequence]
    left: int  # samples not finished


@dataclass
class _Generator:
    waiting: deque[_Sequence] = field(default_factory=deque)
    active: list[_Sequence] = field(default_factory=list)
    version: int = 0
    busy: bool = False


@dataclass
class Outcome:
    """What the replay measured: when each step published, and what each policy paid for its rate."""

    published: list[float] = field(default_factory=list)  # modelled seconds at which each version was published
    lags: list[int] = field(default_factory=list)  # per trained sample: its step minus its oldest token's version
    trained_tokens: int = 0  # output tokens the loss reads (masked ones are not)
    stale_tokens: int = 0  # of those, sampled more than η versions before their step
    masked_tokens: int = 0  # output tokens of trained samples the loss mask left out (older than η)
    dropped_tokens: int = 0  # output tokens generated for groups that were then dropped
    dropped_groups: int = 0
    recycled_groups: int = 0
    trained_lengths: list[int] = field(default_factory=list)  # output tokens of each trained sample
    drawn_lengths: list[int] = field(default_factory=list)  # output tokens each started sample was drawn to have

    def samples_per_s(self, samples_per_step: int) -> float:
        """Trained samples per modelled second from the first step record to the last, as bench_scale counts."""
        if len(self.published) < 2:
            raise ValueError(f"need at least 2 steps to measure a rate, the model ran {len(self.published)}")
        return (len(self.published) - 1) * samples_per_step / (self.published[-1] - self.published[0])

    def wasted(self) -> float:
        """Of the output tokens generated for samples that were trained or dropped: those no loss read."""
        generated = self.trained_tokens + self.masked_tokens + self.dropped_tokens
        return (self.masked_tokens + self.dropped_tokens) / generated if generated else 0.0

    def length_ratio(self) -> float:
        """Mean trained output length over the mean drawn one: below 1, the policy prefers short answers."""
        if not self.trained_lengths:
            return math.nan
        trained = sum(self.trained_lengths) / len(self.trained_lengths)
        return trained / (sum(self.drawn_lengths) / len(self.drawn_lengths))


class _Replay:
    def __init__(self, s: Schedule) -> None:
        self.s = s
        self.gens = [_Generator() for _ in range(s.generators)]
        self.events: list[tuple[float, int, int, list[int]]] = []  # (time, order, generator or -1: trainer, done)
        self.groups: dict[int, _Group] = {}  # started, neither trained nor dropped
        self.finished: set[int] = set()  # of those, the groups whose every sample is done
        self.version = 0
        self.started = 0
        self.freed = 0  # groups dropped: their slots went to others
        self.order = 0
        self.training = False
        self.out = Outcome()

    def run(self) -> Outcome:
        self.admit(0.0)
        while self.events and len(self.out.published) < self.s.steps:
            now, _, who, done = heapq.heappop(self.events)
            if who < 0:
                self.publish(now)
            else:
                for sid in done:
                    group = self.groups.get(sid // self.s.group_size)
                    if group is not None:  # not dropped while its last step ran
                        group.left -= 1
                        if group.left == 0:
                            self.finished.add(sid // self.s.group_size)
                self.gens[who].busy = False
                self.work(who, now)
            self.train(now)
        return self.out

    def push(self, at: float, who: int, done: list[int]) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, who, done))

    def admit(self, now: float) -> None:
        s = self.s
        slack = s.slack if s.policy == "drop" else 0
        while self.started - self.freed < (self.version + s.staleness + 1) * s.batch_size + slack:
            group = self.started
            self.started += 1
            index = group % s.generators
            prompt = s.prompts[group % len(s.prompts)]
            sequences = []
            for k in range(s.group_size):
                sid = group * s.group_size + k
                length = min(s.lengths.draw(sid, s.max_new_tokens + 1), s.max_new_tokens)
                sequences.append(_Sequence(sid, prompt, length, context=prompt))
                self.out.drawn_lengths.append(length)
            self.groups[group] = _Group(index, self.version, sequences, s.group_size)
            self.gens[index].waiting.extend(sequences)
            self.wake(index, now)

    def wake(self, index: int, now: float) -> None:
        if not self.gens[index].busy:
            self.work(index, now)

    def work(self, index: int, now: float) -> None:
        """One engine step of generator `index` from `now`: weights, admissions and prefill, then decoding."""
        gen, p = self.gens[index], self.s.profile
        cost, done = 0.0, []
        rebuild = 0
        if gen.version < self.version:
            cost += p.weights_load_s
            rebuild = sum(seq.context for seq in gen.active)  # the KV cache built on old weights is gone
            gen.version = self.version
        newcomers = [gen.waiting.popleft() for _ in range(min(self.s.max_batch - len(gen.active), len(gen.waiting)))]
        if rebuild or newcomers:
            cost += p.prefill_s(rebuild + sum(seq.context for seq in newcomers))
            for seq in newcomers:  # the prefill samples each newcomer's next token
                seq.sample_tokens(1, gen.version)
                if seq.done >= seq.length:
                    done.append(seq.sample)
                else:
                    gen.active.append(seq)
        if gen.active:
            batch, context = len(gen.active), sum(seq.context for seq in gen.active)
            to_next = min(seq.length - seq.done for seq in gen.active)
            steps = max(1, min(to_next, p.decode_steps_within(batch, context, self.s.quantum_s)))
            cost += p.decode_s(batch, context, steps)
            for seq in gen.active:
                seq.sample_tokens(steps, gen.version)
            done += [seq.sample for seq in gen.active if seq.done >= seq.length]
            gen.active = [seq for seq in gen.active if seq.done < seq.length]
        gen.busy = cost > 0
        if gen.busy:
            self.push(now + cost, index, done)

    def publish(self, now: float) -> None:
        """A version is published: old groups are dropped or recycled, the gate opens, generators take the weights."""
        self.training = False
        self.version += 1
        self.out.published.append(now)
        oldest_kept = self.version - self.s.staleness  # a token older than this is over η at the next step
        if self.s.policy == "drop":
            for group in [g for g, grp in self.groups.items()
                          if any(seq.older_than(oldest_kept) for seq in grp.sequences)]:
                self.drop(group)
        elif self.s.policy == "recycle":
            for group in [g for g, grp in self.groups.items() if grp.left and grp.stamp < oldest_kept]:
                self.recycle(group)
        self.admit(now)
        for index in range(len(self.gens)):
            self.wake(index, now)

    def drop(self, group: int) -> None:
        grp = self.groups.pop(group)
        self.finished.discard(group)
        gen = self.gens[grp.generator]
        ids = {seq.sample for seq in grp.sequences}
        gen.waiting = deque(seq for seq in gen.waiting if seq.sample not in ids)
        gen.active = [seq for seq in gen.active if seq.sample not in ids]
        self.out.dropped_tokens += sum(seq.done for seq in grp.sequences)
        self.out.dropped_groups += 1
        self.freed += 1

    def recycle(self, group: int) -> None:
        """Its running samples leave their slots for the front of the queue, keeping what they sampled."""
        grp = self.groups[group]
        gen = self.gens[grp.generator]
        ids = {seq.sample for seq in grp.sequences}
        moved = [seq for seq in gen.active if seq.sample in ids]
        gen.active = [seq for seq in gen.active if seq.sample not in ids]
        gen.waiting.extendleft(reversed(moved))
        grp.stamp = self.version
        self.out.recycled_groups += 1

    def pick(self) -> list[int]:
        """The groups of the next step, or none while they are not all finished."""
        s = self.s
        if len(self.finished) < s.batch_size:
            return []
        if s.policy == "strict":  # admission order: nothing is dropped, so step j is groups [jB, (j+1)B)
            step = len(self.out.published)
            batch = list(range(step * s.batch_size, (step + 1) * s.batch_size))
            return batch if all(g in self.finished for g in batch) else []
        return sorted(self.finished)[: s.batch_size]

    def train(self, now: float) -> None:
        if self.training or len(self.out.published) >= self.s.steps:
            return
        batch = self.pick()
        if not batch:
            return
        s, p = self.s, self.s.profile
        step = len(self.out.published)
        masks = s.policy in MASKING and not s.keep_prefix
        tokens = 0
        for group in batch:
            self.finished.discard(group)
            for seq in self.groups.pop(group).sequences:
                stale = seq.older_than(step - s.staleness)
                self.out.lags.append(step - min(v for v, _ in seq.runs))
                self.out.trained_lengths.append(seq.length)
                self.out.masked_tokens += stale if masks else 0
                self.out.stale_tokens += 0 if masks else stale
                self.out.trained_tokens += seq.length - (stale if masks else 0)
                tokens += seq.prompt + seq.length
        tokens /= s.trainer_gpus
        cost = p.logprob_s(tokens) + p.train_s(tokens) + (p.train_sync_s if s.trainer_gpus > 1 else 0.0)
        self.training = True
        self.push(now + cost + p.weights_publish_s, -1, [])


def simulate(s: Schedule) -> Outcome:
    """Replay `s` until its last step is published (module doc)."""
    return _Replay(s).run()


def step_times(s: Schedule) -> list[float]:
    """Modelled seconds at which each trainer step published its version (the runtime's step records)."""
    return simulate(s).published


def samples_per_s(s: Schedule) -> float:
    """Trained samples per modelled second from the first step record to the last, as bench_scale counts."""
    return simulate(s).samples_per_s(s.batch_size * s.group_size)
