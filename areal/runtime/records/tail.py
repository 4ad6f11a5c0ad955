"""Reading a JSONL file that another process is still appending to: each call returns the lines added since.

Only whole lines are read (a line being written is left for the next call), a line that is not a JSON object
is skipped (one torn by a kill: everything around it stands), and a file that was rotated (renamed to
`rotated` and started again, runtime/records/spans.py) is finished from its old name before the new one is read. A file
replaced by a shorter one (a resumed run rewrites metrics.jsonl up to its checkpoint) starts over, and says so
in `reset`, so a reader that keeps what it read can drop it. The reader never writes, locks or holds a file
open between calls: the writer cannot notice it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class JsonlTail:
    def __init__(self, path: Path, rotated: Path | None = None) -> None:
        self.path = path
        self.rotated = rotated
        self.reset = False  # the last read found the file replaced: what was read before is gone
        self._inode: int | None = None
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        """The objects on the lines written since the last call (all of them on the first)."""
        self.reset = False
        lines: list[dict[str, Any]] = []
        current = _stat(self.path)
        if self._inode is None and self.rotated is not None and (old := _stat(self.rotated)) is not None:
            self._inode = old.st_ino  # a reader that comes late starts with the rotated half
        if self._inode is not None and (current is None or current.st_ino != self._inode):
            old = _stat(self.rotated) if self.rotated is not None else None
            if old is not None and old.st_ino == self._inode:
                lines += self._from(self.rotated, old.st_size)  # rotated since: finish it under its new name
            else:
                self.reset = self._offset > 0
            self._inode, self._offset = None, 0
        if current is not None:
            if self._inode is None:
                self._inode = current.st_ino
            elif current.st_size < self._offset:  # cut short in place
                self.reset, self._offset = True, 0
            lines += self._from(self.path, current.st_size)
        return lines

    def _from(self, path: Path | None, size: int) -> list[dict[str, Any]]:
        if path is None or size <= self._offset:
            return []
        try:
            with path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read(size - self._offset)
        except FileNotFoundError:
            return []
        whole = chunk.rfind(b"\n") + 1  # a last line without its newline is still being written
        self._offset += whole
        found = []
        for raw in chunk[:whole].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                found.append(line)
        return found


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
