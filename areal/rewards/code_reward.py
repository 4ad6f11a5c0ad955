"""The code reward: run model-written programs against hidden tests, in the sandbox, in parallel.

Expected outputs never enter the sandbox: the harness there reports what each test produced,
and this trusted side compares. A program that exits early, patches `print` or the harness, or
kills its runner just leaves results missing, and a missing result is a failure. Only this side
decides that the machinery failed ("sandbox_error": the sandbox did not start or its worker
broke the protocol); a record from inside can only report how the program ended, and one that
claims anything else counts as a crash. Every detail is made one printable line before it is
returned or logged: it may hold the program's own bytes. Programs run on a pool of long-lived
sandbox workers, each in a fresh jail (`sandbox/pool.py`); without bubblewrap, each in one
plain sandbox process.

How an output is compared (`results_equal`, `normalise_stdout`). A stdio test compares text, as
stdin/stdout judges do, with trailing whitespace and blank lines ignored. A call test compares
the returned value, which crosses the sandbox as JSON, with the expected one by kind as well as
value, because Python's `==` (what HumanEval-style `assert f(x) == y` judges use) lets a wrong
kind through: `True == 1` and `2.0 == 2`, so `return x >= 0` scored on tests expecting 1. The
rule: a bool answers only a bool; an int answers an int, not a float; a float is answered by an
int or a float within 1e-9 (relative or absolute: another order of the same sum), NaN by NaN;
str and None by themselves; a list (a tuple arrives as one) element by element, a dict key by key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from areal.rewards.sandbox.layers import SandboxLayers, SandboxRun, detect_layers
from areal.rewards.sandbox.limits import Limits
from areal.rewards.sandbox.pool import SandboxPool
from areal.rewards.sandbox.process import run_plain

REASONS = (
    "wrong_answer",
    "timeout",
    "crash",
    "syntax_error",
    "memory",
    "killed",
    "output_limit",
    "sandbox_error",
    "check_failed",  # the task's tests are malformed: the sample fails, its program never runs
)
# what a record from inside may say about a test: the program's outcomes, never the machinery's
PROGRAM_OUTCOMES = ("ok", "bad_result", "timeout", "crash", "memory", "killed", "output_limit")
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_DETAIL_CHARS = 200
# outcomes a rerun of the same program on the same tests gives again; a timeout or a broken
# sandbox may be the machine's load or a fault, so those are always run afresh
_REPEATABLE = (None, "wrong_answer", "syntax_error", "crash")
FLOAT_TOLERANCE = 1e-9  # relative and absolute: two ways to compute the same float answer


@dataclass(frozen=True)
class CodeResult:
    reward: float
    passed: int
    total: int
    reason: str | None  # first failure's reason (one of REASONS), None if all passed
    detail: str  # short text: the exception line, or expected vs got


def extract_code(completion: str) -> str:
    """The last fenced block (a python one if any is labelled so), else the text as is."""
    blocks = _FENCE.findall(completion)
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    chosen = python or [code for _, code in blocks]
    return chosen[-1] if chosen else completion


def printable(text: str, limit: int = _DETAIL_CHARS) -> str:
    """One line of at most `limit` characters: control and format characters (escape sequences,
    newlines, bidi overrides) are shown escaped, so program bytes can neither restyle a terminal
    nor forge a log line."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def normalise_stdout(text: str) -> str:
    """Strip trailing whitespace per line and trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")


def results_equal(got: object, expected: object) -> bool:
    """Whether a call test's returned value answers the expected one: same kind, same value (JSON
    values; the rule is in the module docstring)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float):
        if isinstance(got, float) and math.isnan(got):
            return math.isnan(expected)
        try:
            return isinstance(got, (int, float)) and math.isclose(
                got, expected, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE
            )
        except OverflowError:  # an int past any float: not close to a finite one
            return False
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(results_equal(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(results_equal(got[key], value) for key, value in expected.items()))
    return type(got) is type(expected) and got == expected


class CodeTests:
    """Scores programs against their tests, `workers` programs at a time.

    `pooled=False` starts one sandbox per program instead of reusing workers (~10x slower per
    program; kept to measure against): the same jail, in a worker used once. Nothing is probed
    or started here: a recipe that builds this is loaded in every worker. The sandbox is probed
    once, on the first call or at `preflight()` (which `areal run` calls before any worker starts).

    A group of samples for one prompt often holds the same program several times, and a
    held-out round asks again what an earlier round asked: identical (code, tests) jobs in one
    call run once, and with `remember` > 0 the last `remember` repeatable results (pass, wrong
    answer, crash, syntax error) are reused across calls. A program that reads the clock or draws
    random numbers then gets the reward of its first run.
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        memory_mb: int = 512,
        mode: Literal["fraction", "all"] = "fraction",
        workers: int | None = None,
        allow_weaker: bool = False,
        pooled: bool = True,
        remember: int = 4096,
    ) -> None:
        if mode not in ("fraction", "all"):
            raise ValueError(f"code_tests: mode must be 'fraction' or 'all', got {mode!r}")
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        self.mode = mode
        self.allow_weaker, self.pooled = allow_weaker, pooled
        self.size = workers or len(os.sched_getaffinity(0))
        self._layers: SandboxLayers | None = None  # probed on first use: a recipe is loaded in every worker
        self._threads: ThreadPoolExecutor | None = None
        self._pool: SandboxPool | None = None
        self._remember = remember
        self._results: OrderedDict[str, CodeResult] = OrderedDict()
        self._lock = threading.Lock()
        self.programs_run = 0  # sandbox runs so far: calls minus the reused results

    @property
    def layers(self) -> SandboxLayers:
        """The isolation programs run under, probed once per process (`sandbox.detect_layers`)."""
        if self._layers is None:
            self._layers = detect_layers()
        return self._layers

    def preflight(self) -> str:
        """Refuse now, in one message, if this machine cannot give the isolation asked for; else say which
        layers protect the host (what `areal run` prints once at start)."""
        self.layers.require(self.allow_weaker)
        return self.layers.describe()

    def _start(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self.preflight()
                # the pool needs the namespaces: without them each program gets its own plain process
                if self.layers.namespaces:
                    self._pool = SandboxPool(self.layers, self.limits, self.size, reuse=self.pooled)
                self._threads = ThreadPoolExecutor(self.size, "code-sandbox")
            return self._threads

    def __call__(self, programs: list[str], tests: list[dict]) -> list[CodeResult]:
        if len(programs) != len(tests):
            raise ValueError(f"code_tests: {len(programs)} programs but {len(tests)} test dicts")
        malformed: dict[int, CodeResult] = {}  # row -> why its tests cannot be run; the other rows run
        jobs = []
        for row, (program, test) in enumerate(zip(programs, tests)):
            try:
                jobs.append(self._job(program, test))
            except ValueError as err:
                malformed[row] = CodeResult(0.0, 0, 0, "check_failed", str(err))
        keys = [_job_key(job, outputs) for job, outputs in jobs]
        with self._lock:
            results = {key: self._results[key] for key in keys if key in self._results}
        todo = {key: job for key, job in zip(keys, jobs) if key not in results}  # one run per distinct job
        threads = self._start() if todo else None
        fresh = dict(zip(todo, threads.map(lambda job: self._run(*job), todo.values()))) if threads else {}
        self._keep(reused=list(results), fresh=fresh)
        results.update(fresh)
        scored = iter(results[key] for key in keys)
        return [malformed[row] if row in malformed else next(scored) for row in range(len(programs))]

    def _keep(self, reused: Iterable[str], fresh: dict[str, CodeResult]) -> None:
        """Count the runs; remember the repeatable fresh results, most recently used last, `remember` at most."""
        with self._lock:
            self.programs_run += len(fresh)
            for key in reused:
                if key in self._results:  # another caller may have pushed it out meanwhile
                    self._results.move_to_end(key)
            if self._remember:
                self._results.update((key, r) for key, r in fresh.items() if r.reason in _REPEATABLE)
            while len(self._results) > self._remember:
                self._results.popitem(last=False)

    def score(self, program: str, tests: dict) -> CodeResult:
        """Score one completion against one sample's tests dict."""
        return self([program], [tests])[0]

    def _job(self, program: str, tests: dict) -> tuple[dict, list]:
        """The sandbox job for one completion, and the outputs its tests expect (kept out of it)."""
        if not isinstance(tests, dict):
            raise ValueError(f"code_tests: a task's tests are a dict, got {type(tests).__name__} {tests!r:.200}")
        kind = tests.get("kind")
        inputs, outputs = list(tests.get("inputs", ())), list(tests.get("outputs", ()))
        if kind not in ("call", "stdio") or len(inputs) != len(outputs) or not inputs:
            raise ValueError(
                "code_tests: tests must be {'kind': 'call'|'stdio', 'inputs': [...], "
                f"'outputs': [...]}} with as many outputs as inputs (>= 1), got {tests!r:.200}"
            )
        if kind == "call" and not isinstance(tests.get("fn_name"), str):
            raise ValueError(f"code_tests: a 'call' test needs 'fn_name', got {tests!r:.200}")
        return {"kind": kind, "code": extract_code(program), "inputs": inputs, "fn_name": tests.get("fn_name")}, outputs

    def _run(self, job: dict, outputs: list) -> CodeResult:
        try:
            run = self._execute(job)
        except OSError as exc:
            return self._result([("sandbox_error", f"sandbox failed to start: {exc}")] * len(job["inputs"]))
        return self._result(_verdicts(run, job["kind"], outputs))

    def _execute(self, job: dict) -> SandboxRun:
        """Run one program's tests in the sandbox; the records come back unverified."""
        return run_plain(job, self.limits, self.layers) if self._pool is None else self._pool.run(job)

    def _result(self, verdicts: list[tuple[str | None, str]]) -> CodeResult:
        passed = sum(reason is None for reason, _ in verdicts)
        total = len(verdicts)
        failure = next(((r, d) for r, d in verdicts if r is not None), (None, ""))
        if self.mode == "all":
            reward = 1.0 if passed == total else 0.0
        else:
            reward = passed / total
        return CodeResult(reward, passed, total, failure[0], printable(failure[1]))

    def close(self) -> None:
        """Wait for running programs, then stop every sandbox worker (also done at exit)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> CodeTests:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def code_tests(timeout_s: float = 2.0, **kw) -> CodeTests:
    """The code reward a recipe plugs in: `reward("score", code_tests(timeout_s=2.0))`."""
    return CodeTests(timeout_s=timeout_s, **kw)


def _job_key(job: dict, outputs: list) -> str:
    text = json.dumps([job, outputs], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _verdicts(run: SandboxRun, kind: str, outputs: list) -> list[tuple[str | None, str]]:
    """One (reason or None, detail) per test, from the harness's untrusted records."""
    if run.broken is not None:
        return [run.broken] * len(outputs)
    if run.syntax_error is not None:
        return [("syntax_error", run.syntax_error)] * len(outputs)
    if not run.ready:
        why = run.stderr.strip().splitlines()[-1:] or [f"exit status {run.exit_status}"]
        return [("sandbox_error", f"sandbox did not start: {why[0]}")] * len(outputs)
    missing = {
        "timeout": ("timeout", "the run exceeded its wall-clock budget"),
        "output_limit": ("output_limit", "the run exceeded its output budget"),
    }.get(run.ended, ("killed", "the test runner was killed before reporting"))
    verdicts = [_verdict(run.records.get(i), kind, expected, missing) for i, expected in enumerate(outputs)]
    if run.oom_killed:  # the kernel's SIGKILL, for want of memory in the job's cgroup
        out_of_memory = ("memory", "killed by the kernel: the job's cgroup ran out of memory")
        verdicts = [out_of_memory if reason == "killed" else (reason, detail) for reason, detail in verdicts]
    return verdicts


def _verdict(
    record: dict | None, kind: str, expected: object, missing: tuple[str, str]
) -> tuple[str | None, str]:
    if record is None:
        return missing
    status, detail = record.get("status"), str(record.get("detail", ""))
    if status not in PROGRAM_OUTCOMES:
        return "crash", f"the runner reported an unknown outcome {status!r:.40}: {detail}"
    if status == "bad_result":
        return "wrong_answer", detail
    if status != "ok":
        return status, detail
    got = str(record.get("out", ""))
    if kind == "stdio":
        if normalise_stdout(got) == normalise_stdout(str(expected)):
            return None, ""
        return "wrong_answer", f"expected {str(expected)!r:.80}, got {got!r:.80}"
    try:
        value = json.loads(got)
    except (ValueError, RecursionError):
        return "wrong_answer", f"result is not JSON: {got!r:.80}"
    if results_equal(value, json.loads(json.dumps(expected))):
        return None, ""
    return "wrong_answer", f"expected {expected!r:.80}, got {value!r:.80}"
