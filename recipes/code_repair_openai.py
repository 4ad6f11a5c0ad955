"""recipes/code_repair.py's agent, written against the OpenAI API: an existing agent, trained unchanged.

    pip install -c constraints.txt 'areal[agent]'   # aiohttp (the endpoint) and openai (this agent's client)
    areal run recipes/code_repair_openai.py

`repair` below only knows an OpenAI base URL and an API key. Each episode gets its own key
(`llm.api_key`), which names its session at the endpoint the episode worker serves
(`llm.base_url`, on 127.0.0.1); every completion the agent asks for is sampled by the policy being
trained, and recorded as sampled. The built-in tiny coder has no chat template, so the agent uses
`/v1/completions`, sending its whole text so far each turn (the endpoint checks that it extends the
session's text and adds only what is new). A chat model would use `client.chat.completions.create`
with its messages; the template is applied once, server-side. The reward could equally be posted
(`POST /v1/reward`) by an agent that does not return it.
"""

import asyncio

from areal import Float, Graph, Int, RunConfig, node
from areal.data import code_tasks
from areal.data.code_repair import feedback, split_tests
from areal.kernels.advantage import group_normalise
from areal.nodes import compute_logprob, episode, ports, ppo_update
from areal.rewards import code_tests

TURNS = 3  # attempts per episode: the first, and up to two repairs
config = RunConfig(model="builtin:tiny-repairer", batch_size=16, group_size=8, staleness=2, steps=60)
judge = code_tests(timeout_s=2.0)


async def repair(task, llm):
    """The agent: any OpenAI client pointed at the episode's base URL and key."""
    import openai

    public, hidden = split_tests(task["tests"])
    # no retries (a repeated request would be a second turn) and the episode's own time limit, not the client's
    # 5-second connect timeout: hundreds of episodes of a held-out round connect at once to one busy worker
    async with openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=600.0) as client:
        text = task["prompt"]
        for turn in range(TURNS):
            reply = await client.completions.create(model="policy", prompt=text)  # the run's max_new_tokens
            body = reply.choices[0].text
            program = task["prompt"] + body
            if turn == TURNS - 1:
                break
            check = await asyncio.to_thread(judge.score, program, public)
            if check.reason is None:
                break
            text += body + feedback(check, task["prompt"])
    return (await asyncio.to_thread(judge.score, program, hidden)).reward


@node(inputs={"reward": Float["S"], "group_id": Int["S"]}, outputs={"advantage": Float["S"]})
def group_advantage(batch):
    """GRPO: centre each reward on its prompt group and scale by the group's spread."""
    return {"advantage": group_normalise(batch["reward"], batch["group_id"])}


g = Graph("code-repair-openai")
g.source("tasks", code_tasks("train"), heldout=code_tasks("test"))  # task_id, prompt, tests
g.add(episode("repair", repair, inputs={"prompt": ports.PROMPT, "tests": ports.TESTS}, max_new_tokens=48,
              endpoint=True), pool=1)  # prompt_ids, output_ids, loss_mask, behav_logp, versions, reward, turns
g.add(group_advantage)  # advantage
g.add(compute_logprob("proximal"))  # prox_logp
g.add(ppo_update("actor"))  # masked by loss_mask: feedback tokens are not trained
