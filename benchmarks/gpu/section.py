"""How each part of the GPU suite runs: as its own process (a crash or a hang loses that part alone), told the
device and the size by its command line, writing what it measured as JSON for suite.py to tabulate."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.gpu.model import Shape, shape

Measure = Callable[[torch.device, Shape, bool, str], dict]


def section_main(measure: Measure, doc: str | None) -> None:
    """`python -m benchmarks.gpu.NAME --device cuda [--tiny] [--variant V] --json FILE`: measure(device, shape,
    tiny, variant) into FILE.

    A failure is written too (its error and traceback), so the suite's tables say what broke and where."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the dry run's shapes (seconds on a CPU)")
    parser.add_argument("--variant", default="", help="which variant of the section (the trainer's engine, say)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    try:
        result = measure(device, shape(args.tiny), args.tiny, args.variant)
    except (Exception, SystemExit) as err:  # reported, not hidden: the suite prints it in its tables
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}"}
    args.json.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: a collective left blocked in a thread (a route that cannot work here) would hang it
    os._exit(1 if "error" in result else 0)
