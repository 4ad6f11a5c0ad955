"""The curves' axes the server sends with the metrics: ranges that hold the data and nothing absurd, whole ticks
for counts and versions."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from areal.view.axes import axis, chart_axes
from areal.view.run_files import RunFiles


def test_one_held_out_point_is_drawn_on_0_to_1_at_its_version_alone():
    charts = chart_axes([{"kind": "eval", "version": 0, "pass@1": 0.25}])
    assert charts["c-pass"]["y"] == {"min": 0.0, "max": 1.0, "ticks": [0.0, 0.5, 1.0], "labels": ["0.0", "0.5", "1.0"]}
    assert charts["c-pass"]["x"]["labels"] == ["0", "1"]  # versions are whole, and none below 0


def test_the_lag_histograms_count_axis_has_whole_ticks_from_0():
    steps = [{"kind": "step", "version": v, "staleness": {"0": 9, "1": 7}} for v in (1, 2, 3)]
    y = chart_axes(steps)["c-lag"]["y"]
    assert (y["min"], y["max"]) == (0.0, 20.0) and y["ticks"] == [0.0, 10.0, 20.0] and y["labels"] == ["0", "10", "20"]
    small = chart_axes([{"kind": "step", "version": 1, "staleness": {"1": 3}}])["c-lag"]["y"]
    assert small["labels"] == ["0", "1", "2", "3"]  # 3 samples: 0, 1, 2, 3, never 1.5


def test_the_entropy_curve_holds_the_steps_entropies_and_nothing_below_0():
    steps = [{"kind": "step", "version": v, "entropy": e} for v, e in ((1, 1.15), (2, 1.85), (3, 3.10))]
    assert chart_axes(steps)["c-entropy"]["y"]["labels"] == ["1", "2", "3", "4"]
    one = chart_axes([{"kind": "step", "version": 1, "entropy": 0.05}])["c-entropy"]["y"]
    assert one["min"] == 0 and one["max"] > 0.05


def test_axes_hold_their_data_at_round_steps():
    assert axis([0.12, 0.43])["labels"] == ["0.0", "0.2", "0.4", "0.6"]
    assert axis([-0.3, 0.9])["labels"] == ["-0.5", "0.0", "0.5", "1.0"]
    assert axis([1, 120], floor=0, whole=True)["labels"] == ["0", "50", "100", "150"]
    assert axis([0.013, 0.017])["labels"] == ["0.012", "0.014", "0.016", "0.018"]
    assert axis([12.3], floor=0)["labels"] == ["5", "10", "15", "20"]  # one rate: a range around it, above 0
    assert axis([], floor=0) == {"min": 0.0, "max": 1.0, "ticks": [0.0, 0.5, 1.0], "labels": ["0.0", "0.5", "1.0"]}
    assert axis([None, float("nan"), 2.0, 4.0], whole=True)["labels"] == ["2", "3", "4"]


def test_the_metrics_endpoint_sends_the_axes_of_every_line_read(tmp_path):
    lines = [{"kind": "step", "version": 1, "reward_mean": 0.5, "solved": 0.25, "samples_per_s": 3.0,
              "staleness": {"0": 3}},
             {"kind": "eval", "version": 1, "pass@1": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    got = RunFiles(tmp_path).metrics_since(1, 0)
    assert got["lines"] == lines[1:] and got["axes"] == chart_axes(lines)
    assert got["axes"]["c-pass"]["y"]["min"] == 0.0 and got["axes"]["c-lag"]["y"]["labels"] == ["0", "1", "2", "3"]


HARNESS = """
const fs = require("fs"), vm = require("vm");
const [script, answer] = process.argv.slice(1);
const els = {};
const ctx = { console, setTimeout, Number, Math, Promise, JSON, Object, String, Array, Map, URLSearchParams,
  document: { getElementById: (id) => (els[id] ||= { id, innerHTML: "", textContent: "", setAttribute() {} }) },
  fetch: async () => ({ ok: true, json: async () => JSON.parse(fs.readFileSync(answer, "utf8")) }) };
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(script, "utf8").replace(/\\nstart\\(\\);\\s*$/, "\\n"), ctx);
vm.runInContext(`refreshMetrics().then(() => console.log(JSON.stringify(Object.fromEntries(
  ["c-pass", "c-lag", "c-entropy"].map((id) =>
    [id, [...document.getElementById(id).innerHTML.matchAll(/>([-0-9.]+)<\\\\/text>/g)].map((m) => m[1])])))))`,
  ctx);
"""


def test_the_page_draws_the_ticks_the_server_sent(tmp_path):
    """The page's own script (static/view.js, run by node where it is installed) on the metrics endpoint's answer:
    the labels it draws are the server's."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs)")
    lines = [{"kind": "step", "version": 1, "staleness": {"0": 2, "1": 1}, "entropy": 0.43},
             {"kind": "eval", "version": 1, "pass@1": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (tmp_path / "answer.json").write_text(json.dumps(RunFiles(tmp_path).metrics_since(0, 0)))
    script = Path(__file__).resolve().parents[2] / "areal" / "view" / "static" / "view.js"
    done = subprocess.run([node, "-e", HARNESS, str(script), str(tmp_path / "answer.json")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    drawn = json.loads(done.stdout)
    assert drawn["c-pass"] == ["0.0", "0.5", "1.0", "0", "1", "2"]  # y from 0 to 1, then the whole versions
    assert drawn["c-lag"] == ["0", "1", "2", "3", "0", "1", "2"]  # whole counts
    assert drawn["c-entropy"] == ["0.0", "0.5", "1.0", "0", "1", "2"]  # the policy's entropy, never below 0
