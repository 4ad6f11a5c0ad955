"""The user errors of areal.

A user error is a mistake the user can fix (a recipe, a config value, a malformed message
from a peer). The CLI prints these as the message alone and exits 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


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
