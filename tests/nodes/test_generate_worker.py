"""The generate node's view of a finished generation: which ones the run notes, and why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from areal.config import GenerationConfig, RunConfig
from areal.engines.generation import GenResult
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.roles import FAILED
from areal.models.tokenizer import CharTokenizer as make_tokenizer
from areal.nodes.workers.generate import GenerateNode, generation_problem
from areal.runtime.wire.messages import Message, NodeMetrics, parse
from tests.local_model import make_checkpoint


def test_empty_text_is_noted_before_an_over_long_one_and_a_finished_one_is_not():
    cases = [("eos", "return x"), ("stop", "return x"), ("length", "return x"), ("eos", ""), ("stop", " \n"),
             ("length", "  ")]
    assert [generation_problem(reason, text) for reason, text in cases] == [
        None, None, "over_long", "empty", "empty", "empty"]


def test_a_group_reissued_while_still_in_flight_is_generated_once(tmp_path):
    # the controller re-issues every unfinished group when a downstream worker dies; a generator
    # that still holds one must not submit its sample ids twice (the engine refuses duplicates)
    node = GenerateNode()
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), group_size=2,
                       generation=GenerationConfig(max_new_tokens=3, stop=[]))
    noted: list[list[int]] = []
    node.setup(SimpleNamespace(config=config, run_dir=tmp_path, version=0, resume_dir=None, weights_group=None,
                               published_weights=lambda version: tmp_path / "none", resumed_policy=lambda: None,
                               note=lambda sample_ids, reasons: noted.append(sorted(sample_ids)), report=None))
    group = Batch({"prompt": ["def f(x):\n"], "group_id": torch.tensor([5]), "sample_id": torch.tensor([5])})
    meta = GroupMeta(group=5, samples=2, admitted_at=0)
    node.submit(group, meta)
    node.submit(group, meta)  # the re-issued copy
    done = []
    while node.pending():
        done += node.step()
    assert len(done) == 1
    batch, _ = done[0]
    assert batch["sample_id"].tolist() == [10, 11]  # group 5 of size 2: ids 5·2 + k
    # 3 tokens cannot finish a program: both are noted as over-long (or empty), each once
    assert noted == [[10, 11]]


def test_a_prompt_filling_the_models_context_fails_its_samples_and_one_near_it_generates_to_its_end(tmp_path):
    node, noted = GenerateNode(), []
    config = RunConfig(model=str(make_checkpoint(tmp_path / "ckpt")), group_size=2,  # a context of 256 tokens
                       generation=GenerationConfig(max_new_tokens=40, stop=[], temperature=10.0))
    node.setup(SimpleNamespace(config=config, run_dir=tmp_path, version=0, resume_dir=None, weights_group=None,
                               published_weights=lambda version: tmp_path / "none", resumed_policy=lambda: None,
                               note=lambda sample_ids, reasons: noted.append(dict(zip(sample_ids, reasons))),
                               report=None))
    prompts = {1: "x" * 300, 2: "y" * 245, 3: "def f(x):\n"}  # past the context, 10 tokens short of it, short
    lengths = {g: len(node.tokenizer(p)["input_ids"]) for g, p in prompts.items()}
    assert lengths[1] >= 256 and 256 - 40 < lengths[2] < 256 - 1
    for group, prompt in prompts.items():
        node.submit(Batch({"prompt": [prompt], "group_id": torch.tensor([group]), "sample_id": torch.tensor([group])}),
                    GroupMeta(group=group, samples=2, admitted_at=0))
    done = {}
    while node.pending():
        done |= {meta.group: batch for batch, meta in node.step()}
    assert sorted(done) == [1, 2, 3]
    why = f"its prompt is {lengths[1]} tokens and the model's context 256 (max_position_embeddings): no room left"
    assert [reason.startswith(why) for reason in done[1][FAILED]] == [True, True]
    assert done[1]["output_ids"].values.numel() == 0
    assert FAILED not in done[2] and FAILED not in done[3]
    room = 256 - lengths[2]  # each request draws its own seeded numbers: at temperature 10 these reach their limit
    assert [len(ids) for ids in done[2]["output_ids"].rows()] == [room, room]
    assert all(len(ids) <= 40 for ids in done[3]["output_ids"].rows())
    said = {sid: why for notes in noted for sid, why in notes.items()}
    assert said[4] == said[5] == "over_long"  # cut where the context ends, as at max_new_tokens


class OneAtATime:
    """An engine that finishes one request per step and refuses a request id it already holds, like the real one."""

    def __init__(self) -> None:
        self.queue: list = []
        self.version = 0

    def submit(self, requests) -> None:
        held = {r.request_id for r in self.queue}
        if any(r.request_id in held for r in requests):
            raise ValueError("duplicate request id")
        self.queue += list(requests)

    def pending(self) -> int:
        return len(self.queue)

    def step(self) -> list[GenResult]:
        r = self.queue.pop(0)
        one = torch.tensor([1])
        return [GenResult(r.request_id, torch.tensor(r.prompt_ids), one, one.float(), one.int(), "eos")]


def test_a_group_reissued_when_part_of_it_has_finished_is_not_submitted_again(tmp_path):
    node = GenerateNode()
    node.engine, node.tokenizer, node.stops, node.note = OneAtATime(), make_tokenizer(), [], lambda *a: None
    node.chat = False
    group = Batch({"prompt": ["def f(x):\n"], "group_id": torch.tensor([7]), "sample_id": torch.tensor([7])})
    meta = GroupMeta(group=7, samples=2, admitted_at=0)
    node.submit(group, meta)
    assert node.step() == []  # sample 14 finished, 15 still in flight
    node.submit(group, meta)  # the controller re-issues the group: the engine must not see 15 again
    done = node.step()
    assert len(done) == 1 and done[0][0]["sample_id"].tolist() == [14, 15] and node.pending() == 0


def test_a_prompt_that_is_not_text_or_reads_as_no_tokens_fails_its_samples_and_the_batch_runs_on():
    class Bytes:  # a tokenizer that adds no special tokens: "" reads as nothing
        def encode(self, text):
            return list(text.encode())

    node = GenerateNode()
    node.engine, node.tokenizer, node.stops, node.note, node.chat = OneAtATime(), Bytes(), [], lambda *a: None, False
    node._decode = lambda ids: ""
    batch = Batch({"prompt": ["def f(x):\n", 42, ""], "group_id": torch.tensor([-1, -2, -3]),
                   "sample_id": torch.tensor([-1, -2, -3])})  # held-out copies: many prompts in one batch
    node.submit(batch, GroupMeta(group=-1, samples=1, admitted_at=0, eval=True))
    done = []
    while node.pending():
        done += node.step()
    assert node.engine.queue == [] and len(done) == 1
    assert done[0][0][FAILED] == [
        None, "its prompt is int 42, not text or chat messages [{'role': str, 'content': str}, ...]",
        "its prompt is empty"]


CHATML_LIKE = ("{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_prompt_of_chat_messages_keeps_its_roles_in_the_template_and_reads_as_its_text_without_one():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add 1"}]
    read, failed = {}, {}
    for uses_chat in (True, False):
        node = GenerateNode()
        node.engine, node.stops, node.note, node.chat = OneAtATime(), [], lambda *a: None, uses_chat
        node.tokenizer = make_tokenizer(chat_template=CHATML_LIKE)
        node._decode = lambda ids: ""
        batch = Batch({"prompt": [chat, [{"role": "user"}]], "group_id": torch.tensor([-1, -2]),
                       "sample_id": torch.tensor([-1, -2])})
        node.submit(batch, GroupMeta(group=-1, samples=1, admitted_at=0, eval=True))
        done = []
        while node.pending():
            done += node.step()
        read[uses_chat] = node.tokenizer.decode(done[0][0]["prompt_ids"].rows()[0].tolist())
        failed[uses_chat] = done[0][0][FAILED][1]
    assert read == {True: "<system>Be brief.\n<user>add 1\n<assistant>", False: "<bos>Be brief.\n\nadd 1"}
    assert failed[True] == failed[False] == (
        "its prompt is list [{'role': 'user'}], not text or chat messages [{'role': str, 'content': str}, ...]")


@pytest.mark.eval
def test_prompts_go_through_the_chat_template_of_a_model_that_has_one_unless_it_is_off(tmp_path, monkeypatch):
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with 'accelerate' (areal[eval])")
    from tests.models.gguf_writer import tiny_llama, write_gguf

    monkeypatch.setenv("AREAL_CACHE", str(tmp_path / "cache"))
    model = str(write_gguf(tiny_llama(), tmp_path / "tiny.gguf"))
    prompts, stops = {}, {}
    for setting in ("auto", "off"):
        node = GenerateNode()
        config = RunConfig(model=model, group_size=1, generation=GenerationConfig(
            max_new_tokens=2, tasks_stop=["\n\n"], chat_template=setting))  # as a code run settles them
        node.setup(SimpleNamespace(config=config, run_dir=tmp_path, version=0, resume_dir=None, weights_group=None,
                                   published_weights=lambda version: tmp_path / "none", resumed_policy=lambda: None,
                                   note=lambda sample_ids, reasons: None, report=None))
        node.submit(Batch({"prompt": ["2+2?"], "group_id": torch.tensor([0]), "sample_id": torch.tensor([0])}),
                    GroupMeta(group=0, samples=1, admitted_at=0))
        done = []
        while node.pending():
            done += node.step()
        prompts[setting] = node.tokenizer.decode(done[0][0]["prompt_ids"].rows()[0].tolist())
        stops[setting] = (node.stops, node.engine.stop_strings)
    assert prompts == {"auto": "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", "off": "2+2?"}
    # the tasks' stop strings end a plain prompt's continuation; a chat reply ends at its turn's end token
    assert stops == {"auto": ([], []), "off": (["\n\n"], ["\n\n"])}


def wire_report(kind: str, **fields) -> Message:
    """What the worker's `context.report` does with a node's report: one control message, checked."""
    return parse({"type": kind, "node": "generate", **fields}, "rollout[0]")


def two_slot_emulated_node(tmp_path, report=wire_report):
    """An emulated generate node of two slots whose samples run 40 tokens or so, at version 0."""
    config = RunConfig(group_size=2, generation=GenerationConfig(engine="emulated", max_new_tokens=64, max_batch=2,
                                                                 stop=[]),
                       trainer={"engine": "emulated"}, emulation={"output_tokens_median": 40, "time_scale": 1e-6})
    node = GenerateNode()
    node.setup(SimpleNamespace(config=config, run_dir=tmp_path, version=0, resume_dir=None, weights_group=None,
                               published_weights=lambda version: tmp_path / "none", resumed_policy=lambda: None,
                               note=lambda sample_ids, reasons: None, report=report))
    return node


def test_a_group_holding_a_token_older_than_asked_is_aborted_whole_and_a_fresh_one_runs_on(tmp_path):
    node = two_slot_emulated_node(tmp_path)
    node.engine.quantum_s = 1e-12  # one decode step per step(): nothing finishes before the abort
    for group in (3, 4):  # group 3's two samples fill both slots; group 4 waits
        node.submit(Batch({"prompt": ["1+1="], "group_id": torch.tensor([group]), "sample_id": torch.tensor([group])}),
                    GroupMeta(group=group, samples=2, admitted_at=0))
    node.step()
    node.engine.update_weights({}, version=2)
    assert node.abort_older_than(0) == []  # version 0's tokens are not older than version 0
    aborted = node.abort_older_than(1)
    assert [(meta.group, ids) for meta, ids, _ in aborted] == [(3, [6, 7])]
    assert aborted[0][2] == [2, 2]  # each sampled a token at the prefill and one decode step
    done = []
    while node.pending():
        done += node.step()
    assert [meta.group for _, meta in done] == [4] and done[0][0]["sample_id"].tolist() == [8, 9]
    assert all(int(v.min()) == 2 for v in done[0][0]["versions"].rows())  # it started on the new weights


def test_a_group_stamped_too_long_ago_is_requeued_with_its_tokens_restamped_and_finishes_on_newer_weights(tmp_path):
    node = two_slot_emulated_node(tmp_path)
    node.engine.quantum_s = 1e-12  # one decode step per step(): nothing finishes before the re-queue
    for group in (3, 4):  # group 3's two samples fill both slots; group 4 waits
        node.submit(Batch({"prompt": ["1+1="], "group_id": torch.tensor([group]), "sample_id": torch.tensor([group])}),
                    GroupMeta(group=group, samples=2, admitted_at=0))
    node.step()
    node.engine.update_weights({}, version=2)
    assert node.recycle_stamped_before(0) == []  # both were stamped at version 0
    recycled = node.recycle_stamped_before(1)
    assert [(meta.group, meta.stamped_at, tokens) for meta, tokens in recycled] == [(3, 2, 4), (4, 2, 0)]
    done = []
    while node.pending():
        done += node.step()
    assert [meta.group for _, meta in done] == [3, 4]  # 3 took its slots back, ahead of 4, which still waited
    assert [meta.stamped_at for _, meta in done] == [2, 2]
    for versions in done[0][0]["versions"].rows():  # its two tokens from version 0 kept, the rest sampled at 2
        assert versions[:2].tolist() == [0, 0] and set(versions[2:].tolist()) == {2}


def test_the_node_version_is_its_engine_version_so_tokens_and_admission_read_one_count(tmp_path):
    node = two_slot_emulated_node(tmp_path)
    node.load_weights({}, 3)  # a version that travelled (files, shm)
    assert (node.version, node.engine.version) == (3, 3)
    node.version = 5  # a version it holds already (taken in a collective), named by the worker
    assert node.engine.version == 5
    node.submit(Batch({"prompt": ["1+1="], "group_id": torch.tensor([0]), "sample_id": torch.tensor([0])}),
                GroupMeta(group=0, samples=2, admitted_at=5))
    done = []
    while node.pending():
        done += node.step()
    (batch, meta), = done
    assert meta.stamped_at == 5 and {int(v) for row in batch["versions"].rows() for v in row} == {5}


def test_each_weight_update_reports_the_engine_time_per_phase_since_the_last_with_the_re_read_rows_apart(tmp_path):
    reports: list[Message] = []
    node = two_slot_emulated_node(tmp_path, report=lambda kind, **fields: reports.append(wire_report(kind, **fields)))
    node.engine.quantum_s = 1e-12  # one decode step per step()
    node.submit(Batch({"prompt": ["1+1="], "group_id": torch.tensor([3]), "sample_id": torch.tensor([3])}),
                GroupMeta(group=3, samples=2, admitted_at=0))
    node.step()  # both samples read their prompt and take one decode step
    node.load_weights({}, 1)
    first = node.engine.time_split()
    node.step()  # both rows re-read under version 1, one decode step; no newcomer
    node.load_weights({}, 2)
    spent = {phase: seconds - first[phase] for phase, seconds in node.engine.time_split().items()}
    assert all(isinstance(r, NodeMetrics) and r.node == "generate" for r in reports) and len(reports) == 2
    assert reports[0].values["generator_rebuild_share"] == 0 and reports[0].values["generator_prefill_share"] > 0
    assert spent["prefill"] == 0 and spent["rebuild"] > 0
    assert reports[1].values == pytest.approx({f"generator_{phase}_share": seconds / sum(spent.values())
                                               for phase, seconds in spent.items()})
