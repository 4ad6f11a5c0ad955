"""What a staleness policy costs the trainer per step: the mask and the re-check, on one 32-generator step.

    python benchmarks/bench_policy_check.py                      # this checkout
    python benchmarks/bench_policy_check.py --baseline DIR       # and a copy of another version's areal/ beside it

The step of bench_scale's 32-generator runs: 64 groups of 8 samples, log-normal output lengths
around 1024 (σ = 0.6), each sample's tokens split between a version older than η and a fresh one,
so `token` masks and every check reads every token. It runs on the trainer's critical path: a step
waits for it. Best of 5, milliseconds; with --baseline each row also runs in a child process on the
other version's code, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

POLICIES = ("strict", "drop", "token", "recycle")
SAMPLES, GROUP, STEP, ETA = 512, 8, 10, 2


def measure() -> dict[str, float]:
    """Milliseconds per step (best of 5) of each policy's mask and check, on the code importable here."""
    import torch

    from areal.graph.batch import Batch, Ragged
    from areal.graph.meta import GroupMeta
    from areal.runtime.staleness.policies import POLICIES as TABLE
    from areal.runtime.staleness.policies.enforce import checked_step, with_policy_mask

    torch.set_num_threads(1)  # as the emulated trainer's process: 2 threads on 2 busy cores cost 10x more
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.randn(SAMPLES, generator=g) * 0.6 + 6.93).clamp(1, 8192).long().tolist()
    cuts = [int(torch.randint(0, n, (1,), generator=g)) for n in lengths]
    best: dict[str, float] = {}
    for name in POLICIES:
        policy = TABLE[name]
        old = STEP - ETA - 1 if policy.masks else STEP - ETA  # masked policies get tokens to mask
        rows = [torch.cat([torch.full((c,), old, dtype=torch.int32), torch.full((n - c,), STEP, dtype=torch.int32)])
                for n, c in zip(lengths, cuts)]
        view = Batch({"versions": Ragged.from_rows(rows), "group_id": torch.arange(SAMPLES) // GROUP,
                      "sample_id": torch.arange(SAMPLES)})
        groups = [GroupMeta(group=i, samples=GROUP, admitted_at=old, slot=i, stamped_at=STEP - ETA)
                  for i in range(SAMPLES // GROUP)]
        times = []
        for _ in range(5):
            start = time.perf_counter()
            masked = with_policy_mask(view, STEP, ETA)[0] if policy.masks else view
            checked_step(policy, masked, STEP, ETA, SAMPLES // GROUP, groups)
            times.append(time.perf_counter() - start)
        best[name] = 1000 * min(times)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a folder holding another version's areal/ package")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's answer
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure()))
        return
    ours = measure()
    base = None
    if args.baseline is not None:
        env = {**os.environ, "PYTHONPATH": str(args.baseline)}
        line = subprocess.run([sys.executable, __file__, "--json"], env=env, check=True, capture_output=True,
                              text=True, cwd=args.baseline).stdout
        base = json.loads(line)
    print(f"{SAMPLES} samples, ~{SAMPLES * 1024 // 1000}k output tokens per step, best of 5 (ms)")
    print(f"{'policy':>8} {'ours':>8}" + (f" {'baseline':>9} {'speed-up':>9}" if base else ""))
    for name in POLICIES:
        line = f"{name:>8} {ours[name]:>8.1f}"
        if base and name in base:
            line += f" {base[name]:>9.1f} {base[name] / ours[name]:>8.1f}x"
        print(line)


if __name__ == "__main__":
    main()
