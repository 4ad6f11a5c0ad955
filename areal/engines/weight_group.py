"""Weights from the trainer to the generators over a process group of their own: NCCL on GPU, gloo on CPU.

The group is built from a TCPStore, not `init_process_group`, so it stands apart from the trainer
ranks' own FSDP group: member 0 is trainer rank 0, members 1.. are the generators (or, under vLLM,
the vLLM worker each generator runs). When it forms, member 0 broadcasts the layout (names,
dtypes, shapes, as msgpack) once; after that a publish is only the tensors, packed into buckets of
one dtype and at most `bucket_bytes`, which every member cuts the same way from the layout.

A broadcast is a collective: member 0 blocks until every generator has taken its part, so a
generator must join as soon as it is told a version is coming, not at its next convenient step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgpack
import torch
import torch.distributed as dist
from torch import Tensor

BUCKET_BYTES = 256 << 20
FORM_TIMEOUT_S = 600.0  # members start at different speeds (vLLM takes minutes to load)
DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}

Layout = list[tuple[str, str, list[int]]]  # (name, dtype, shape) per tensor, in publishing order


def group_device(generation_engine: str) -> str:
    """Where every member keeps the tensors it broadcasts: vLLM's workers are on GPU (NCCL), else CPU (gloo)."""
    return "cuda" if generation_engine == "vllm" else "cpu"


class WeightGroup:
    """One member of the weights group; member 0 `send`s, every other member `receive`s."""

    def __init__(self, rendezvous: str, member: int, size: int, *, device: str = "cpu",
                 bucket_bytes: int = BUCKET_BYTES, timeout_s: float = FORM_TIMEOUT_S) -> None:
        host, _, port = rendezvous.rpartition(":")
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), size, is_master=member == 0, timeout=timeout)
        self.group: Any
        if device == "cuda":
            nccl = getattr(dist, "ProcessGroupNCCL", None)
            if nccl is None:
                raise RuntimeError("the weights group on GPU needs a torch built with NCCL; this one has none "
                                   "(transport.weights=files works without it)")
            self.group = nccl(store, member, size, nccl.Options())
        else:
            self.group = dist.ProcessGroupGloo(store, member, size, timeout)
        self.member, self.size, self.device, self.bucket_bytes = member, size, device, bucket_bytes
        self.layout: Layout | None = None

    def send(self, state: dict[str, Tensor]) -> None:
        """Broadcast `state` (member 0); the first call also sends its layout, which later calls must keep."""
        layout = layout_of(state)
        if self.layout is None:
            self._broadcast_bytes(msgpack.packb(layout))
            self.layout = layout
        elif layout != self.layout:
            raise ValueError("the policy's tensors changed names, dtypes or shapes since the weights group formed")
        for names in _buckets(layout, self.bucket_bytes):
            flat = torch.cat([state[n].detach().reshape(-1) for n in names]).to(self.device)
            self._broadcast(flat)

    def receive(self) -> dict[str, Tensor]:
        """The next published weights (members > 0), on this member's device."""
        if self.layout is None:
            self.layout = [(n, d, list(s)) for n, d, s in msgpack.unpackb(self._receive_bytes())]
        shapes = {name: (DTYPES[dtype], shape) for name, dtype, shape in self.layout}
        state: dict[str, Tensor] = {}
        for names in _buckets(self.layout, self.bucket_bytes):
            dtype = shapes[names[0]][0]
            flat = torch.empty(sum(_numel(shapes[n][1]) for n in names), dtype=dtype, device=self.device)
            self._broadcast(flat)
            at = 0
            for n in names:
                count = _numel(shapes[n][1])
                state[n] = flat[at : at + count].view(shapes[n][1])
                at += count
        return state

    def _broadcast(self, tensor: Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_bytes(self, data: bytes) -> None:
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.device))
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))

    def _receive_bytes(self) -> bytes:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(data)
        return data.cpu().numpy().tobytes()


def layout_of(state: dict[str, Tensor]) -> Layout:
    """(name, dtype, shape) of every tensor, refusing a dtype the group does not carry."""
    layout = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in state.items()]
    unsent = [f"{name} ({kind})" for name, kind, _ in layout if kind not in DTYPES]
    if unsent:
        raise ValueError(f"cannot publish {', '.join(unsent)}: the weights group carries {', '.join(DTYPES)}")
    return layout


def _buckets(layout: Layout, bucket_bytes: int) -> Iterator[list[str]]:
    """Consecutive tensors of one dtype, up to bucket_bytes each (a larger tensor goes alone)."""
    bucket: list[str] = []
    size, dtype = 0, None
    for name, kind, shape in layout:
        nbytes = _numel(shape) * DTYPES[kind].itemsize
        if bucket and (kind != dtype or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append(name)
        size += nbytes
        dtype = kind
    if bucket:
        yield bucket


def _numel(shape: list[int]) -> int:
    return math.prod(shape)
