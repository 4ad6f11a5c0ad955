"""A two-turn episode recipe on a real model: write, read a tool's answer, write again.

The model is a tiny local checkpoint the test writes (`--set model=DIR`). The tool (run in a thread,
as a sandbox call would be) counts the first reply's characters; the reward is the vowel share of both
replies. With EPISODE_LOG=DIR each episode appends `start`/`end` lines (its sample id and process) to
DIR/log, and the episode whose sample id is EPISODE_KILL_AT kills its own worker between its turns,
once (a marker file says it happened): a worker killed mid-episode, at a known point.
"""

import asyncio
import os
import signal
from pathlib import Path

from areal import Float, Graph, Int, RunConfig, node
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, episode, ppo_update
from tests.runtime.tiny_rl import Prompts


def _log(line: str) -> None:
    folder = os.environ.get("EPISODE_LOG")
    if folder:
        with open(Path(folder) / "log", "a") as out:
            out.write(f"{line} {os.getpid()}\n")


async def write_twice(task, llm):
    _log(f"start {llm.sample_id}")
    first = await llm.generate(task["prompt"])
    kill_at = os.environ.get("EPISODE_KILL_AT")
    if kill_at is not None and llm.sample_id == int(kill_at):
        marker = Path(os.environ["EPISODE_LOG"]) / "killed"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    said = await asyncio.to_thread(len, first.text)
    second = await llm.generate(f"\n# {said} chars\n")
    text = first.text + second.text
    _log(f"end {llm.sample_id}")
    return sum(c in "aeiou" for c in text) / max(len(text), 1)


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def advantage(batch):
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


config = RunConfig(batch_size=2, group_size=3, steps=6, staleness=1, trainer={"lr": 1e-3},
                   generation={"max_new_tokens": 6}, eval={"interval_steps": 0})
g = Graph("episode-rl")
g.source("tasks", Prompts())
g.add(episode("writer", write_twice))  # prompt_ids, output_ids, loss_mask, behav_logp, versions, reward, turns
g.add(advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # trains the sampled tokens only
