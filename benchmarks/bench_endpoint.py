"""The OpenAI-compatible endpoint's cost: per request against the in-process `llm`, and requests/s at 64 episodes.

    python benchmarks/bench_endpoint.py                 # builtin:tiny-coder, 3 repeats
    python benchmarks/bench_endpoint.py --repeats 1     # quicker

The same agent runs three ways, on one episode runner (nodes/episodes/worker.py) in this process: calling
`llm.complete` in-process, posting to `/v1/completions` with aiohttp, and with the official `openai` client.
Each turn sends the whole text so far and asks for `--tokens` new tokens, so what differs between the ways
is only the HTTP round trip, JSON, the session lookup and the client library. The agent's client runs on the
episodes' own event loop, as an agent inside an episode does, so its CPU counts too.
- latency: one episode of `--turns` turns at a time: milliseconds per request;
- throughput: 64 concurrent episodes (`--episodes`) of 8 turns: requests/s and sampled tokens/s.
Needs the agent extra (aiohttp, openai).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from areal.config import RunConfig
from areal.graph.batch import Batch
from areal.graph.meta import GroupMeta
from areal.graph.roles import FAILED
from areal.nodes.episodes.worker import local_runner


def agent(way: str, turns: int, tokens: int) -> Any:
    async def run(task: dict, llm: Any) -> float:
        text = task["prompt"]
        if way == "in-process":
            for _ in range(turns):
                text += (await llm.complete(text, max_new_tokens=tokens)).text + "\n# next\n"
        elif way == "aiohttp":
            import aiohttp

            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {llm.api_key}"}) as http:
                for _ in range(turns):
                    async with http.post(f"{llm.base_url}/completions",
                                         json={"model": "p", "prompt": text, "max_tokens": tokens}) as reply:
                        text += (await reply.json())["choices"][0]["text"] + "\n# next\n"
        else:
            import openai

            async with openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
                for _ in range(turns):
                    reply = await client.completions.create(model="p", prompt=text, max_tokens=tokens)
                    text += reply.choices[0].text + "\n# next\n"
        return 0.0

    return run


def measure(config: RunConfig, way: str, episodes: int, turns: int, tokens: int) -> tuple[float, int, int]:
    """(wall seconds, requests, sampled tokens) of `episodes` concurrent episodes of `turns` turns."""
    runner = local_runner(agent(way, turns, tokens), config, endpoint=way != "in-process")
    runner.policy.engine.eos_token_id = -1  # every turn samples exactly `tokens`: the ways do equal work
    ids = torch.arange(episodes)
    started = time.perf_counter()
    runner.submit(Batch({"prompt": ["# add 1 to x\ndef f(x):\n"] * episodes, "group_id": ids,
                         "sample_id": ids.clone()}), GroupMeta(group=0, samples=1, admitted_at=0))
    done = []
    while runner.pending():
        done += runner.step()
    wall = time.perf_counter() - started
    runner.close()
    (batch, _), = done
    failures = [why for why in batch[FAILED] if why]
    if failures:
        raise SystemExit(f"{way}: an episode failed: {failures[0]}")
    return wall, int(batch["turns"].sum()), int(batch["loss_mask"].values.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:tiny-coder")
    parser.add_argument("--turns", type=int, default=30, help="turns of the one-episode latency run")
    parser.add_argument("--tokens", type=int, default=4, help="new tokens per request")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = RunConfig(model=args.model, generation={"max_new_tokens": 64, "stop": [], "max_batch": args.episodes})
    ways = ("in-process", "aiohttp", "openai")
    latency: dict[str, list[float]] = {w: [] for w in ways}
    throughput: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    for _ in range(args.repeats):  # interleaved, so a slow moment of the machine is shared
        for way in ways:
            wall, requests, _ = measure(config, way, 1, args.turns, args.tokens)
            latency[way].append(1000 * wall / requests)
            wall, requests, tokens = measure(config, way, args.episodes, 8, args.tokens)
            throughput[way].append((requests / wall, tokens / wall))
    base = statistics.mean(latency["in-process"])
    print(f"{args.model}, {args.tokens} new tokens per request, {args.repeats} repeats (mean ± stdev)")
    print(f"{'way':<12}{'ms/request (1 episode)':>26}{'overhead ms':>14}"
          f"{f'requests/s ({args.episodes} episodes)':>30}{'tokens/s':>12}{'vs in-process':>15}")
    for way in ways:
        ms, rps = latency[way], [r for r, _ in throughput[way]]
        spread = statistics.stdev(ms) if len(ms) > 1 else 0.0
        rps_spread = statistics.stdev(rps) if len(rps) > 1 else 0.0
        ratio = statistics.mean(rps) / statistics.mean(r for r, _ in throughput["in-process"])
        print(f"{way:<12}{statistics.mean(ms):>18.2f} ± {spread:<5.2f}{statistics.mean(ms) - base:>14.2f}"
              f"{statistics.mean(rps):>22.1f} ± {rps_spread:<5.1f}"
              f"{statistics.mean(t for _, t in throughput[way]):>12.0f}{ratio:>14.2f}x")


if __name__ == "__main__":
    main()
