from __future__ import annotations

import gc
import time
import tracemalloc
import weakref
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal.errors import WireError
from areal.graph.batch import Batch, Ragged
from areal.runtime.wire.codec import decode, encode

SENDER = "'score'[1]"


def every_kind_batch() -> Batch:
    torch.manual_seed(0)
    return Batch({
        "reward": torch.rand(3),
        "sample_id": torch.tensor([7, 8, 9], dtype=torch.int64),
        "attempt": torch.tensor([0, 1, 2], dtype=torch.int32),
        "done": torch.tensor([True, False, True]),
        "logits": torch.randn(3, 4, dtype=torch.float64),
        "half": torch.randn(3, 2).to(torch.bfloat16),
        "output_ids": Ragged.from_rows([torch.arange(4), torch.arange(0), torch.arange(2)]),
        "hidden": Ragged.from_rows([torch.randn(2, 5), torch.randn(0, 5), torch.randn(1, 5)]),
        "versions": Ragged.from_rows([torch.zeros(0, dtype=torch.int32)] * 3, dtype=torch.int32),
        "tests": [{"input": "f(1)", "want": [1, 2.5, None]}, "text", None],
    })


def as_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in frames]


def assert_same(got: Batch, want: Batch) -> None:
    assert list(got) == list(want) and got.size == want.size
    for name, value in want.items():
        other = got[name]
        if isinstance(value, Ragged):
            assert isinstance(other, Ragged)
            assert other.values.dtype == value.values.dtype and torch.equal(other.values, value.values)
            assert torch.equal(other.offsets, value.offsets)
        elif isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor) and other.dtype == value.dtype, name
            assert torch.equal(other, value), name
        else:
            assert other == value


def test_round_trip_keeps_every_kind_of_field_and_the_meta():
    batch = every_kind_batch()
    meta = {"sender": "score", "replica": 1, "attempts": [0, 1]}
    got, got_meta = decode(as_bytes(encode(batch, meta)), sender=SENDER)
    assert_same(got, batch)
    assert got_meta == meta


def test_round_trip_of_zero_samples():
    batch = Batch({
        "reward": torch.zeros(0),
        "logits": torch.zeros(0, 4, dtype=torch.float64),
        "output_ids": Ragged.from_rows([], dtype=torch.int64),
        "tests": [],
    })
    got, meta = decode(as_bytes(encode(batch)), sender=SENDER)
    assert_same(got, batch)
    assert meta == {} and got.size == 0


def test_round_trip_of_a_batch_without_fields():
    got, _ = decode(as_bytes(encode(Batch({}))), sender=SENDER)
    assert len(got) == 0 and got.size == 0


def test_encode_sends_non_contiguous_and_grad_tensors_by_value():
    base = torch.arange(12.0, requires_grad=True).reshape(4, 3)
    batch = Batch({"x": base.t()})  # [3, 4], not contiguous
    got, _ = decode(as_bytes(encode(batch)), sender=SENDER)
    assert torch.equal(got["x"], base.detach().t())


def test_encode_frames_are_the_tensors_own_memory():
    reward = torch.rand(1000)
    frames = encode(Batch({"reward": reward}))
    assert np.frombuffer(frames[1], dtype=np.uint8).ctypes.data == reward.data_ptr()


def test_decoded_tensors_lie_inside_the_received_zmq_frames():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://codec-test")
        b.connect("inproc://codec-test")
        batch = Batch({"logits": torch.randn(4, 16384), "ids": Ragged.from_rows([torch.arange(5000)] * 4)})
        a.send_multipart(encode(batch), copy=False)
        assert b.poll(5000)
        frames = b.recv_multipart(copy=False)
        got, _ = decode(frames, sender=SENDER)
        for tensor, frame in [(got["logits"], frames[1]), (got["ids"].values, frames[2]),
                              (got["ids"].offsets, frames[3])]:
            start = np.frombuffer(frame.buffer, dtype=np.uint8).ctypes.data
            assert start <= tensor.data_ptr() < start + len(frame.buffer)
            assert tensor.data_ptr() + tensor.numel() * tensor.element_size() <= start + len(frame.buffer)
        assert_same(got, batch)
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_a_decoded_tensor_keeps_its_frame_alive():
    payload = torch.arange(256, dtype=torch.int64)
    frames = as_bytes(encode(Batch({"ids": payload})))
    buffer = np.frombuffer(frames[1], dtype=np.uint8).copy()  # an exporter that supports weakrefs
    alive = weakref.ref(buffer)
    got, _ = decode([frames[0], buffer], sender=SENDER)
    del buffer, frames
    gc.collect()
    assert alive() is not None
    assert torch.equal(got["ids"], payload)
    del got
    gc.collect()
    assert alive() is None


# --- hostile input -------------------------------------------------------------------------------------


def header(**overrides: Any) -> dict[str, Any]:
    """A valid header of one float32[4] tensor 'reward' and one int64 ragged 'ids' (4 samples, 6 tokens)."""
    base: dict[str, Any] = {
        "v": 1,
        "meta": {"sender": "score"},
        "size": 4,
        "fields": [
            {"name": "reward", "kind": "tensor", "dtype": "float32", "shape": [4], "nbytes": 16},
            {"name": "ids", "kind": "ragged", "dtype": "int64", "shape": [6], "nbytes": 48},
        ],
    }
    base.update(overrides)
    return base


def payloads(offsets: tuple[int, ...] = (0, 1, 1, 4, 6)) -> list[bytes]:
    return [bytes(16), bytes(48), torch.tensor(offsets, dtype=torch.int64).numpy().tobytes()]


def frames_of(head: Any, *rest: bytes) -> list[bytes]:
    return [msgpack.packb(head, use_bin_type=True), *rest]


def with_field(index: int, **changes: Any) -> dict[str, Any]:
    head = header()
    head["fields"][index].update(changes)
    return head


def test_the_hand_made_header_is_valid():
    got, meta = decode(frames_of(header(), *payloads()), sender=SENDER)
    assert got["ids"].lengths.tolist() == [1, 0, 3, 2] and meta == {"sender": "score"}


@pytest.mark.parametrize(
    "frames, message",
    [
        (frames_of(header(), bytes(12), *payloads()[1:]),
         "frame 1 from 'score'[1], field 'reward': header says float32[4] (16 B), got 12 B"),
        (frames_of(header(), *payloads()[:2]),
         "frame 3 from 'score'[1], field 'ids': missing; the header's fields need 4 frames, got 3"),
        (frames_of(header(), *payloads(), b"extra"),
         "frame 4 from 'score'[1]: unexpected; the header's fields need 4 frames, got 5"),
        (frames_of(header(), *payloads()[:2], bytes(32)),
         "frame 3 from 'score'[1], field 'ids': 4 samples need int64[5] offsets (40 B), got 32 B"),
        (frames_of([1, 2, 3]), "frame 0 from 'score'[1]: header must be a msgpack map, got a list"),
        (frames_of(header(v=2), *payloads()), "frame 0 from 'score'[1]: wire version 2, expected 1"),
        (frames_of(header(size=-1), *payloads()), "header 'size' must be an int >= 0, got -1"),
        (frames_of(header(meta=[]), *payloads()), "header 'meta' must be a map, got a list"),
        (frames_of({**header(), "extra": 1}, *payloads()),
         "header keys are ['extra', 'fields', 'meta', 'size', 'v']; "
         "expected ['fields', 'meta', 'size', 'v']"),
        (frames_of(with_field(0, dtype="complex64"), *payloads()),
         "field 'reward': unknown dtype 'complex64' (known: float32, float64"),
        (frames_of(with_field(0, dtype="object"), *payloads()), "field 'reward': unknown dtype 'object'"),
        (frames_of(with_field(0, shape=[-4], nbytes=-16), *payloads()),
         "field 'reward': shape must be a list of 1..8 ints >= 0, got [-4]"),
        (frames_of(with_field(0, shape=[True]), *payloads()), "shape must be a list of 1..8 ints >= 0"),
        (frames_of(with_field(0, shape=[2, 2]), *payloads()),
         "field 'reward': shape [2, 2] does not start with the header's size 4"),
        (frames_of(with_field(0, nbytes=12), *payloads()),
         "field 'reward': float32[4] is 16 B, 'nbytes' says 12"),
        (frames_of(with_field(1, name="reward"), *payloads()), "field 'reward': appears twice"),
        (frames_of(with_field(0, kind="pickle"), *payloads()), "kind 'pickle', expected one of"),
        (frames_of(header(fields=[{"name": "tests", "kind": "json", "value": [1, 2]}])),
         "field 'tests': a json field is a list of 4 items (header size), got 2 items"),
        (frames_of(header(fields=[])), "header says 4 samples but lists no fields"),
        (frames_of(header(), *payloads((1, 1, 1, 4, 6))),
         "frame 3 from 'score'[1], field 'ids': ragged offsets start at 1, expected 0"),
        (frames_of(header(), *payloads((0, 3, 1, 4, 6))),
         "field 'ids': ragged offsets decrease at row 1 (3 -> 1); expected non-decreasing"),
        (frames_of(header(), *payloads((0, 1, 1, 4, 7))),
         "field 'ids': ragged offsets end at 7 but values hold 6 rows"),
        (frames_of(with_field(0, dtype="bool", nbytes=4), bytes([0, 1, 2, 1]), *payloads()[1:]),
         "frame 1 from 'score'[1], field 'reward': bool bytes must be 0 or 1"),
        ([], "from 'score'[1]: empty message"),
        ([b"\x81\xa1v"], "frame 0 from 'score'[1]: header is not valid msgpack"),
    ],
)
def test_malformed_message_is_rejected_with_where_what_and_expected(frames, message):
    with pytest.raises(WireError) as caught:
        decode(frames, sender=SENDER)
    assert message in str(caught.value)


def test_header_with_a_non_string_map_key_is_rejected():
    with pytest.raises(WireError, match="frame 0 from 'score'\\[1\\]: header is not valid msgpack"):
        decode(frames_of(header(meta={1: "x"}), *payloads()), sender=SENDER)


@pytest.mark.parametrize("ext", [msgpack.ExtType(5, b"obj"), msgpack.Timestamp(1, 0)])
def test_header_with_an_extension_type_is_rejected(ext):
    with pytest.raises(WireError, match="header is not valid msgpack"):
        decode(frames_of(header(meta={"x": ext}), *payloads()), sender=SENDER)


def test_header_over_max_header_bytes_is_rejected_before_parsing():
    big = header(fields=[{"name": "tests", "kind": "json", "value": ["x" * 1000] * 4}])
    with pytest.raises(WireError, match=r"frame 0 from .*: header is \d+ B, over the 1000 B limit"):
        decode(frames_of(big), sender=SENDER, max_header_bytes=1000)


def test_frame_over_max_frame_bytes_is_rejected():
    batch = Batch({"x": torch.zeros(4, 64)})
    expected = r"frame 1 from .*, field 'x': header says float32\[4,64\] \(1024 B\), over the 1000 B limit"
    with pytest.raises(WireError, match=expected):
        decode(as_bytes(encode(batch)), sender=SENDER, max_frame_bytes=1000)


@pytest.mark.parametrize("max_frame_bytes", [1 << 30, 1 << 40])
def test_header_claiming_10_gb_is_rejected_fast_without_allocating(monkeypatch, max_frame_bytes):
    built: list[str] = []
    for fn in ("frombuffer", "empty", "zeros"):
        real = getattr(torch, fn)
        spy = lambda *a, _real=real, _fn=fn, **k: built.append(_fn) or _real(*a, **k)  # noqa: E731
        monkeypatch.setattr(torch, fn, spy)
    n = 10 * 2**30 // 4
    huge = header(size=n, fields=[{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [n],
                                   "nbytes": 4 * n}])
    frames = frames_of(huge, bytes(16))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(WireError, match=r"frame 1 from .*, field 'x': header says float32\[2684354560\]"):
            decode(frames, sender=SENDER, max_frame_bytes=max_frame_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 0.5
    assert peak < 1 << 20
    assert built == []


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.binary(max_size=80), min_size=1, max_size=5))
def test_random_bytes_never_decode_and_raise_only_wire_errors(frames):
    with pytest.raises(WireError):
        decode(frames, sender=SENDER)


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from([("v",), ("meta",), ("size",), ("fields",), ("fields", 0), ("fields", 1),
                          ("fields", 0, "name"), ("fields", 0, "kind"), ("fields", 0, "dtype"),
                          ("fields", 0, "shape"), ("fields", 0, "nbytes"), ("fields", 1, "shape"),
                          ("fields", 1, "kind"), ("fields", 1, "dtype"), ("fields", 1, "nbytes")]),
    value=plain,
)
def test_a_header_with_any_one_value_replaced_decodes_or_raises_a_wire_error(path, value):
    head, rest = header(), payloads()
    target = head
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        batch, _ = decode(frames_of(head, *rest), sender=SENDER)
    except WireError as exc:
        assert str(exc).startswith(("frame ", "from "))
    else:
        assert isinstance(batch, Batch)


def test_encode_refuses_a_dtype_the_wire_does_not_carry():
    with pytest.raises(TypeError, match="field 'z': dtype torch.complex64 cannot go on the wire"):
        encode(Batch({"z": torch.zeros(2, dtype=torch.complex64)}))


def test_encode_refuses_json_that_msgpack_cannot_carry():
    with pytest.raises(TypeError, match=r"batch header cannot be packed .*: field 'tests': "):
        encode(Batch({"ok": ["a"], "tests": [object()]}))
    with pytest.raises(TypeError, match=r"field 'outputs': Integer value out of range"):
        encode(Batch({"outputs": [[2**64]]}))
    with pytest.raises(TypeError, match=r"cannot be packed .*: the meta: "):
        encode(Batch({"ok": [1]}), {"big": 2**70})
