"""Where a trained model's followers may run, for a transport that keeps its weights on one machine.

transport.weights=shm writes each version into a shared-memory segment of the trainer's machine, so a
follower on another host would find no segment. Hosts are declared nowhere: a pool lands where the launcher
puts it (this machine, or the Ray node its bundle gets), so the controller checks where each worker landed
as it starts it, before the first version is published. This module only decides; it moves nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from areal.errors import ConfigError
from areal.runtime.compiler.plan import Plan
from areal.runtime.weights import TRANSPORTS

Landing = tuple[str, int, str]  # (pool, replica, host) of one started worker


def misplaced(plan: Plan, landed: Iterable[Landing]) -> list[str]:
    """One line per follower replica on another host than its trainer's, where the transport needs one host.

    The trainer's host is its rank 0's, which publishes; a pool not started yet is not judged.
    """
    hosts = {(pool, replica): host for pool, replica, host in landed}
    problems = []
    for trainer, follower in plan.weights_routes:
        kind = plan.weights_kind(trainer)
        home = hosts.get((trainer, 0))
        if not TRANSPORTS[kind].one_host or home is None:
            continue
        for (pool, replica), host in sorted(hosts.items()):
            if pool == follower and host != home:
                nodes = ", ".join(f"'{n}'" for n in plan.pool(follower).nodes)
                problems.append(f"transport.weights={kind}: model '{trainer}' is trained on host {home} "
                                f"({trainer}[0]), but {follower}[{replica}] (node {nodes}), which follows it, "
                                f"runs on host {host}")
    return problems


def require_one_host(plan: Plan, landed: Iterable[Landing]) -> None:
    """Raise one ConfigError listing `misplaced`, with the ways out, if there is any."""
    problems = misplaced(plan, landed)
    if problems:
        raise ConfigError("\n".join(problems) + "\nshared memory does not cross machines: use transport.weights="
                          "files (or broadcast), or place the trainer and its followers on one host")
