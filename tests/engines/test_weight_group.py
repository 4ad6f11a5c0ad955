"""The weights group on CPU (gloo): one sender, two receivers, in spawned processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from areal.engines.weight_group import WeightGroup, _buckets, layout_of
from tests.spawned import free_port, run_spawned

MEMBERS = 3
TIMEOUT_S = 60
BUCKET = 256  # bytes: small, so the state below spans several buckets and one tensor exceeds a bucket


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(10, 4, generator=g),  # 160 bytes
        "layer.0.weight": torch.randn(8, 16, generator=g),  # 512 bytes: alone, over the bucket size
        "layer.0.bias": torch.randn(16, generator=g).to(torch.bfloat16),  # a dtype change cuts a bucket
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "head.weight": torch.randn(2, 2, generator=g),
    }


def _member(member: int, port: int, out: str) -> None:
    group = WeightGroup(f"127.0.0.1:{port}", member, MEMBERS, bucket_bytes=BUCKET, timeout_s=TIMEOUT_S)
    for publish in range(2):
        if member == 0:
            group.send(_state(publish))
        else:
            save_file({k: v.contiguous() for k, v in group.receive().items()}, f"{out}/m{member}-p{publish}.st")
    if member == 0:
        changed = _state(9) | {"extra.weight": torch.zeros(1)}
        try:
            group.send(changed)
        except ValueError as err:
            Path(out, "refused.txt").write_text(str(err))


def test_every_receiver_gets_each_publish_bitwise_with_names_dtypes_and_shapes(tmp_path):
    run_spawned(_member, (free_port(), str(tmp_path)), MEMBERS, TIMEOUT_S, "weights group members")
    for publish in range(2):
        sent = _state(publish)
        for member in (1, 2):
            got = load_file(str(tmp_path / f"m{member}-p{publish}.st"))
            assert got.keys() == sent.keys()
            for name, value in sent.items():
                assert got[name].dtype == value.dtype and torch.equal(got[name], value), (member, publish, name)
    assert "changed names, dtypes or shapes" in (tmp_path / "refused.txt").read_text()


def test_buckets_hold_one_dtype_and_respect_the_size_unless_a_tensor_alone_exceeds_it():
    layout = layout_of(_state(0))
    assert list(_buckets(layout, BUCKET)) == [["embed.weight"], ["layer.0.weight"], ["layer.0.bias", "norm.weight"],
                                              ["head.weight"]]
    assert list(_buckets(layout, 1 << 20)) == [["embed.weight", "layer.0.weight"], ["layer.0.bias", "norm.weight"],
                                              ["head.weight"]]


def test_an_unsupported_dtype_is_refused_naming_the_tensor():
    with pytest.raises(ValueError, match=r"cannot publish steps \(int64\)"):
        layout_of({"w": torch.zeros(2), "steps": torch.zeros(2, dtype=torch.int64)})
