"""`areal run --view`, `areal view` and `areal trace` on a real run of recipes/emulated_rl.py, as a user runs them.

One run serves every test here: started with `--view` (the page's server in its own process), watched while it
trains, then stopped with SIGTERM; the tests after that read the finished run's files through a server of
their own and compare every endpoint with the files it reads. The run is long (steps=100000) and ends when the
tests have seen what they need, so its length does not depend on the machine's speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from areal.runtime.compiler.plan import Plan
from areal.runtime.records.metrics import read_metrics
from areal.runtime.records.sample_records import read_samples, select
from areal.runtime.records.trace import worker_ids
from areal.view.server import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "emulated_rl.py"
SETTINGS = ["steps=100000", "batch_size=2", "group_size=4", "emulation.time_scale=0.3",
            "emulation.output_tokens_median=48", "generation.max_new_tokens=256", "checkpoint.interval_steps=0"]
START_TIMEOUT_S = 240.0  # the workers import torch on a shared machine
STEP_TIMEOUT_S = 60.0
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Run:
    process: subprocess.Popen[str]
    run_dir: Path
    url: str
    view_pid: int
    said: list[str]  # what it printed, as it printed it
    reader: threading.Thread  # fills `said`; ends when the run's output does


def _until(predicate: Any, timeout_s: float, what: str, run: Run) -> Any:
    """Look at `predicate` each time the live run has had 0.2 s more (waiting on its process, so a run that ends
    fails at once) until it returns something true; its value. Fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if run.process.poll() is not None:
            raise AssertionError(f"{what}: the run ended first (exit code {run.process.returncode})")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.process.wait(timeout=0.2)
    return value


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return json.loads(body) if response.headers["Content-Type"].startswith("application/json") else body.decode()


def _live(url: str) -> dict[str, Any] | None:
    try:
        return _get(url + "api/live")
    except urllib.error.HTTPError:
        return None  # 503: the run has not written its plan yet


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("view") / "run"
    args = [sys.executable, "-m", "areal.cli", "run", str(RECIPE), "-q", "--view", "--view-port", "0", "--run-dir",
            str(run_dir), *[x for s in SETTINGS for x in ("--set", s)]]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    said: list[str] = []
    reader = threading.Thread(target=lambda: [(lines.put(line), said.append(line)) for line in process.stdout],
                              daemon=True)
    reader.start()
    view_pid = None
    try:
        line = lines.get(timeout=START_TIMEOUT_S)
        while not line.startswith("view: "):  # said before training starts
            line = lines.get(timeout=START_TIMEOUT_S)
        found = re.match(r"view: (http://127\.0\.0\.1:\d+/)\s+\(pid (\d+);", line)
        assert found, line
        view_pid = int(found.group(2))
        yield Run(process, run_dir, found.group(1), view_pid, said, reader)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(60)
        if view_pid is not None and _exists(view_pid):
            os.kill(view_pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stopped(run):
    """The run, once it has trained a few steps, stopped by SIGTERM as a user's Ctrl-C or a scheduler would."""
    _until(lambda: (s := _live(run.url)) and (s["status"] or {}).get("version", 0) >= 3, START_TIMEOUT_S,
           "three steps", run)
    run.process.send_signal(signal.SIGTERM)
    assert run.process.wait(120) == 128 + signal.SIGTERM
    return run.run_dir


@pytest.fixture(scope="module")
def finished(stopped):
    """A view of the finished run: the same server `areal view` starts, on a free port."""
    server = serve_in_thread(stopped)
    yield server.url
    server.shutdown()
    server.server_close()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- while it runs -------------------------------------------------------------------------------------


def test_the_live_numbers_change_between_two_reads_of_a_running_run(run):
    first = _until(lambda: (s := _live(run.url)) and s["run"]["alive"] and (s["status"] or {}).get("version", 0) >= 1
                   and s, START_TIMEOUT_S, "a first step", run)
    later = _until(lambda: (s := _live(run.url)) and s["status"]["version"] > first["status"]["version"] + 1 and s,
                   STEP_TIMEOUT_S, "two more steps", run)
    assert later["status"]["status"] == "running" and later["run"]["alive"]
    assert later["status"]["elapsed_s"] > first["status"]["elapsed_s"]
    assert later["status"]["gate"]["admitted"] > first["status"]["gate"]["admitted"]
    assert later["status"]["accounting"]["trained"] > first["status"]["accounting"]["trained"]
    assert later["activity"]["nodes"]["actor"]["calls"] > 0 and later["activity"]["nodes"]["rollout"]["busy"] > 0
    assert later["channels"]["channel:rollout:actor"]["samples_per_s"] > 0
    route = later["routes"]["actor>rollout"]
    assert route["published"]["version"] >= later["status"]["version"] - 1
    assert 0 <= route["published"]["version"] - route["followers"]["rollout[0]"]["version"] <= 2  # η = 2


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium) for the headless browser")
def test_the_page_in_a_headless_browser_shows_the_graph_with_numbers_that_change(run, tmp_path):
    _until(lambda: (s := _live(run.url)) and (s["status"] or {}).get("version", 0) >= 1, START_TIMEOUT_S, "a step", run)
    first = _dom(run.url, tmp_path)
    version = int(first.find(".//*[@id='h-version']").text.split("/")[0])
    _until(lambda: _live(run.url)["status"]["version"] > version + 1, STEP_TIMEOUT_S, "two more steps", run)
    second = _dom(run.url, tmp_path)
    assert int(second.find(".//*[@id='h-version']").text.split("/")[0]) > version
    plan = Plan.from_json((run.run_dir / "plan.json").read_text())
    drawn = {g.get("id") for g in second.iter() if g.get("id")}
    labelled = {g.get("data-key") for g in second.iter() if "live" in (g.get("class") or "").split()}
    for pool in plan.pools:
        assert f"pool-{pool.name}" in drawn
        for node in pool.nodes if pool.role != "source" else ():
            assert f"node-{node}" in drawn and f"node-{node}" in labelled  # busy and rate written beside it
    assert {f"channel:{c.src}:{c.dst}" for c in plan.channels} <= drawn
    assert "channel:tasks:rollout" in labelled  # the gate's numbers
    assert any(key.startswith("weights:") for key in labelled)
    gate = {row[0]: row[1] for row in _rows(second, "gate")}
    assert int(gate["admitted groups"]) > 0 and gate["η (eta)"] == "2 (async)"
    assert [row[0] for row in _rows(second, "pools")] == [p.name for p in plan.pools]
    shot = tmp_path / "page.png"
    _chromium(run.url, tmp_path, f"--screenshot={shot}", "--window-size=1400,1000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def _chromium(url: str, profile: Path, *args: str) -> str:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--virtual-time-budget=4000", *args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dom(url: str, profile: Path) -> ET.Element:
    """The page as the browser built it, after its first polls; parsed as XML (chromium writes HTML: made XML)."""
    html = _chromium(url, profile, "--dump-dom")
    body = html[html.index("<body"):html.rindex("</body>") + len("</body>")]
    body = re.sub(r"<(input|br|img|link|meta)([^>]*?)/?>", r"<\1\2/>", body).replace("&nbsp;", " ")
    return ET.fromstring(body)


def _rows(dom: ET.Element, table: str) -> list[list[str]]:
    found = dom.find(f".//*[@id='{table}']")
    return [["".join(td.itertext()) for td in tr.findall("td")] for tr in found.iter("tr") if tr.findall("td")]


# -- once it stopped -------------------------------------------------------------------------------------


def test_stopping_the_run_stops_its_view(run, stopped):
    assert not _exists(run.view_pid)  # gone with the run, whose exit waited for it
    run.reader.join(timeout=10)  # the run has ended: its last lines are read once its output closes
    assert any(f"reopen it with: areal view {stopped}" in line for line in run.said), "the way back"


def test_the_metrics_endpoint_serves_metrics_jsonl_line_for_line(finished, stopped):
    lines = read_metrics(stopped / "metrics.jsonl")
    everything = _get(finished + "api/metrics?since=0")
    assert everything["lines"] == json.loads(json.dumps(lines)) and everything["next"] == len(lines)
    rest = _get(finished + f"api/metrics?since=2&epoch={everything['epoch']}")
    assert rest["lines"] == everything["lines"][2:] and rest["from"] == 2


def test_the_plan_and_the_graph_match_plan_json(finished, stopped):
    plan_json = json.loads((stopped / "plan.json").read_text())
    info = _get(finished + "api/plan")
    assert info["plan"] == plan_json
    plan = Plan.from_json((stopped / "plan.json").read_text())
    svg = ET.fromstring(_get(finished + "api/graph.svg"))
    ids = {el.get("id") for el in svg.iter() if el.get("id")}
    assert {i for i in ids if i.startswith("pool-")} == {f"pool-{p.name}" for p in plan.pools}
    assert {i for i in ids if i.startswith("node-")} == {f"node-{n}" for p in plan.pools for n in p.nodes}
    assert {i for i in ids if i.startswith("channel:")} == {f"channel:{c.src}:{c.dst}" for c in plan.channels}
    routes = {tuple(info["node_pool"][n] for n in i.split(":")[1:]) for i in ids if i.startswith("weights:")}
    assert {tuple(r) for r in plan_json["weights_routes"]} <= routes


def test_the_live_endpoint_agrees_with_status_and_metrics(finished, stopped):
    live = _get(finished + "api/live")
    status = json.loads((stopped / "status.json").read_text())
    steps = [m for m in read_metrics(stopped / "metrics.jsonl") if m.get("kind") == "step"]
    assert live["status"] == status and not live["run"]["alive"] and status["status"] == "stopped"
    assert status["version"] == steps[-1]["version"]
    assert status["accounting"]["trained"] == steps[-1]["trained"] == steps[-1]["trained_samples"]
    assert live["routes"]["actor>rollout"]["published"]["version"] == steps[-1]["version"]
    assert set(live["pools"]) == {p["name"] for p in json.loads((stopped / "plan.json").read_text())["pools"]}
    # each worker pool's share of the workers' CPU, from the status's per-worker figures (a source has no worker)
    spent = {name: [w["cpu_s"] for w in status["workers"].values() if w["pool"] == name] for name in live["pools"]}
    total = sum(map(sum, spent.values()))
    assert {name for name, cpu in spent.items() if cpu} == {"rollout", "score", "actor"}
    assert all(map(all, spent.values()))  # every worker reported some
    for name, pool in live["pools"].items():
        assert pool["cpu_share"] == (pytest.approx(sum(spent[name]) / total) if spent[name] else None)
    # a finished run shows its last seconds of work, not the silence after it
    assert live["activity"]["nodes"]["actor"]["calls"] > 0


def test_the_samples_endpoint_filters_as_areal_samples_does(finished, stopped):
    records = read_samples(stopped)
    trained = select(records.values(), status="trained", where=["lag>=1"])
    got = _get(finished + "api/samples?status=trained&where=lag%3E%3D1&limit=5")
    assert got["total"] == len(records) and got["matched"] == len(trained) > 0
    assert [r["sample_id"] for r in got["rows"]] == [r.sample_id for r in trained[::-1][:5]]  # newest first
    with pytest.raises(urllib.error.HTTPError) as bad:
        _get(finished + "api/samples?where=reward%20about%201")
    assert bad.value.code == 400 and "expected FIELD OP VALUE" in json.loads(bad.value.read())["error"]


def test_the_trace_has_a_track_per_worker_with_nested_ordered_spans(stopped, tmp_path):
    out = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "areal.cli", "trace", str(stopped), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"].split(":")[0] for e in events if e["name"] == "process_name"}
    workers = worker_ids(Plan.from_json((stopped / "plan.json").read_text()))
    assert sorted(names.values()) == sorted(workers)  # one process, one track per worker
    spans: dict[int, list[dict[str, Any]]] = {pid: [] for pid in names}
    for e in events:
        assert e["ph"] in ("M", "X") and isinstance(e["pid"], int) and e["tid"] == e["pid"]
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and e["ts"] >= 0 and isinstance(e["dur"], int) and e["dur"] >= 0
            assert e["cat"] in ("decode", "node", "weights", "send", "publish", "step", "wait") and e["name"]
            spans[e["pid"]].append(e)
    for pid, found in spans.items():
        assert found, f"{names[pid]} has no spans"
        assert [(e["ts"], -e["dur"]) for e in found] == sorted((e["ts"], -e["dur"]) for e in found)  # ordered
        open_: list[dict[str, Any]] = []
        for e in found:  # each span either starts after the one open before it ends, or lies within it
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"]:
                open_.pop()
            assert not open_ or e["ts"] + e["dur"] <= open_[-1]["ts"] + open_[-1]["dur"], (names[pid], e, open_[-1])
            open_.append(e)
    by_worker = {names[pid]: {e["cat"] for e in found} for pid, found in spans.items()}
    assert {"decode", "weights", "send"} <= by_worker["rollout[0]"]
    assert {"node", "send"} <= by_worker["score[0]"]
    assert {"wait", "step", "node", "publish"} <= by_worker["actor[0]"]
    steps = [e for e in spans[next(p for p, n in names.items() if n == "actor[0]")] if e["cat"] == "step"]
    assert [e["args"]["version"] for e in steps] == list(range(1, len(steps) + 1))


def test_the_default_port_taken_by_another_view_gives_any_free_one_and_a_port_asked_for_is_refused(monkeypatch):
    import socket

    import areal.view.server as server
    from areal.errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        monkeypatch.setattr(server, "DEFAULT_PORT", port)  # as though a first run's view held 8765
        with contextlib.closing(server.listen("127.0.0.1", None)) as second:
            assert second.getsockname()[1] not in (port, 0)
        with pytest.raises(ConfigError, match=rf"cannot serve the view on 127.0.0.1:{port}: .*; choose another port"):
            server.listen("127.0.0.1", port)
