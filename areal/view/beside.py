"""`areal run --view`: the view as a process of its own beside the run, stopped with it.

A process, not a thread of the controller: the controller's loop feeds the gate and answers every worker, and a
thread in it would share its interpreter lock with each poll's JSON parsing. The view process is lowered in
priority (nice), so on a busy machine it takes only what training leaves, and if it fails the run never notices.
The port is bound here, before training starts, so a taken port is said at once; the process gets the socket,
watches its parent and exits when the run's process is gone, however it ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from areal.view.server import listen

STOP_TIMEOUT_S = 5.0


@contextmanager
def view_beside(run_dir: Path, port: int | None, console: Console, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve the view of `run_dir` from a child process while the block runs; the page's URL."""
    sock = listen(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}/"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    with (run_dir / "logs" / "view.log").open("a") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "areal.view", str(run_dir), "--fd", str(sock.fileno()), "--parent",
             str(os.getpid())], pass_fds=[sock.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True)  # Ctrl-C reaches the run, which stops the view by its pid
    sock.close()
    console.print(f"view: {url}  (pid {child.pid}; log {run_dir / 'logs' / 'view.log'})", highlight=False,
                  soft_wrap=True)  # the URL and paths stay whole
    try:
        yield url
    finally:
        child.terminate()
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        console.print(f"the view stopped with the run; reopen it with: areal view {run_dir}", highlight=False,
                      soft_wrap=True)
