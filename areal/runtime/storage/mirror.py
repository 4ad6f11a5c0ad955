"""A worker's copy of the run directory on a node that does not share it (cluster.shared_dir=false), and the
pieces of it that travel back.

Such a worker runs on a plan whose run directory is a folder of that node (`Plan.home_run_dir` names the real
one): it writes its per-sample records, spans and log there as any worker does. A `Mirror` finds what grew
since it last looked and cuts it into pieces the worker sends to the controller on its control socket, which
appends each piece to the same file of the run directory (`write`). A checkpoint part is sent whole
(`tree`) before the trainer reports it, and the control socket keeps a sender's messages in order, so the
controller has every file of it when it seals the checkpoint. Paths in the controller's commands name the run
directory; `localised` rewrites them into the copy, and `home` rewrites the copy's paths back.

A mirror sends its own worker's files only (several workers of a node share its copy), and appends: a replica
restarted on another node adds to what its predecessor sent. A file that was replaced (a span file rotated:
the new file, and the old one under its new name) or shrank starts again from its first byte (`fresh`). What a
previous worker of the same replica left in the copy was sent by it, or lost with it: the launcher clears it
before the new one starts (`leftovers`). Nothing here knows of Ray or sockets: the launcher makes the copy, the
worker sends the pieces, the controller writes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDERS = ("samples", "spans", "logs")  # what grows as a worker runs and is read by areal samples, trace, view
ACCEPTED = (*FOLDERS, "checkpoints")  # where a piece may land in the run directory
PIECE_BYTES = 512 << 10  # one piece per control message, under the control plane's 1 MiB field limit


@dataclass(frozen=True)
class Piece:
    path: str  # relative to the run directory
    data: bytes
    fresh: bool = False  # the file starts with this piece (what the run directory held of it is replaced)


class Mirror:
    def __init__(self, local: str | Path, home: str | Path, worker: str) -> None:
        self.local, self.home = Path(local), Path(home)
        self.stem = file_stem(worker)
        self._sent: dict[str, tuple[int, int]] = {}  # file -> (inode, bytes sent)

    def changes(self, budget_bytes: int = 8 << 20) -> list[Piece]:
        """What grew in the copy's records, spans and logs since the last call, at most about `budget_bytes`."""
        pieces: list[Piece] = []
        for path in self._files():
            if budget_bytes <= 0:
                break
            try:
                stat = path.stat()
            except FileNotFoundError:  # rotated away between the listing and now
                continue
            name = self._relative(path)
            inode, sent = self._sent.get(name, (stat.st_ino, 0))
            renamed = name not in self._sent and any(i == stat.st_ino for i, _ in self._sent.values())
            fresh = inode != stat.st_ino or stat.st_size < sent or renamed
            start = 0 if fresh else sent
            if stat.st_size <= start and not fresh and name in self._sent:
                continue
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(min(stat.st_size - start, budget_bytes))
            budget_bytes -= len(data)
            self._sent[name] = (stat.st_ino, start + len(data))
            pieces += _cut(name, data, fresh)
        return pieces

    def tree(self, folder: str | Path) -> Iterator[Piece]:
        """Every file under `folder` (in the copy), whole, in pieces."""
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            yield from _cut(self._relative(path), path.read_bytes(), fresh=True)

    def homeward(self, path: str | Path) -> str:
        """A path of the copy as the run directory's."""
        return _moved(str(path), self.local, self.home)

    def localised(self, value: Any) -> Any:
        """`value` (a command's map) with every path in the run directory rewritten into the copy."""
        if isinstance(value, str):
            return _moved(value, self.home, self.local)
        if isinstance(value, dict):
            return {k: self.localised(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.localised(v) for v in value]
        return value

    def _files(self) -> list[Path]:
        return leftovers(self.local, self.stem)

    def _relative(self, path: Path) -> str:
        return str(path.relative_to(self.local))


def file_stem(worker: str) -> str:
    """How a worker's files are named (`rollout[1]` -> `rollout-1.jsonl`, `rollout-1.log`)."""
    return worker.replace("[", "-").replace("]", "")


def leftovers(local: Path, stem: str) -> list[Path]:
    """The files of the worker named by `stem` in a copy of the run directory: its records, spans and log."""
    return sorted(p for folder in FOLDERS for p in (Path(local) / folder).glob(f"{stem}.*") if p.is_file())


def write(run_dir: Path, piece: Piece) -> None:
    """Append `piece` to its file in the run directory (replace the file when the piece is `fresh`)."""
    target = (run_dir / piece.path).resolve()
    parts = Path(piece.path).parts
    if not parts or parts[0] not in ACCEPTED or ".." in parts or not target.is_relative_to(run_dir.resolve()):
        raise ValueError(f"a mirrored file must lie in the run directory's {', '.join(ACCEPTED)}: {piece.path!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb" if piece.fresh else "ab") as out:
        out.write(piece.data)


def _cut(name: str, data: bytes, fresh: bool) -> list[Piece]:
    chunks = [data[i:i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES)] or [b""]
    return [Piece(name, chunk, fresh and i == 0) for i, chunk in enumerate(chunks)]


def _moved(path: str, old: Path, new: Path) -> str:
    prefix = str(old).rstrip(os.sep) + os.sep
    if path == str(old):
        return str(new)
    return str(new) + os.sep + path[len(prefix):] if path.startswith(prefix) else path
