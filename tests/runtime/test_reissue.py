"""After a crash the controller re-issues the groups the dead worker may have held: never one whose fate is
settled above the trainers' frontier (taken by every trainer out of order, or lost whole), which would only be
generated again and dropped as a copy."""

from __future__ import annotations

import types

import pytest

from areal.runtime.controller.accounting import Accounting
from areal.runtime.controller.recovery import WorkerRecovery
from areal.runtime.staleness.admission import Admission
from areal.runtime.staleness.policies import policy_named

G = 4


def _controller(policy: str, taken: dict[str, set[int]], lost: set[int]) -> types.SimpleNamespace:
    issued = {g: (f"batch {g}", types.SimpleNamespace(group=g)) for g in range(4, 10)}  # above the frontier, 4
    admission = types.SimpleNamespace(issued=issued)
    admission.reissue = lambda skip, only: Admission.reissue(admission, skip, only)
    accounting = Accounting(G, started_groups=10)
    accounting.lost = set(lost)
    sent: list[int] = []
    controller = types.SimpleNamespace(
        admission=admission, accounting=accounting, taken=taken, staleness_policy=policy_named(policy),
        workers={"actor[0]": types.SimpleNamespace(holding={9})}, sent=sent,
        _send_source=lambda batch, meta: sent.append(meta.group))
    controller._decided = lambda: WorkerRecovery._decided(controller)
    return controller


@pytest.mark.parametrize("policy", ["drop", "token", "admission", "recycle"])
def test_a_policy_that_trains_in_finishing_order_reissues_neither_taken_nor_lost_groups(policy):
    controller = _controller(policy, taken={"actor": {5, 6}}, lost={7})
    WorkerRecovery._reissue(controller, set(range(4, 10)))
    assert controller.sent == [4, 8]  # 5 and 6 trained, 7 dropped whole, 9 held by the trainer
    assert controller.accounting.reissued == 2


def test_strict_still_reissues_a_lost_group_its_trainer_waits_for_in_admission_order():
    controller = _controller("strict", taken={"actor": set()}, lost={7})
    WorkerRecovery._reissue(controller, set(range(4, 10)))
    assert controller.sent == [4, 5, 6, 7, 8]


def test_a_group_one_trainer_took_is_reissued_for_another_that_has_not():
    controller = _controller("drop", taken={"actor": {5, 6}, "critic": {6}}, lost=set())
    WorkerRecovery._reissue(controller, set(range(4, 10)))
    assert controller.sent == [4, 5, 7, 8]
