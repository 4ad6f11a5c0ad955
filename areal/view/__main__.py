"""The view process `areal run --view` starts (beside.py): python -m areal.view RUN_DIR --fd N --parent PID."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
import time
from pathlib import Path

NICENESS = 10
PARENT_POLL_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m areal.view")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fd", type=int, required=True, help="a listening socket the parent bound")
    parser.add_argument("--parent", type=int, required=True, help="exit when this process is gone")
    args = parser.parse_args()
    os.nice(NICENESS)  # what training leaves, no more: before the imports below (torch among them) cost anything
    from areal.view.run_files import RunFiles
    from areal.view.server import ViewServer

    server = ViewServer(RunFiles(args.run_dir), socket.socket(fileno=args.fd))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())

    def watch_parent() -> None:
        while os.getppid() == args.parent:
            time.sleep(PARENT_POLL_S)
        server.shutdown()  # the run's process is gone (a kill -9 too): so is the view

    threading.Thread(target=watch_parent, daemon=True).start()
    print(f"serving {args.run_dir} on {server.url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
