"""Fixtures of the runtime's tests."""

from __future__ import annotations

import pytest

from areal.runtime.controller import controller as controller_module
from areal.runtime.wire import messages as msg


@pytest.fixture
def reported(monkeypatch):
    """Every step the policy's trainer reported: (the version it trained at, its sample ids, its stats)."""
    steps: list[tuple[int, list[int], dict]] = []
    original = controller_module.HANDLERS[msg.VersionPublished]

    def record(self, worker, m):
        steps.append((m.version - 1, list(m.sample_ids), dict(m.stats)))
        original(self, worker, m)

    monkeypatch.setitem(controller_module.HANDLERS, msg.VersionPublished, record)
    return steps
