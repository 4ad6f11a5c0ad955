"""Each staleness policy in a real emulated run (policy_rl.py), its guarantee checked on what was recorded.

The recipe's advantage node writes every sample's token versions as they reach the trainer; the
trainer's "version" messages say which samples each step trained and what it masked. A test joins
the two: the lag of every trained sample (its step minus its oldest token's version), and for the
token policy every token older than η, are read from the versions the generators stamped, not from
the trainer's own check nor from any timing. Long outputs (log-normal σ = 1) make stragglers, so
the bound is tested where it binds.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from areal.cli.progress import generator_time_line, staleness_line, summary_table
from areal.cli.run import build_controller
from areal.runtime.controller import controller as controller_module
from areal.runtime.records.sample_records import read_samples
from areal.runtime.staleness.admission import Admission
from areal.runtime.storage.resume import resume_point
from areal.runtime.wire import messages as msg
from tests.runtime.kills import KillOnce

RECIPE = Path(__file__).with_name("policy_rl.py")
ETA, B, G = 1, 2, 4


def run(tmp_path: Path, policy: str, *overrides: str, on_event=None):
    controller = build_controller(RECIPE, [f"staleness_policy={policy}", f"staleness={ETA}", *overrides],
                                  tmp_path / "run", on_event=on_event)
    state = controller.run()
    return controller, state


def arrived(controller) -> dict[int, list[int]]:
    """Sample id -> the version of each of its output tokens, as it reached the trainer."""
    lines = (Path(controller.plan.run_dir) / "arrived.jsonl").read_text().splitlines()
    return {r["sample_id"]: r["versions"] for r in map(json.loads, lines)}


def lags(steps, versions) -> list[int]:
    return [step - min(versions[sid]) for step, ids, _ in steps for sid in ids]


def records(tmp_path: Path) -> list[dict]:
    """The run's metrics lines."""
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def identity_holds(controller, steps) -> set[int]:
    """Each sample trained at most once, none both trained and dropped; started = trained + failed + filtered
    + dropped + in flight. Returns the trained ids."""
    trained = [sid for _, ids, _ in steps for sid in ids]
    assert len(trained) == len(set(trained))
    accounting = controller.accounting
    assert set(trained) == accounting.trained and not set(trained) & accounting.dropped.keys()
    s = accounting.summary()
    assert s["started"] == s["trained"] + s["failed"] + s["filtered"] + s["dropped"] + s["in_flight"]
    assert s["in_flight"] >= 0
    return set(trained)


def test_token_trains_no_token_older_than_eta_and_masks_exactly_those(tmp_path, reported):
    controller, state = run(tmp_path, "token", "steps=12")
    versions = arrived(controller)
    assert state.version == 12 and identity_holds(controller, reported)
    older = [sum(v < step - ETA for v in versions[sid]) for step, ids, _ in reported for sid in ids]
    masked = [stats["masked_tokens"] for _, _, stats in reported]
    assert sum(masked) == sum(older) > 0  # stragglers were trained, their old tokens (and only those) masked
    assert max(lags(reported, versions)) > ETA and all(stats["stale_tokens"] == 0 for _, _, stats in reported)
    record = records(tmp_path)[-1]
    assert record["masked_tokens"] == masked[-1]
    # each weight update's time split reached the step records; stragglers ran through updates, so re-reading
    split = [r for r in records(tmp_path) if "generator_rebuild_share" in r]
    assert split and all(sum(v for k, v in r.items() if k.startswith("generator_")) == pytest.approx(1) for r in split)
    assert max(r["generator_rebuild_share"] for r in split) > 0
    assert generator_time_line(split[-1]).startswith("prefill ") and " · rebuild " in generator_time_line(split[-1])
    line = staleness_line(controller)  # the run summary's
    assert line.startswith("token: every trained token ≤ 1 version behind") and f"{sum(masked)} masked" in line
    assert f"max {max(lags(reported, versions))};" in line
    # the run directory alone audits the promise: each trained sample's token versions and the mask its loss read
    samples = read_samples(tmp_path / "run")
    for step, ids, _ in reported:
        for sid in ids:
            assert samples[sid].versions == versions[sid]
            assert samples[sid].loss_mask == [int(v >= step - ETA) for v in versions[sid]]
            assert samples[sid].lag == step - min(versions[sid]) and samples[sid].admitted is not None


def test_masking_cut_outputs_takes_exactly_them_out_of_the_loss_under_the_token_policys_mask(tmp_path, reported):
    # outputs log-normal around 24 tokens (σ = 1) cut at 64: about 1 in 6 is cut; in modelled real time the long
    # uncut ones outlast η steps, so the token policy has old tokens of its own to mask
    controller, state = run(tmp_path, "token", "steps=8", "generation.max_new_tokens=64", "trainer.truncated=mask",
                            "emulation.output_tokens_median=24", "emulation.time_scale=1.0")
    versions = arrived(controller)
    lines = (Path(controller.plan.run_dir) / "arrived.jsonl").read_text().splitlines()
    cut = {r["sample_id"] for r in map(json.loads, lines) if r["truncated"]}
    assert state.version == 8 and identity_holds(controller, reported)
    assert cut and all(len(versions[sid]) == 64 for sid in cut) and len(cut) < len(versions)  # cut at the cap
    assert [stats["truncated_masked"] for _, _, stats in reported] == [len(cut & set(ids)) for _, ids, _ in reported]
    # the token policy's count: old tokens of the outputs still in the loss, not those of the cut ones again
    older = [sum(v < step - ETA for v in versions[sid]) for step, ids, _ in reported for sid in ids if sid not in cut]
    assert sum(stats["masked_tokens"] for _, _, stats in reported) == sum(older) > 0
    assert records(tmp_path)[-1]["truncated_masked"] == reported[-1][2]["truncated_masked"]
    trained_cut = sum(stats["truncated_masked"] for _, _, stats in reported)
    console = Console(file=io.StringIO(), width=240)
    console.print(summary_table(controller))
    assert f"{trained_cut} trained samples cut at max_new_tokens, every token of them out of the loss" in \
        console.file.getvalue()


def test_keeping_the_kv_through_updates_re_reads_nothing_and_the_token_guarantee_still_holds(tmp_path, reported):
    controller, state = run(tmp_path, "token", "steps=12", "generation.on_new_weights=keep-kv")
    versions = arrived(controller)
    assert state.version == 12 and identity_holds(controller, reported)
    assert any(len(set(v)) > 1 for v in versions.values())  # rows decoded on through updates, stamped by version
    older = [sum(v < step - ETA for v in versions[sid]) for step, ids, _ in reported for sid in ids]
    assert sum(stats["masked_tokens"] for _, _, stats in reported) == sum(older)
    split = [r for r in records(tmp_path) if "generator_rebuild_share" in r]
    assert split and all(r["generator_rebuild_share"] == 0 for r in split)
    assert staleness_line(controller).endswith("running rows kept their KV across weight updates "
                                               "(generation.on_new_weights=keep-kv)")


def test_drop_aborts_late_groups_in_generation_and_trains_none_past_eta(tmp_path, reported):
    # in modelled real time a straggler (1 sample in 8 is over 200 tokens, ~5x the median) outlasts η + 1 steps
    controller, state = run(tmp_path, "drop", "steps=12", "emulation.time_scale=1.0")
    versions = arrived(controller)
    assert state.version == 12 and max(lags(reported, versions)) <= ETA
    trained = identity_holds(controller, reported)
    dropped = controller.accounting.dropped
    assert dropped and controller.accounting.dropped_tokens > 0 and len(trained) == 12 * B * G
    assert {sid // G for sid in dropped} & {sid // G for sid in trained} == set()  # a group goes whole
    aborted = [r for r in records(tmp_path) if r["kind"] == "dropped" and "aborted in generation" in r["reason"]]
    assert aborted and aborted[0]["reason"].startswith("rollout: ")  # stopped where it was, not only discarded
    # every admitted sample is on record, a dropped one as dropped with its reason and wasted tokens
    samples = read_samples(tmp_path / "run")
    assert set(range(controller.accounting.started)) <= set(samples)
    assert {sid for sid, r in samples.items() if r.status == "dropped"} == set(dropped)
    assert {sid: samples[sid].reason for sid in dropped} == dropped
    assert sum(samples[sid].dropped_tokens for sid in dropped) == controller.accounting.dropped_tokens
    assert all(r.admitted is not None for sid, r in samples.items() if sid >= 0)


def test_drop_slack_starts_that_many_groups_past_the_gate_and_still_trains_none_past_eta(tmp_path, reported,
                                                                                          monkeypatch):
    slack = 3
    started: dict[int, int] = {}  # group -> the slowest trainer's version when the gate let it start
    admit = Admission.admit

    def recording(self, version, sampled_version):
        batches = admit(self, version, sampled_version)
        started.update((meta.group, version) for _, meta in batches)
        return batches

    monkeypatch.setattr(Admission, "admit", recording)
    controller, state = run(tmp_path, "drop", "steps=12", "emulation.time_scale=1.0", f"drop_slack={slack}")
    versions = arrived(controller)
    assert state.version == 12 and max(lags(reported, versions)) <= ETA  # drop's abort still bounds every lag
    assert len(identity_holds(controller, reported)) == 12 * B * G
    # before the first step ends no group is dropped, so only the slack lets more than (η + 1)·B start
    assert sorted(g for g, v in started.items() if v == 0) == list(range((ETA + 1) * B + slack))
    assert staleness_line(controller).endswith(f"; {slack} groups admitted past the gate (drop_slack)")


def last_requeue(run_dir: Path) -> dict[int, int]:
    """Group -> the version its generator last re-queued it at, from the run's "recycled" metric lines."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    stamps: dict[int, int] = {}
    for record in map(json.loads, lines):
        if record["kind"] == "recycled":
            stamps.update((group, record["version"]) for group in record["groups"])
    return stamps


def recycled_on_newer_weights(steps, versions, requeued: dict[int, int]) -> None:
    """No trained sample ran more than η versions past its group's start or last re-queue, and a re-queued group
    kept the tokens it had sampled before (it was continued, not regenerated)."""
    continued = 0
    for _, ids, _ in steps:
        for sid in ids:
            newest, oldest = max(versions[sid]), min(versions[sid])
            stamp = requeued.get(sid // G, oldest)  # never re-queued: stamped at start, before its first token
            assert newest <= stamp + ETA, (sid, versions[sid], stamp)
            continued += oldest < stamp
    assert continued > 0


@pytest.mark.parametrize("keep_prefix", [False, pytest.param(True, marks=pytest.mark.slow)])  # ~21 s each
def test_recycle_requeues_late_groups_with_their_output_and_masks_or_keeps_their_old_tokens(tmp_path, reported,
                                                                                            keep_prefix):
    # in modelled real time a straggler outlasts η + 1 versions on its generator: it is re-queued, not dropped
    controller, state = run(tmp_path, "recycle", "steps=10", "emulation.time_scale=1.0",
                            f"recycle_keep_prefix={str(keep_prefix).lower()}")
    versions = arrived(controller)
    assert state.version == 10 and len(identity_holds(controller, reported)) == 10 * B * G  # none dropped
    requeued = last_requeue(tmp_path / "run")
    recycled_on_newer_weights(reported, versions, requeued)
    older = sum(sum(v < step - ETA for v in versions[sid]) for step, ids, _ in reported for sid in ids)
    masked = sum(stats.get("masked_tokens", 0) for _, _, stats in reported)
    stale = sum(stats["stale_tokens"] for _, _, stats in reported)
    assert older > 0 and (masked, stale) == ((0, older) if keep_prefix else (older, 0))
    acc = controller.accounting.summary()
    lines = records(tmp_path)
    assert acc["recycled"] >= len(requeued) > 0 and acc["recycled_tokens"] > 0
    logged = [r for r in lines if r["kind"] == "recycled"]
    assert sum(len(r["groups"]) for r in logged) == acc["recycled"]  # every re-queue counted and logged
    assert sum(r["tokens"] for r in logged) == acc["recycled_tokens"]
    # a step record counts the re-queues so far: a generator may re-queue after the last step, on its last weights
    counted = [r["recycled"] for r in lines if r["kind"] == "step"]
    assert counted == sorted(counted) and 0 < counted[-1] <= acc["recycled"]
    line = staleness_line(controller)
    assert f"recycled {acc['recycled']} groups ({acc['recycled_tokens']} tokens re-queued)" in line
    assert line.startswith("recycle: late groups re-queued" if keep_prefix else "recycle: every trained token ≤ 1")

@pytest.mark.slow  # one more run: ~15 s
def test_admission_keeps_late_groups_and_reports_their_true_lags(tmp_path, reported):
    controller, state = run(tmp_path, "admission", "steps=12")
    versions = arrived(controller)
    identity_holds(controller, reported)
    measured = lags(reported, versions)
    assert max(measured) > ETA  # trained past η, and kept
    assert sorted(k for k, n in state.staleness.items() for _ in range(n)) == sorted(measured)


@pytest.mark.slow  # a run with a generator killed mid-way: ~25 s
@pytest.mark.parametrize("policy", ["admission", "drop", "token", "recycle"])
def test_a_killed_generator_loses_nothing_and_trains_nothing_twice(tmp_path, reported, policy):
    kill_rollout = KillOnce("rollout[0]", at_version=4)
    real_time = ["emulation.time_scale=1.0"] if policy == "recycle" else []  # stragglers long enough to re-queue
    controller, state = run(tmp_path, policy, "steps=10", *real_time, on_event=kill_rollout)
    assert kill_rollout.killed and state.version == 10
    trained = identity_holds(controller, reported)
    assert len(trained) == 10 * B * G
    if policy == "drop":
        assert max(lags(reported, arrived(controller))) <= ETA
    if policy == "recycle":  # groups re-queued with their output, a generator killed: each sample trained once
        assert controller.accounting.recycled > 0 and all(stats["stale_tokens"] == 0 for _, _, stats in reported)


@pytest.mark.slow  # two runs: ~30 s
@pytest.mark.parametrize(("policy", "more"), [
    *(pytest.param(policy, (), id=policy) for policy in ("admission", "drop", "token", "recycle")),
    pytest.param("drop", ("drop_slack=3",), id="drop-slack")])
def test_a_resumed_run_trains_every_sample_once_though_groups_were_consumed_out_of_order(tmp_path, reported, policy,
                                                                                         more):
    controller, _ = run(tmp_path, policy, "steps=6", "checkpoint.interval_steps=3", "emulation.time_scale=1.0", *more)
    first = list(reported)
    point = resume_point(tmp_path / "run")
    saved = json.loads((point.checkpoint / "controller.json").read_text())
    assert point.checkpoint.name == "step-000006"
    resumed = build_controller(point.recipe, [*point.overrides, "steps=12"], tmp_path / "run", point)
    state = resumed.run()
    assert state.version == 12 and [v for v, _, _ in reported[len(first):]] == list(range(6, 12))
    trained = [sid for _, ids, _ in reported for sid in ids]
    assert len(trained) == len(set(trained)) == 12 * B * G  # none twice, across the resume
    ahead = set(saved["consumed"]["actor"])  # consumed above the frontier: must not start again
    assert ahead, "no group was consumed out of order before the checkpoint: the test would not test it"
    assert not ahead & {sid // G for _, ids, _ in reported[len(first):] for sid in ids}
    s = resumed.accounting.summary()
    assert s["started"] == s["trained"] + s["failed"] + s["filtered"] + s["dropped"] + s["in_flight"]
    assert s["recycled"] >= saved["accounting"]["recycled"]  # the re-queues before the resume still count


@pytest.mark.slow  # a run with a generator killed mid-way: ~25 s
def test_reissue_after_a_generator_kill_under_drop_starts_nothing_decided_and_counts_every_aborted_token(
        tmp_path, reported, monkeypatch):
    decided_then: list[int] = []  # groups re-issued whose every sample was already decided
    sent: list[int] = []
    controllers: list = []
    original = Admission.reissue

    def recording(self, skip, only):
        items = original(self, skip, only)
        accounting = controllers[0].accounting
        sent.extend(meta.group for _, meta in items)
        decided_then.extend(meta.group for _, meta in items
                            if all(accounting.decided(s) for s in accounting.samples_of(meta.group)))
        return items

    aborted: list[int] = []
    on_dropped = controller_module.HANDLERS[msg.SamplesDropped]

    def counting(self, worker, m):
        aborted.extend(m.tokens)
        on_dropped(self, worker, m)

    monkeypatch.setattr(Admission, "reissue", recording)
    monkeypatch.setitem(controller_module.HANDLERS, msg.SamplesDropped, counting)
    kill_rollout = KillOnce("rollout[0]", when=lambda c: any(g >= min(c.next_group.values())
                                                              for g in c.accounting.consumed))
    controller = build_controller(RECIPE, ["staleness_policy=drop", f"staleness={ETA}", "steps=12",
                                           "emulation.time_scale=1.0"], tmp_path / "run", on_event=kill_rollout)
    controllers.append(controller)
    state = controller.run()
    assert kill_rollout.killed and state.version == 12 and sent
    trained = identity_holds(controller, reported)
    assert decided_then == []  # nothing whose fate was settled was generated again
    lines = [json.loads(line) for path in (tmp_path / "run" / "samples").glob("*.jsonl")
             for line in path.read_text().splitlines()]
    assert not {r["sample_id"] for r in lines if r.get("status") == "dropped"} & trained
    accounting = controller.accounting
    assert sum(aborted) == accounting.dropped_tokens + accounting.copy_tokens  # every aborted token in a total
