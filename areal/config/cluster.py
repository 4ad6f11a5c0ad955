"""Where a run's processes live and how they talk: transport, the OpenAI endpoint, the cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from areal.config.section import Section


class TransportConfig(Section):
    max_frame_bytes: int = Field(1 << 28, ge=1 << 16, description="largest tensor frame of a batch (bytes)")
    max_header_bytes: int = Field(16 << 20, ge=1 << 16, description="largest batch header: meta and json fields")
    high_water_mark: PositiveInt = 64
    kind: Literal["ipc", "tcp"] = "ipc"
    host: str = Field(
        "127.0.0.1", description="where the controller and workers bind: 127.0.0.1 keeps a run on one machine; "
        "'node' binds each process on its own Ray node's IP, for a cluster of machines (cluster.backend=ray)"
    )
    weights: Literal["auto", "files", "broadcast", "shm", "tcp"] = Field(
        "auto", description="files: the trainer writes each version to the run directory (a restarted generator "
        "reads it); broadcast: a process group from trainer to generators (NCCL on GPU, gloo on CPU), no disk; "
        "shm: one shared-memory segment per version that followers on the same machine map, no disk; tcp: each "
        "follower fetches the version from the trainer over TCP, no disk, any node; auto: files, or tcp where a "
        "follower lands on another Ray node than its trainer or the run directory is not shared"
    )


class EndpointConfig(Section):
    host: str = Field("127.0.0.1", description="where an episode node's OpenAI-compatible endpoint binds "
                      "(endpoint=True); every session is keyed by its own API key, but keep it on loopback "
                      "unless agents run on other machines")
    port: int = Field(0, ge=0, le=65535, description="0: a free port per worker (agents read llm.base_url); "
                      "N: replica r binds N + r")
    max_request_bytes: int = Field(1 << 20, ge=1 << 10, description="largest request body; larger ones get 413")


class ClusterConfig(Section):
    backend: Literal["local", "ray"] = Field("local", description="local processes, or Ray actors in placement groups")
    address: str | None = Field(None, description='Ray cluster to join ("auto", "ray://host:port"); None: local Ray')
    strategy: Literal["PACK", "SPREAD"] = Field("PACK", description="how a pool's replicas spread over nodes")
    ready_timeout_s: PositiveFloat = Field(120.0, description="wait for a pool's placement group's resources")
    resources: dict[str, dict[str, PositiveFloat]] = Field(
        default_factory=dict, description='Ray resources per replica, by pool name, beyond its CPUs and GPUs: '
        '{"rollout": {"gen": 1}} puts each rollout replica on a node started with the custom resource "gen"')
    strategies: dict[str, Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]] = Field(
        default_factory=dict, description='placement strategy by pool name (default: strategy): {"rollout": '
        '"STRICT_SPREAD"} puts each replica on a node of its own')
    shared_dir: bool = Field(True, description="every Ray node sees the run directory (a shared filesystem); "
                             "false: a worker on another node keeps its files in scratch_dir and sends them here")
    scratch_dir: str = "/tmp/areal-scratch"  # a node-local copy of the run directory (shared_dir=false)
