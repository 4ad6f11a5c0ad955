"""GPU suite, the whole runtime: a recipe (code_rl by default) with the built-in model on the device, async
against sync, the same steps, seed and machine; samples/s from each run's own step records, and the GPU's peak
memory in use while it ran (every process on it, read from nvidia-smi).

    python -m benchmarks.gpu.recipe --device cuda --json out.json [--variant math_rl]

`--variant` names another recipe in recipes/ (math_rl needs no sandbox, for a machine whose kernel refuses it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from benchmarks.bench_async import run_once
from benchmarks.gpu.model import Shape
from benchmarks.gpu.section import section_main

ROOT = Path(__file__).resolve().parents[2]


def settings(device: torch.device, tiny: bool) -> tuple[int, list[str]]:
    """Steps, and the overrides every run of the pair shares."""
    extra = [f"generation.device={device}", f"trainer.device={device}", "eval.interval_steps=0",
             "checkpoint.interval_steps=0"]
    if tiny:
        return 2, extra + ["batch_size=2", "group_size=2", "eval.tasks=2", "eval.samples=1",
                           "generation.max_new_tokens=16"]
    return 20, extra + ["eval.tasks=16", "eval.samples=1"]


class GpuMemoryPeak:
    """The most memory nvidia-smi reports in use on the GPU while the block runs (None without nvidia-smi)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s, self.peak_mib, self._stop = interval_s, None, threading.Event()
        self._smi = shutil.which("nvidia-smi")

    def __enter__(self) -> GpuMemoryPeak:
        if self._smi:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._smi:
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):  # a sampling interval, not a synchronisation
            out = subprocess.run([self._smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10)
            used = [int(x) for x in out.stdout.split() if x.isdigit()]
            if used:
                self.peak_mib = max(self.peak_mib or 0, max(used))


def measure(device: torch.device, model_shape: Shape, tiny: bool, variant: str = "") -> dict:
    recipe = ROOT / "recipes" / f"{variant or 'code_rl'}.py"
    steps, extra = settings(device, tiny)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="areal-gpu-recipe-") as tmp:
        for mode, eta in (("sync", 0), ("async", 2)):
            with GpuMemoryPeak() as memory:
                result = run_once(recipe, mode, eta, 0, steps, extra, Path(tmp))
            rows[f"{mode} η={eta}"] = {"samples_per_s": result["samples_per_s"], "wall_s": result["wall_s"],
                                       "trained": result["trained"], "t_train_s": result["t_train"],
                                       "t_step_s": result["t_step"], "gpu_peak_mib": memory.peak_mib}
    sync, run_async = rows["sync η=0"]["samples_per_s"], rows["async η=2"]["samples_per_s"]
    return {"recipe": recipe.name, "steps": steps, "overrides": extra, "rows": rows,
            "async_vs_sync": run_async / sync}


if __name__ == "__main__":
    section_main(measure, __doc__)
