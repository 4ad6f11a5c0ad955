"""Branches, a join, explicit producers and a filter, with no model: the graph as declared is what runs.

Two judges score every sample side by side, in pools of their own: judge_a gives its sample id
+ 0.25, judge_b its id + 0.5, both on a port named `score`, so a row joined to another sample's
score shows. `combine` joins the branches and names each producer with `take=`: its advantage is
judge_a's score and its reward judge_b's, which the fake trainer records. FAKE_UNEVEN_WORK gives
judge_b that much work on odd groups only, so its replicas finish groups out of order. With
FAKE_FILTER=1 a filter drops every group whose number is a multiple of 3, whole; with FAKE_SPREAD=FILE too, a
node after it reduces over its rows as natural code does (`r.max() - r.min()`, which no row would break) and
appends each call's row count to FILE.
"""

import os

from areal import Float, Graph, Int, RunConfig, node
from tests.runtime.fake_nodes import Counting, FakeGenerate, FakeTrainer, compute, every_third_group, knob

BRANCH_WORK = knob("FAKE_BRANCH_WORK", 0)  # matmuls per batch in each judge
UNEVEN_WORK = knob("FAKE_UNEVEN_WORK", 0)  # more matmuls in judge_b, on odd groups


@node(inputs={"output_ids": Int["S", "T"], "sample_id": Int["S"]}, outputs={"score": Float["S"]})
def judge_a(batch):
    compute(BRANCH_WORK)
    return {"score": batch["sample_id"].double() + 0.25}


@node(inputs={"output_ids": Int["S", "T"], "sample_id": Int["S"], "group_id": Int["S"]},
      outputs={"score": Float["S"]})
def judge_b(batch):
    compute(BRANCH_WORK + UNEVEN_WORK * (int(batch["group_id"][0]) % 2))
    return {"score": batch["sample_id"].double() + 0.5}


@node(inputs={"score": Float["S"], "other": Float["S"]}, outputs={"advantage": Float["S"], "reward": Float["S"]})
def combine(batch):
    return {"advantage": batch["score"], "reward": batch["other"]}


@node(inputs={"reward": Float["S"]}, outputs={"spread": Float["S"]})
def spread(batch):
    r = batch["reward"]
    with open(os.environ["FAKE_SPREAD"], "a") as calls:  # the rows of every call, before anything can raise
        calls.write(f"{len(r)}\n")
    return {"spread": (r.max() - r.min()).expand(len(r))}


config = RunConfig(batch_size=2, group_size=3, staleness=1, steps=4)
g = Graph("branched")
g.source("tasks", Counting())
g.add(FakeGenerate, name="rollout")
g.add(judge_a, pool=1)
g.add(judge_b, pool=1)
g.add(combine, take={"score": "judge_a.score", "other": "judge_b.score"})
if os.environ.get("FAKE_FILTER"):
    g.add(every_third_group)
if os.environ.get("FAKE_SPREAD"):
    g.add(spread)
g.add(FakeTrainer, name="actor")
