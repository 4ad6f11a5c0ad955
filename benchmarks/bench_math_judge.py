"""Math judges side by side on a hand-labelled table: areal's old checker, math-verify alone, areal's judge now.

    python benchmarks/bench_math_judge.py [--table benchmarks/data/math_pairs.jsonl] [--classes] [--misses]

A table row is one JSON object per line: `reference`, `label` (true when the completion's final answer is
right), a `completion` or an `answer` (the benchmark writes it into a completion as `So the final answer is
$\\boxed{answer}$.`), and optionally `prompt`, `class`, `note`. Every judge sees the same completion: the old
checker (the reward areal had before issue #35, read from this repository's history at OLD_CHECKER, so a clone
without history cannot run it), math-verify 0.9 alone as its README uses it (`verify(parse(gold),
parse(completion))`, gold written as `\\boxed{reference}`, its own timeouts on, in this process), and areal's
`MathReward` now (with the prompt where the row has one). Prints agreement with the labels, false positives (a
wrong answer rewarded), false negatives, and the mean time per answer (each judge warmed first: child
processes started, grammars loaded), then the ratios.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "data" / "math_pairs.jsonl"
OLD_CHECKER = "b17f1f2"  # the last commit with areal's own checker (areal/rewards/math_symbolic.py)
JUDGES = ("areal (old)", "math-verify", "areal (new)")


def load_table(path: Path) -> list[dict]:
    """The rows of a table; a malformed row is an error naming its file and line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from None
        missing = [k for k in ("reference", "label") if k not in row]
        if missing or ("completion" in row) == ("answer" in row) or not isinstance(row["label"], bool):
            raise ValueError(f"{path}:{number}: a row needs reference, a bool label and one of completion/answer "
                             f"(missing {missing or 'completion/answer'})")
        rows.append(row)
    return rows


def completion_of(row: dict) -> str:
    return row["completion"] if "completion" in row else f"So the final answer is $\\boxed{{{row['answer']}}}$."


def old_checker(folder: Path) -> ModuleType:
    """areal's math reward as it was at OLD_CHECKER (math/answer.py and its sympy child, math_symbolic.py),
    written into `folder` and imported from there; the child runs its file as a script, as it did."""
    for name in ("math_answer", "math_symbolic"):
        done = subprocess.run(["git", "show", f"{OLD_CHECKER}:areal/rewards/{name}.py"], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the old checker is read from git history ({OLD_CHECKER}): {done.stderr.strip()} "
                             "(a clone made with --depth has no history: fetch it, or leave this judge out)")
        text = done.stdout.replace("areal.rewards.math_symbolic", "old_math_symbolic")
        (folder / f"old_{name}.py").write_text(text)
    sys.path.insert(0, str(folder))
    return importlib.import_module("old_math_answer")


def judges(folder: Path) -> tuple[dict[str, Callable[[dict], bool]], Callable[[], None]]:
    """Each judge as row -> rewarded?, and a function that closes their child processes."""
    from math_verify import parse, verify

    from areal.rewards.math.answer import MathReward

    # math-verify's own default limit for both: verdicts, not this shared machine's load, decide the table
    old = old_checker(folder).MathReward(timeout_s=5.0)
    new = MathReward(timeout_s=5.0)
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def math_verify_alone(row: dict) -> bool:
        return bool(verify(parse("\\boxed{" + row["reference"] + "}"), parse(completion_of(row))))

    def close() -> None:
        old.close()
        new.close()

    return {
        "areal (old)": lambda row: old.score(completion_of(row), row["reference"]).reward == 1.0,
        "math-verify": math_verify_alone,
        "areal (new)": lambda row: new.score(completion_of(row), row["reference"], row.get("prompt")).reward == 1.0,
    }, close


def run(rows: list[dict], judge: Callable[[dict], bool]) -> tuple[list[bool], list[float]]:
    """Each row's verdict and seconds, after one warm-up call (child start, grammar load) that is not counted."""
    judge({"reference": "1", "answer": "1", "label": True})
    verdicts, seconds = [], []
    for row in rows:
        start = time.perf_counter()
        verdicts.append(judge(row))
        seconds.append(time.perf_counter() - start)
    return verdicts, seconds


def summary(rows: list[dict], verdicts: list[bool]) -> dict[str, int]:
    labels = [r["label"] for r in rows]
    return {
        "agree": sum(v == lab for v, lab in zip(verdicts, labels)),
        "false_pos": sum(v and not lab for v, lab in zip(verdicts, labels)),
        "false_neg": sum(lab and not v for v, lab in zip(verdicts, labels)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--classes", action="store_true", help="also print agreement and false positives per class")
    parser.add_argument("--misses", action="store_true", help="list the rows where areal's new judge disagrees")
    args = parser.parse_args()
    rows = load_table(args.table)
    with tempfile.TemporaryDirectory(prefix="areal-old-checker-") as folder:
        scorers, close = judges(Path(folder))
        try:
            results = {name: run(rows, scorers[name]) for name in JUDGES}
        finally:
            close()
    positives = sum(r["label"] for r in rows)
    print(f"{args.table.name}: {len(rows)} pairs ({positives} right answers, {len(rows) - positives} wrong)\n")
    print("| judge | agreement | false positives | false negatives | ms per answer (mean / p95 / max) |")
    print("| --- | --- | --- | --- | --- |")
    stats = {}
    for name in JUDGES:
        verdicts, seconds = results[name]
        s = stats[name] = {**summary(rows, verdicts), "ms": 1e3 * statistics.fmean(seconds)}
        p95 = 1e3 * sorted(seconds)[int(0.95 * (len(seconds) - 1))]
        print(f"| {name} | {s['agree']}/{len(rows)} ({100 * s['agree'] / len(rows):.1f} %) | {s['false_pos']} "
              f"| {s['false_neg']} | {s['ms']:.1f} / {p95:.1f} / {1e3 * max(seconds):.0f} |")
    new = stats["areal (new)"]
    right = {name: [v == r["label"] for v, r in zip(results[name][0], rows)] for name in JUDGES}
    for base in ("areal (old)", "math-verify"):
        b = stats[base]
        only_base = sum(x and not y for x, y in zip(right[base], right["areal (new)"]))
        print(f"\nareal (new) vs {base}: false positives {new['false_pos']} vs {b['false_pos']}, "
              f"disagreements {len(rows) - new['agree']} vs {len(rows) - b['agree']} "
              f"(x{(len(rows) - new['agree']) / max(1, len(rows) - b['agree']):.2f}), "
              f"time per answer x{new['ms'] / b['ms']:.2f}; pairs only {base} gets right: {only_base}")
    old_over_mv = [x and not y for x, y in zip(right["areal (old)"], right["math-verify"])]
    print(f"pairs the old checker gets right and math-verify wrong: {sum(old_over_mv)}, of which areal (new) gets "
          f"right {sum(x and z for x, z in zip(old_over_mv, right['areal (new)']))}")
    if args.classes:
        print_classes(rows, results)
    if args.misses:
        for row, verdict in zip(rows, results["areal (new)"][0]):
            if verdict != row["label"]:
                shown = row.get("answer", row.get("completion"))
                print(f"  miss: {row.get('class', '')} label={row['label']} | {row['reference']} | {shown!r}")


def print_classes(rows: list[dict], results: dict[str, tuple[list[bool], list[float]]]) -> None:
    classes = sorted({r.get("class", "") for r in rows})
    print("\n| class | pairs | " + " | ".join(f"{name} agree / FP" for name in JUDGES) + " |")
    print("| --- | --- |" + " --- |" * len(JUDGES))
    for cls in classes:
        index = [i for i, r in enumerate(rows) if r.get("class", "") == cls]
        cells = []
        for name in JUDGES:
            s = summary([rows[i] for i in index], [results[name][0][i] for i in index])
            cells.append(f"{s['agree']} / {s['false_pos']}")
        print(f"| {cls} | {len(index)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
