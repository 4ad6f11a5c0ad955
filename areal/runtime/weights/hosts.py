"""Where a trained model's followers may run, for a transport that keeps its weights on one machine, and the
transport `auto` takes once it knows where they run.

transport.weights=shm writes each version into a shared-memory segment of the trainer's machine, so a
follower on another host would find no segment. Hosts are declared nowhere: a pool lands where the launcher
puts it (this machine, or the Ray node its bundle gets), so the controller checks where each worker landed
as it starts it, before the first version is published. transport.weights=auto is decided the same way, before any
worker starts, from where Ray reserved each replica: files where every follower shares its trainer's host and the
run directory is on every node, tcp otherwise. This module only decides; it moves nothing.
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


def auto_transport(plan: Plan, landed: Iterable[Landing], shared_dir: bool) -> str:
    """What transport.weights=auto means for this placement: tcp when the run directory is not on every node or a
    follower of the policy lands on another host than its trainer's rank 0, else files."""
    hosts = {(pool, replica): host for pool, replica, host in landed}
    home = hosts.get((plan.policy, 0))
    followers = plan.followers(plan.policy) if plan.policy else []
    away = any(host != home for (pool, _), host in hosts.items() if pool in followers)
    return "tcp" if plan.policy and (away or not shared_dir) else "files"
