"""Kernel benchmarks: chunked token logprobs vs the naive log-softmax, packing vs padding.

    python benchmarks/bench_kernels.py [--tokens 8192 --vocab 32768 --repeats 3]

Memory: every variant runs in a fresh subprocess. The logits (shared by both variants) are created
first and the resident set size read right after; the variant's peak extra memory is the process's
peak RSS (getrusage ru_maxrss) minus that baseline, so the logits count the same for both and
their gradient counts for both. Time: median of `--repeats` forward+backward passes after that
first, measured one. CPU timings on a shared machine are noisy; the memory figures are not.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from areal.kernels import balance_across_ranks, pack_microbatches, padding_waste, token_logprobs

MIB = 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _run_variant(variant: str, logits: torch.Tensor, tokens: torch.Tensor, backward: bool) -> None:
    with torch.set_grad_enabled(backward):
        if variant == "naive":
            logp = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None]).squeeze(1)
        else:
            logp = token_logprobs(logits, tokens)
        if backward:
            logp.sum().backward()
    logits.grad = None


def child(variant: str, tokens_n: int, vocab: int, dtype: str, backward: bool, repeats: int) -> dict:
    """Run one variant in this (fresh) process and report its peak extra memory and time."""
    torch.manual_seed(0)
    logits = torch.randn(tokens_n, vocab, dtype=getattr(torch, dtype), requires_grad=backward)
    tokens = torch.randint(0, vocab, (tokens_n,))
    baseline, peak_before = _rss_bytes(), _peak_rss_bytes()
    start = time.perf_counter()
    _run_variant(variant, logits, tokens, backward)
    first_s = time.perf_counter() - start
    peak_extra = _peak_rss_bytes() - baseline
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _run_variant(variant, logits, tokens, backward)
        times.append(time.perf_counter() - start)
    return {
        "peak_extra_mib": peak_extra / MIB,
        "setup_overshoot_mib": max(peak_before - baseline, 0) / MIB,  # > 0 would taint the peak reading
        "time_s": statistics.median(times) if times else first_s,
    }


def _spawn(variant: str, args: argparse.Namespace, dtype: str, backward: bool) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--dtype",
        dtype,
        "--tokens",
        str(args.tokens),
        "--vocab",
        str(args.vocab),
        "--repeats",
        str(args.repeats),
    ]
    if not backward:
        cmd.append("--forward-only")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def logprob_table(args: argparse.Namespace) -> None:
    logits_mib = args.tokens * args.vocab * 4 / MIB
    print(
        f"token logprobs, T={args.tokens}, V={args.vocab} (float32 logits = {logits_mib:.0f} MiB), "
        f"{torch.get_num_threads()} threads, chunk_size=1024"
    )
    header = f"{'logits':9} {'pass':13} {'naive MiB':>10} {'chunked MiB':>12} {'mem ratio':>10} "
    print(header + f"{'excl. grad':>11} {'naive s':>8} {'chunked s':>10} {'time ratio':>11}")
    for dtype in ("float32", "bfloat16"):
        for backward in (True, False):
            naive = _spawn("naive", args, dtype, backward)
            chunked = _spawn("chunked", args, dtype, backward)
            for name, r in (("naive", naive), ("chunked", chunked)):
                if r["setup_overshoot_mib"] > 16:
                    print(f"  warning: {name} setup overshot its baseline by {r['setup_overshoot_mib']:.0f} MiB")
            mem_ratio = naive["peak_extra_mib"] / max(chunked["peak_extra_mib"], 1e-9)
            # the logits' own gradient ([T, V], logits dtype) is allocated by every method alike
            grad_mib = args.tokens * args.vocab * getattr(torch, dtype).itemsize / MIB if backward else 0.0
            excl = (naive["peak_extra_mib"] - grad_mib) / max(chunked["peak_extra_mib"] - grad_mib, 1e-9)
            time_ratio = chunked["time_s"] / naive["time_s"]
            label = "fwd+bwd" if backward else "fwd (no_grad)"
            print(
                f"{dtype:9} {label:13} {naive['peak_extra_mib']:10.0f} {chunked['peak_extra_mib']:12.0f} "
                f"{mem_ratio:9.1f}x {excl:10.1f}x {naive['time_s']:8.2f} {chunked['time_s']:10.2f} "
                f"{time_ratio:10.2f}x"
            )
    print("mem ratio = naive / chunked peak extra memory (higher is better; target >= 4x for fwd+bwd)")
    print("excl. grad = the same ratio after taking the [T, V] logits gradient out of both sides")
    print("time ratio = chunked / naive time (lower is better; target <= 1.2x)")


def packing_table() -> None:
    rng = random.Random(0)
    budget, n_seqs, batch_rows = 16384, 1024, 8
    lengths = [max(1, min(int(rng.lognormvariate(6.0, 1.0)), budget)) for _ in range(n_seqs)]
    total = sum(lengths)
    bins = pack_microbatches(lengths, budget)
    packed_slack = 1 - total / (len(bins) * budget)
    arrival = [list(range(i, min(i + batch_rows, n_seqs))) for i in range(0, n_seqs, batch_rows)]
    by_length = sorted(range(n_seqs), key=lambda i: lengths[i])
    bucketed = [by_length[i : i + batch_rows] for i in range(0, n_seqs, batch_rows)]
    print()
    print(f"packing, {n_seqs} lognormal(6, 1) lengths: mean {total / n_seqs:.0f}, max {max(lengths)}, {total} tokens")
    print(f"{'layout':52} {'batches':>8} {'waste':>7}")
    print(
        f"{'packed, budget ' + str(budget) + ' (unused budget; no pad tokens)':52} {len(bins):8d} "
        f"{packed_slack:7.1%}   (lower bound {math.ceil(total / budget)} micro-batches)"
    )
    print(
        f"{f'padded, {batch_rows} rows/batch in arrival order':52} {len(arrival):8d} "
        f"{padding_waste(lengths, arrival):7.1%}"
    )
    print(
        f"{f'padded, {batch_rows} rows/batch sorted by length':52} {len(bucketed):8d} "
        f"{padding_waste(lengths, bucketed):7.1%}"
    )
    loads = [sum(lengths[i] for i in r) for r in balance_across_ranks(lengths, 8)]
    gap = max(loads) - min(loads)
    print(f"across 8 ranks (Karmarkar-Karp): loads {min(loads)}..{max(loads)}, gap {gap} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["naive", "chunked"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--forward-only", action="store_true")
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.tokens, args.vocab, args.dtype, not args.forward_only, args.repeats)
        print(json.dumps(result))
        return
    logprob_table(args)
    packing_table()


if __name__ == "__main__":
    main()
