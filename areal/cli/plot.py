"""`areal plot`: reward, held-out pass@1 and throughput of one or more runs, to a PNG.

Runs are overlaid (one colour each), against wall-clock seconds on the top row and against
policy version on the bottom row, so a sync and an async run of the same recipe read side by
side. matplotlib is an optional extra: `pip install 'areal[plot]'`.
"""

from __future__ import annotations

from pathlib import Path

from areal.errors import ConfigError
from areal.runtime.records.metrics import read_metrics

PANELS = (("reward_mean", "step", "reward (batch mean)"), ("pass@1", "eval", "held-out pass@1"),
          ("samples_per_s", "step", "trained samples/s"))


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("areal plot needs matplotlib (pip install 'areal[plot]')") from None
    runs = []
    for run in run_dirs:
        path = run / "metrics.jsonl"
        if not path.is_file():
            raise ConfigError(f"{run}: no metrics.jsonl there; is it a run directory?")
        runs.append((_label(run), read_metrics(path)))
    fig, axes = plt.subplots(2, len(PANELS), figsize=(5 * len(PANELS), 7), squeeze=False)
    for col, (key, kind, title) in enumerate(PANELS):
        for label, records in runs:
            rows = [r for r in records if r.get("kind") == kind and r.get(key) is not None]
            for row, x_key in enumerate(("wall_s", "version")):
                axes[row][col].plot([r[x_key] for r in rows], [r[key] for r in rows], marker=".", label=label)
        axes[0][col].set_title(title)
        axes[0][col].set_xlabel("wall-clock (s)")
        axes[1][col].set_xlabel("policy version")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _label(run: Path) -> str:
    config = run / "config.json"
    if config.is_file():
        import json

        data = json.loads(config.read_text())
        eta = 0 if data.get("mode") == "sync" else data.get("staleness")
        return f"{run.name} ({data.get('mode')}, η={eta})"
    return run.name
