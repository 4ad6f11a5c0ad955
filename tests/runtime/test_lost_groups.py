"""A run that only loses groups stops, and says why once: the groups still in flight that fail while it stops
(an agent run's whole held-out round, say) free their slots without raising it again (it was logged for each)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal.errors import RunError
from areal.runtime.controller.reports import LOST_GROUPS_BATCHES, WorkerReports


def test_losing_every_group_stops_the_run_once_and_groups_lost_while_it_stops_only_free_their_slots():
    freed: list[int] = []
    controller = SimpleNamespace(admission=SimpleNamespace(free=freed.extend), _lost_in_a_row=0, _stopping=False,
                                 config=SimpleNamespace(batch_size=2), state=SimpleNamespace(version=0))
    limit = LOST_GROUPS_BATCHES * 2
    for group in range(limit):
        WorkerReports._free(controller, [group], "rollout: failed")
    with pytest.raises(RunError, match=rf"no sample of the last {limit + 1} groups reached a trainer since version 0 "
                                       r"\(the last: rollout: failed\); the run cannot make progress"):
        WorkerReports._free(controller, [limit], "rollout: failed")
    controller._stopping = True  # the run stops on that error; more failures arrive meanwhile
    for group in range(limit + 1, limit + 40):
        WorkerReports._free(controller, [group], "rollout: failed")
    assert freed == list(range(limit + 40))  # every lost group's slot freed, the error raised once
