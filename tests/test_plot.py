from __future__ import annotations

import json

import pytest

from areal.cli.plot import plot_runs
from areal.errors import ConfigError


def _run(tmp_path, name, mode, rewards):
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"mode": mode, "staleness": 2}))
    lines = [{"kind": "eval", "version": 0, "wall_s": 0.5, "pass@1": 0.2}]
    lines += [{"kind": "step", "version": i + 1, "wall_s": 1.0 + i, "reward_mean": r, "samples_per_s": 10.0 + i}
              for i, r in enumerate(rewards)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_plot_overlays_runs_into_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib import image

    out = plot_runs([_run(tmp_path, "a", "sync", [0.1, 0.2]), _run(tmp_path, "b", "async", [0.1, 0.3, 0.4])],
                    tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(out)
    assert pixels.shape[0] > 500 and pixels.shape[1] > 1000
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_plot_of_a_directory_without_metrics_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"no metrics\.jsonl there"):
        plot_runs([tmp_path], tmp_path / "p.png")
