"""What a node returns is checked against its ports: a broken contract stops the run naming node and port;
a NaN or inf fails the samples it sits in, with the reason, and the run goes on."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from areal.cli.run import build_controller
from areal.errors import NodeContractError, RunError
from areal.graph import Float, Graph, Int, Json, node
from areal.graph.batch import Batch, Ragged
from areal.runtime.worker.outputs import checked_outputs

RECIPE = Path(__file__).with_name("fake_rl.py")


@node(inputs={"prompt": Json["S"]}, outputs={"score": Float["S"], "logp": Float["S", "T"], "ids": Int["S"]})
def scorer(batch):
    return {}


SCORER = Graph("g").add(scorer)
BATCH = Batch({"prompt": ["a", "b", "c"], "sample_id": torch.arange(3)})


def check(**out):
    full = {"score": torch.zeros(3), "logp": Ragged.from_rows([torch.zeros(2)] * 3),
            "ids": torch.zeros(3, dtype=torch.int64)}
    return checked_outputs(SCORER, BATCH, {**full, **out})


@pytest.mark.parametrize(("value", "says"), [
    (torch.zeros(3, dtype=torch.int64), "output 'score' is declared float32[S] but holds int64 values"),
    (torch.zeros(3, 5), "output 'score' is declared float32[S], so it must be a tensor of shape [S]; got shape [3, 5]"),
    (torch.tensor(1.0), "output 'score' is declared float32[S], so it must be a tensor of shape [S]; got shape []"),
    (torch.zeros(4), "output 'score' has 4 rows for a batch of 3"),
    ("0.5", "output 'score' is declared float32[S] and must be a tensor (or a list or numpy array of one number a "
            "sample), got str"),
    ([0.5, "x", 1.0], "output 'score' is declared float32[S]: its list must hold numbers"),
    ([0.5, 1.0], "output 'score' has 2 rows for a batch of 3"),
    ([0.5, 1.5, 2.0], "output 'ids' is declared int64[S] but holds float32 values"),  # never truncated to ints
])
def test_a_broken_contract_names_the_node_the_port_and_what_differs(value, says):
    port = says.split("'")[1]
    with pytest.raises(NodeContractError, match=r"node 'scorer' \(custom\): " + re.escape(says)):
        check(**{port: value})


def test_a_per_sample_output_may_be_a_list_or_numpy_array_of_numbers():
    out, failed = check(score=np.array([0.25, 1.0, 2.0], dtype=np.float64), ids=[4, 5, 6])
    assert out["score"].dtype == torch.float32 and out["score"].tolist() == [0.25, 1.0, 2.0]
    assert out["ids"].dtype == torch.int64 and out["ids"].tolist() == [4, 5, 6] and failed == {}
    for ints_or_bools in ([1, 0, 1], np.array([True, False, True])):  # as a reward function's are
        out, _ = check(score=ints_or_bools)
        assert out["score"].dtype == torch.float32 and out["score"].tolist() == [1.0, 0.0, 1.0]
    assert check(score=[0.0, float("nan"), 1.0])[1] == {1: "output 'score' is nan"}


@pytest.mark.parametrize(("value", "says"), [
    (torch.zeros(3, 4), "output 'logp' is declared float32[S,T] (per token) and must be a Ragged or a list of each "
                        "sample's values, got Tensor: a padded [samples, longest] tensor would count its padding as "
                        "tokens; Ragged.from_rows(rows) makes one"),
    ([torch.zeros(2, 2)] * 3, "output 'logp' is declared float32[S,T] (per token): each sample's values must have one "
                              "entry per token, got a 2-dimensional row"),
    ([[0.0], ["x"], [1.0]], "output 'logp' is declared float32[S,T] (per token): its list must hold each sample's "
                            "values"),
    ([torch.zeros(2)] * 4, "output 'logp' has 4 rows for a batch of 3"),
])
def test_a_per_token_output_that_is_no_ragged_or_list_of_rows_is_refused_saying_how_to_make_one(value, says):
    with pytest.raises(NodeContractError, match=r"node 'scorer' \(custom\): " + re.escape(says)):
        check(logp=value)


def test_a_per_token_output_may_be_a_list_of_each_samples_values_tensors_or_numbers():
    rows = [torch.tensor([0.5, 1.0], dtype=torch.float64), [2, 3, 4], []]
    out, failed = check(logp=rows)
    assert isinstance(out["logp"], Ragged) and out["logp"].values.dtype == torch.float32 and failed == {}
    assert out["logp"].lengths.tolist() == [2, 3, 0]
    assert out["logp"].values.tolist() == [0.5, 1.0, 2.0, 3.0, 4.0]


def test_values_are_cast_to_the_declared_dtype_and_non_finite_rows_fail_with_their_reason():
    out, failed = check(score=torch.tensor([1e39, 0.5, 2.0], dtype=torch.float64),  # inf once it is float32
                        logp=Ragged.from_rows([torch.zeros(2), torch.tensor([0.0, float("nan")]), torch.zeros(1)]),
                        ids=torch.zeros(3, dtype=torch.int32))
    assert out["score"].dtype == torch.float32 and out["ids"].dtype == torch.int64
    assert failed == {0: "output 'score' is inf", 1: "output 'logp' is nan"}


def _controller(tmp_path: Path, *overrides: str):
    recipe = tmp_path / "fake_rl.py"
    shutil.copy(RECIPE, recipe)
    return build_controller(recipe, ["steps=3", "batch_size=2", "group_size=2", *overrides], tmp_path / "run")


def test_nan_advantages_fail_their_samples_by_id_and_the_rest_train(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE", "nan_in_odd_samples")
    controller = _controller(tmp_path)
    controller.run()
    run = Path(controller.plan.run_dir)
    trained = sorted(s for line in (run / "trained.jsonl").read_text().splitlines()
                     for s in json.loads(line)["sample_ids"])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["kind"] == "failed"]
    assert trained == list(range(0, 12, 2))
    ids = {f["sample_id"] for f in failed}
    assert set(range(1, 12, 2)) <= ids and all(i % 2 for i in ids)  # later groups were in flight when it ended
    assert {f["reason"] for f in failed} == {"advantage: output 'advantage' is nan"}
    assert controller.accounting.summary()["trained"] == 6


def test_a_nan_under_fail_fast_stops_the_run_naming_node_sample_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ADVANTAGE", "nan_in_odd_samples")
    controller = _controller(tmp_path, "faults.policy=fail-fast")
    with pytest.raises(RunError, match=r"node 'advantage': sample 1 failed at version 0: output 'advantage' is nan "
                                       r"\(faults.policy=fail-fast"):
        controller.run()


@pytest.mark.parametrize("kind", ["int64", "two_dims", "scalar"])
def test_a_node_that_breaks_its_contract_stops_the_run_at_once_without_restarts(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("FAKE_ADVANTAGE", kind)
    monkeypatch.setenv("FAKE_ADVANTAGE_POOL", "1")  # its own worker, which the restart policy would restart
    controller = _controller(tmp_path)
    says = r"node 'advantage' \(custom\): output 'advantage' (is declared float32\[S\]|has)"
    with pytest.raises(RunError, match=says):
        controller.run()
    assert "restart" not in (Path(controller.plan.run_dir) / "metrics.jsonl").read_text()


@pytest.mark.parametrize(("knob", "says", "trained"), [
    (("FAKE_ADVANTAGE", "in_place"), r"node 'advantage' \(custom\): changed its input 'output_ids' "
                                     r"\(rollout.output_ids\) in place.*make a new tensor instead", False),
    (("FAKE_TRAIN_IN_PLACE", "1"), r"node 'actor' \(ppo-update\): changed its input 'advantage' "
                                   r"\(advantage.advantage\) in place", True),  # its step ran; none is reported
])
def test_a_node_or_trainer_that_writes_into_an_input_stops_the_run_naming_the_field(tmp_path, monkeypatch, knob,
                                                                                    says, trained):
    monkeypatch.setenv(*knob)
    controller = _controller(tmp_path)
    with pytest.raises(RunError, match=says):
        controller.run()
    assert controller.state.version == 0
    assert (Path(controller.plan.run_dir) / "trained.jsonl").exists() == trained  # a map node's: nothing trained


@pytest.mark.parametrize(("knob", "says"), [
    (("FAKE_ADVANTAGE", "nothing"), r"node 'advantage' \(custom\): returned NoneType None, not a dict of its outputs "
                                    r"by port \(advantage, reward, passed\)"),
    (("FAKE_ADVANTAGE", "worded_metric"), r"node 'advantage' \(custom\): its __metrics__ 'spread' is str 'wide', not "
                                          r"a number"),
    (("FAKE_ADVANTAGE", "undeclared"), r"node 'advantage' \(custom\): returned 'spread', which it does not declare "
                                       r"\(its outputs: advantage, reward, passed\); declare it in outputs="),
    (("FAKE_TRAIN_RETURNS_NOTHING", "1"), r"node 'actor' \(ppo-update\): returned NoneType None, not a dict of "
                                          r"numbers for the step's record \(\{\} for none\)"),
])
def test_a_node_that_returns_no_dict_stops_the_run_naming_it_and_what_it_returns(tmp_path, monkeypatch, knob, says):
    monkeypatch.setenv(*knob)
    with pytest.raises(RunError, match=says):
        _controller(tmp_path).run()


def test_a_batch_that_lost_every_row_carries_empty_columns_of_each_declared_type():
    from areal.runtime.worker.outputs import empty_outputs

    @node(inputs={"reward": Float["S"]}, outputs={"a": Float["S"], "b": Int["S", "T"], "c": Json["S"],
                                                  "d": Float["S", "4"]})
    def many(batch):
        raise AssertionError("never called")

    out = empty_outputs(Graph("g").add(many))
    assert out["a"].shape == (0,) and out["a"].dtype == torch.float32
    assert isinstance(out["b"], Ragged) and len(out["b"]) == 0 and out["b"].values.dtype == torch.int64
    assert out["c"] == [] and out["d"].shape == (0, 4)


def test_an_async_node_is_refused_saying_a_node_is_a_plain_function_and_leaves_no_unawaited_warning():
    import warnings

    from areal.runtime.worker.chain import returned

    @node(inputs={"reward": Float["S"]}, outputs={"advantage": Float["S"]})
    async def centred(batch):
        return {"advantage": batch["reward"] - batch["reward"].mean()}

    placed = Graph("g").add(centred)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine dropped unawaited warns as it is collected
        with pytest.raises(NodeContractError, match=r"node 'centred' \(custom\): returned a coroutine, and a node is "
                                                    r"called as a plain function whose result is never awaited; make "
                                                    r"it a def"):
            returned(placed, centred.instantiate()(Batch({"reward": torch.ones(2)})))
