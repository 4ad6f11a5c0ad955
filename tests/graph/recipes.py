"""Small recipe texts for the graph tests. Line numbers matter: tests assert them."""

HEADER = """\
from areal import Graph, RunConfig, node, Float, Int, Json
from areal.graph.ports import Int as I

class Tasks:
    ports = {"prompt": Json["S"]}
    def __iter__(self):
        return iter([{"prompt": "a"}])

@node(inputs={"prompt": Json["S"]}, outputs={"output_ids": Int["S", "T"]})
def gen(batch):
    return {}

@node(inputs={"output_ids": Int["S", "T"]}, outputs={"reward": Float["S"]})
def score(batch):
    return {}

@node(inputs={"reward": Float["S"]}, outputs={"advantage": Float["S"]})
def adv(batch):
    return {}

@node(inputs={"reward": Float["S", "T"]}, outputs={"advantage": Float["S"]})
def token_adv(batch):
    return {}

@node(inputs={"advantage": Float["S"]}, outputs={"reward": Float["S"]})
def feedback(batch):
    return {}


"""
# HEADER is 29 lines; recipe bodies start at line 30.
GOOD = HEADER + """\
g = Graph("ok")
g.source("tasks", Tasks())
g.add(gen)
g.add(score)
g.add(adv)
"""
MISSING_PRODUCER = HEADER + """\
g = Graph("missing")
g.source("tasks", Tasks())
g.add(score)
"""
TYPE_MISMATCH = HEADER + """\
g = Graph("mismatch")
g.source("tasks", Tasks())
g.add(gen)
g.add(score)
g.add(token_adv)
"""
CYCLE = HEADER + """\
g = Graph("cycle")
g.source("tasks", Tasks())
g.add(adv)
g.add(feedback)
"""
TWO_PRODUCERS = HEADER + """\
g = Graph("two")
g.source("tasks", Tasks())
g.add(gen)
g.add(score)
g.add(score, name="score2")
g.add(adv)
"""
DUPLICATE = HEADER + """\
g = Graph("dup")
g.source("tasks", Tasks())
g.add(gen)
g.add(gen)
"""
