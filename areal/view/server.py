"""The view's web server: the page and its data, on 127.0.0.1, from the standard library's http.server.

Why the standard library and not aiohttp: `areal view` must work on a core install, without extras, and what it
serves is one page to one or two browsers polling a few small JSON documents a second; a thread per request is
plenty, and a dependency would buy nothing. The page (static/) is served from the installed package: nothing is
fetched from anywhere else. Endpoints:

    /                      the page            /static/FILE   its script and style
    /api/plan              plan.json           /api/graph.svg the graph as `areal viz` draws it
    /api/live              the live numbers    /api/metrics?since=N&epoch=E   metrics.jsonl from line N
    /api/samples?status=&step=&where=&limit=   the newest matching per-sample records

The server only reads the run directory (run_files.py); it binds loopback unless told otherwise.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from areal.errors import ArealError, ConfigError
from areal.view.run_files import RunFiles

STATIC = {"view.js": "text/javascript", "view.css": "text/css", "index.html": "text/html"}
SAMPLE_LIMIT = 200
DEFAULT_PORT = 8765  # the view's port unless one is asked for (taken: any free one)


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True  # a browser that keeps a connection open never holds the process up

    def __init__(self, files: RunFiles, listening: socket.socket) -> None:
        """`listening`: a socket bound already (by `areal run --view`, which may hand it to another process)."""
        super().__init__(listening.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listening
        self.server_activate()
        self.files = files

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/"


def listen(host: str, port: int | None) -> socket.socket:
    """A listening TCP socket on host:port (0: any free port; None: DEFAULT_PORT, else any free one when another
    view or program holds it); a port asked for and taken is a user error that names it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, DEFAULT_PORT if port is None else port))
    except OSError as err:
        sock.close()
        if port is None:  # a second run's view beside the first's: any free port, said in its URL
            return listen(host, 0)
        raise ConfigError(f"cannot serve the view on {host}:{port}: {err.strerror}; choose another port (0: any free "
                          "one)") from None
    sock.listen(16)
    return sock


def serve_in_thread(run_dir: Path, host: str = "127.0.0.1", port: int = 0) -> ViewServer:
    """A server answering on a daemon thread (tests; `shutdown()` stops it)."""
    server = ViewServer(RunFiles(run_dir), listen(host, port))
    threading.Thread(target=server.serve_forever, name="areal-view", daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        files = self.server.files
        try:
            if url.path in ("/", "/index.html"):
                self._static("index.html")
            elif url.path.startswith("/static/"):
                self._static(url.path.removeprefix("/static/"))
            elif url.path == "/api/plan":
                self._json(files.plan_info())
            elif url.path == "/api/graph.svg":
                svg = files.graph_svg()
                self._send(HTTPStatus.OK, "image/svg+xml", svg.encode()) if svg is not None else self._json(None)
            elif url.path == "/api/live":
                self._json(files.live())
            elif url.path == "/api/metrics":
                self._json(files.metrics_since(_int(query, "since", 0) or 0, _int(query, "epoch", 0) or 0))
            elif url.path == "/api/samples":
                step = _int(query, "step", None)
                self._json(files.sample_rows(query.get("status", [""])[0] or None, step,
                                             [w for w in query.get("where", []) if w.strip()],
                                             min(_int(query, "limit", 50) or 50, SAMPLE_LIMIT)))
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", f"no such page: {url.path}\n".encode())
        except ArealError as err:  # a bad filter, a recipe that cannot be drawn: said on the page
            self._send(HTTPStatus.BAD_REQUEST, "application/json", json.dumps({"error": str(err)}).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away

    def _static(self, name: str) -> None:
        if name not in STATIC:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", f"no such file: {name}\n".encode())
            return
        body = resources.files("areal.view").joinpath("static", name).read_bytes()
        self._send(HTTPStatus.OK, f"{STATIC[name]}; charset=utf-8", body)

    def _json(self, value: Any) -> None:
        if value is None:  # the run has not written its plan yet: the page asks again
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "application/json", b'{"error": "the run has not started"}')
            return
        self._send(HTTPStatus.OK, "application/json", json.dumps(_finite(value), default=str).encode())

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        pass  # a poll a second is not worth a log line


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no word for them, and a browser refuses a document that has one."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _int(query: dict[str, list[str]], name: str, default: int | None) -> int | None:
    raw = query.get(name, [""])[0]
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a whole number") from None
