"""The user errors of areal.

A user error is a mistake the user can fix (a recipe, a config value, a malformed message
from a peer). The CLI prints these as the message alone and exits 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_AREAL = Path(__file__).resolve().parent
_RUNTIME_FOLDERS = (_AREAL / "runtime", _AREAL / "graph", Path(__file__).resolve())  # and this module
_LIBRARIES = tuple({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")})


class ArealError(Exception):
    """Base of every error whose message is meant for the user, not for a debugger."""


class GraphError(ArealError):
    """A recipe's graph is invalid; the message lists every problem, each with file:line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ConfigError(ArealError):
    """A config value or a `--set` override is invalid; the message names the field."""


class RecipeError(ArealError):
    """A recipe file cannot be loaded (missing, syntax error, no or two graphs)."""


class WireError(ArealError):
    """A message from a socket is malformed; the message names the sender and the field."""


class RunError(ArealError):
    """A run stopped because a node failed; the message names the node."""


class NodeContractError(RunError):
    """A node returned or did something other than what it declared: a bug in the node, fatal on every retry."""


def own_frames(err: BaseException, limit: int = 8) -> str:
    """The traceback from the first frame outside areal's own runtime and graph (the researcher's code: a node, a
    task source, and what it called), at most `limit` frames: what a researcher reads to find their bug."""
    frames = traceback.extract_tb(err.__traceback__)
    first = next((i for i, f in enumerate(frames) if not runtime_file(f.filename)), len(frames))
    return "".join(traceback.format_list(frames[first:][-limit:])).rstrip()


def raised_at(err: BaseException) -> str:
    """`file.py:LINE in name` for the line of the researcher's own code that raised `err` (the innermost frame
    outside areal and the installed libraries: a `json.loads` failing is read at the line that called it), else
    the innermost frame; "" without a traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if not any(Path(f.filename).resolve().is_relative_to(p) for p in (_AREAL, *_LIBRARIES))]
    frame = (own or frames or [None])[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}" if frame is not None else ""


def runtime_file(filename: str) -> bool:
    """Whether `filename` is areal's own runtime or graph code (not what a researcher wrote or called)."""
    path = Path(filename).resolve()
    return any(path.is_relative_to(folder) for folder in _RUNTIME_FOLDERS)


@contextmanager
def source_errors(source: str) -> Iterator[None]:
    """A task source's own exception (a store gone, a bug in its code) as a RunError naming `source` and the
    frames of its code, not a traceback through the controller."""
    try:
        yield
    except ArealError:
        raise
    except Exception as err:
        frames = own_frames(err)
        raise RunError(f"{source}: the task source raised {type(err).__name__}: {err}"
                       + (f"\n{frames}" if frames else "")) from err
