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
    weights: Literal["files", "broadcast", "shm"] = Field(
        "files", description="files: the trainer writes each version to the run directory (a restarted generator "
        "reads it); broadcast: a process group from trainer to generators (NCCL on GPU, gloo on CPU), no disk; "
        "shm: one shared-memory segment per version that followers on the same machine map, no disk"
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
