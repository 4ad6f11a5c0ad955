"""The GPU suite in one call: every section in its own process, within one time budget, its tables and logs
written under one folder (the device tool brings back at most 8 files: tables.md, results.json, suite.log).

    python -m benchmarks.gpu.suite --out DIR                      # on a GPU: the 0.5B shapes, 20-step runs
    python -m benchmarks.gpu.suite --out DIR --device cpu --tiny  # the dry run the default tests make

A section that fails or runs out of time is a row saying so; the others still run. When the code_rl recipe
fails (a kernel that refuses the sandbox, say), math_rl, which needs no sandbox, is run in its place so the
async-vs-sync row still says how the runtime does on the device. `benchmarks/gpu/run.sh` is the device
machine's entry point (wheels, the gpu-marked tests, then this).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu.tables import render

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Section:
    key: str
    module: str
    variant: str
    limit_s: float  # at full size; the dry run shares the budget the same way
    spare: bool = False  # runs on what the others leave: never shrinks their share of the budget


# limits from the H200 (2026-11-29): training torch took 17 s, generation's timed rows 80 s, weights and code_rl
# together 155 s; with run.sh's budget less its tests (about 110 s) every section gets 0.92 of its limit
SECTIONS = (
    Section("training torch", "training", "torch", 40),
    Section("generation", "generation", "", 125),
    Section("recipe", "recipe", "code_rl", 150),
    Section("training fsdp", "training", "fsdp", 60),
    Section("weights", "weights", "", 80),
    Section("vllm api", "vllm_api", "", 45),  # every vLLM call the backend makes, against the installed release
    Section("training groups", "training", "groups", 60, spare=True),  # what trainer.shared_prefixes buys there
)
FALLBACK = Section("recipe", "recipe", "math_rl", 150)


def run_section(section: Section, device: str, tiny: bool, timeout_s: float, folder: Path, log: Path) -> dict:
    """One section in a fresh process; its JSON, or a row saying why there is none."""
    out = folder / f"{section.module}-{section.variant or 'default'}.json"
    cmd = [sys.executable, "-m", f"benchmarks.gpu.{section.module}", "--device", device, "--json", str(out),
           *(["--variant", section.variant] if section.variant else []), *(["--tiny"] if tiny else [])]
    start = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"\n===== {section.key} ({section.variant or 'default'}): {' '.join(cmd)}\n")
        sink.flush()
        try:
            subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            return {"error": f"ran past its {timeout_s:.0f} s", "wall_s": time.perf_counter() - start}
    if not out.exists():
        return {"error": "the section's process ended without writing its results (see suite.log)",
                "wall_s": time.perf_counter() - start}
    return json.loads(out.read_text()) | {"wall_s": time.perf_counter() - start}


def run_suite(out: Path, *, device: str, tiny: bool, budget_s: float,
              only: tuple[str, ...] = ()) -> dict[str, dict]:
    """The sections in order (those `only` names, or all) within `budget_s`, each capped at its share;
    results.json and tables.md in `out`."""
    unknown = set(only) - {s.key for s in SECTIONS}
    if unknown:
        raise SystemExit(f"suite: no section {', '.join(sorted(unknown))}; sections: "
                         f"{', '.join(s.key for s in SECTIONS)}")
    chosen = [s for s in SECTIONS if not only or s.key in only]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "suite.log"
    scale = min(1.0, budget_s / (sum(s.limit_s for s in chosen if not s.spare) or 1.0))
    deadline = time.monotonic() + budget_s
    results: dict[str, dict] = {}
    scratch = out / ".sections"
    scratch.mkdir(exist_ok=True)
    for section in chosen:
        remaining = deadline - time.monotonic()
        if remaining < 5:
            results[section.key] = {"error": "not run: the suite's time budget was spent"}
            continue
        # the dry run's sections share the whole budget: on a loaded CPU their times say nothing
        cap = remaining if tiny else min(section.limit_s * (1.0 if section.spare else scale), remaining)
        results[section.key] = run_section(section, device, tiny, cap, scratch, log)
        if section.key == "recipe" and "error" in results["recipe"]:
            first = results["recipe"]["error"]
            remaining = deadline - time.monotonic()
            if remaining >= 30:
                results["recipe"] = run_section(FALLBACK, device, tiny, min(FALLBACK.limit_s, remaining), scratch,
                                                log) | {"code_rl_error": first}
        print(f"{section.key}: {results[section.key].get('error', 'done')} "
              f"({results[section.key].get('wall_s', 0):.0f} s)", flush=True)
    for path in scratch.iterdir():
        path.unlink()
    scratch.rmdir()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "tables.md").write_text(render(results))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the dry run's shapes")
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--sections", default="", help="comma-separated section names (default: all), e.g. "
                        "'recipe,weights' to rerun what a first run found broken")
    args = parser.parse_args()
    only = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    results = run_suite(args.out, device=args.device, tiny=args.tiny, budget_s=args.budget_s, only=only)
    print((args.out / "tables.md").read_text())
    sys.exit(1 if any("error" in r for r in results.values()) else 0)


if __name__ == "__main__":
    main()
