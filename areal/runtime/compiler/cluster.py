"""What a plan takes from where it runs: the endpoints workers bind (ipc on one machine, TCP under Ray, where a
worker binds a free port on the node it lands on), and how the policy's weights travel where that is known before
any worker starts. Ray is imported only when a plan needs it: by the compiler for this node's address, by the
launcher for its actors. Without it, one sentence says how to get it and how to run without it."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.runtime.wire.channels import ipc_endpoint

if TYPE_CHECKING:
    from areal.config import RunConfig
    from areal.runtime.compiler.plan import PoolSpec

MISSING_RAY = ("cluster.backend=\"ray\" needs the 'ray' package (pip install 'areal[cluster]'); "
               "cluster.backend=\"local\" runs without it.")


def import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError(MISSING_RAY) from None


def weights_transport(config: RunConfig) -> str:
    """transport.weights, with auto decided where it can be: files without Ray (the controller decides under Ray,
    once it knows where each pool lands: runtime/weights/hosts.py)."""
    auto = config.transport.weights == "auto" and config.cluster.backend == "local"
    return "files" if auto else config.transport.weights


def endpoints(run: Path, src: str, dst: PoolSpec, config: RunConfig) -> tuple[str, ...]:
    """One endpoint per receiving replica (a trainer's rank 0 receives for all its ranks)."""
    count = 1 if dst.role == "train" else dst.replicas
    return tuple(endpoint(run, f"{src}-{dst.name}-{r}", config) for r in range(count))


def endpoint(run: Path, name: str, config: RunConfig) -> str:
    """A data endpoint. Under Ray a worker may land on any node and start in any order, so it binds a
    free port there and tells the controller, which wires its neighbours to it (`tcp://HOST:*`)."""
    if config.cluster.backend == "ray":
        return f"tcp://{config.transport.host}:*"
    if config.transport.kind == "tcp":
        return f"tcp://{config.transport.host}:{free_port()}"
    return ipc_endpoint(run / "sockets", name)


def control_endpoint(run: Path, config: RunConfig) -> str:
    """The controller's endpoint: on this machine, reachable from the nodes. A TCP port is left to the
    controller's bind (`:*`), which writes the concrete one into plan.json before any worker starts."""
    if config.transport.host == "node":
        return f"tcp://{import_ray().util.get_node_ip_address()}:*"
    if config.transport.kind == "tcp" or config.cluster.backend == "ray":
        return f"tcp://{config.transport.host}:*"
    return ipc_endpoint(run / "sockets", "control")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
