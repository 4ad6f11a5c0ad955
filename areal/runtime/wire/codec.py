"""The wire format of a `Batch`: one msgpack header frame, then one raw frame per tensor.

The idea: tensors never pass through a serialiser. `encode` hands ZeroMQ the tensors' own
memory and `decode` wraps the received frames as tensors, so a 4 MB field is copied by
neither end. Because frames come from other processes, `decode` trusts nothing: it checks the
header's keys, dtypes, shapes and byte counts against the frames it holds before it builds a
single tensor, and msgpack runs with tight limits and no extension types, so a message can
neither build an object nor make this process allocate memory it did not already receive.
This module does not touch sockets; `channels.py` does.

Header (frame 0):

    {"v": 1, "meta": {...}, "size": S,
     "fields": [{"name": "reward", "kind": "tensor", "dtype": "float32", "shape": [S], "nbytes": 4*S},
                {"name": "versions", "kind": "ragged", "dtype": "int32", "shape": [N], "nbytes": 4*N},
                {"name": "tests", "kind": "json", "value": [... S plain objects ...]}]}

Frames 1.. follow the field order: a tensor field takes one frame, a ragged field two (its
values, then its offsets as int64[S+1]); a json field lives in the header and takes none.

Lifetime: `torch.frombuffer` keeps a reference to the object exporting the buffer (the zmq
frame), so a decoded tensor keeps its frame alive for as long as the tensor lives. Decoded
tensors share the frame's memory: an in-place op on them writes into that frame, which the
receiver alone owns.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]
import numpy as np
import torch
from torch import Tensor

from areal.errors import WireError
from areal.graph.batch import Batch, Field, Ragged

WIRE_VERSION = 1
MAX_HEADER_BYTES = 16 << 20  # bounds the json fields and meta, which are inlined in the header
MAX_DIMS = 8
MAX_NAME_CHARS = 200

WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}

_HEADER_KEYS = frozenset({"v", "meta", "size", "fields"})
_FIELD_KEYS = {
    "tensor": frozenset({"name", "kind", "dtype", "shape", "nbytes"}),
    "ragged": frozenset({"name", "kind", "dtype", "shape", "nbytes"}),
    "json": frozenset({"name", "kind", "value"}),
}

Frame = Any  # anything exporting a contiguous buffer: zmq.Frame, bytes, memoryview, bytearray


class FrameTooLarge(WireError):
    """A batch that could never cross the wire: a frame over the run's limits (the receiver would drop it)."""


class Unpackable(TypeError):
    """A json field or meta msgpack cannot carry (an object, an integer past 64 bits), named."""


def _unpackable(header: dict[str, Any]) -> str:
    """Which part of a header msgpack refuses: its first json field that fails alone, else the meta."""
    for field in header["fields"]:
        if field["kind"] == "json":
            try:
                msgpack.packb(field["value"], use_bin_type=True)
            except (TypeError, ValueError, OverflowError):
                return f"field {field['name']!r}"
    return "the meta"


def encode(batch: Batch, meta: Mapping[str, Any] | None = None, *, max_frame_bytes: int | None = None,
           max_header_bytes: int | None = None) -> list[bytes | memoryview]:
    """Frames for `batch`: the packed header, then views of the tensors' memory (no copy).

    The views keep their tensors alive; send them with `copy=False`. CPU tensors that are
    already contiguous are not copied. `meta` and json fields must be msgpack-able plain
    objects whose maps have str keys (the receiver rejects anything else). With limits given,
    a frame over them raises `FrameTooLarge` naming the field, before anything is sent: the
    receiver's ZeroMQ would drop the connection without a word.
    """
    fields: list[dict[str, Any]] = []
    frames: list[bytes | memoryview] = []
    for name, value in batch.items():
        if isinstance(value, Ragged):
            values = _wire_tensor(name, value.values)
            fields.append(_describe(name, "ragged", values))
            frames += [_raw(values), _raw(value.offsets.contiguous())]
        elif isinstance(value, Tensor):
            tensor = _wire_tensor(name, value)
            if tensor.dim() == 0:
                raise ValueError(f"field {name!r}: a 0-dim tensor has no sample dim; give it shape [S]")
            fields.append(_describe(name, "tensor", tensor))
            frames.append(_raw(tensor))
        else:
            fields.append({"name": name, "kind": "json", "value": value})
    header = {"v": WIRE_VERSION, "meta": dict(meta or {}), "size": batch.size, "fields": fields}
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Unpackable(f"batch header cannot be packed (meta and json fields hold plain objects): "
                         f"{_unpackable(header)}: {exc}") from exc
    if max_header_bytes is not None and len(packed) > max_header_bytes:
        sizes = {f["name"]: len(msgpack.packb(f["value"], use_bin_type=True)) for f in fields if f["kind"] == "json"}
        largest = max(sizes, key=sizes.__getitem__) if sizes else None
        biggest = f"; its largest json field is '{largest}' ({sizes[largest]} B)" if largest else ""
        raise FrameTooLarge(f"the batch's header is {len(packed)} B, over transport.max_header_bytes="
                            f"{max_header_bytes}{biggest}")
    if max_frame_bytes is not None:
        tensor_fields = [f for f in fields if f["kind"] != "json" for _ in range(2 if f["kind"] == "ragged" else 1)]
        for field, frame in zip(tensor_fields, frames):
            if len(frame) > max_frame_bytes:
                raise FrameTooLarge(f"field '{field['name']}' is {len(frame)} B on the wire, over "
                                    f"transport.max_frame_bytes={max_frame_bytes}")
    return [packed, *frames]


def _wire_tensor(name: str, tensor: Tensor) -> Tensor:
    if tensor.dtype not in _DTYPE_NAMES:
        known = ", ".join(WIRE_DTYPES)
        raise TypeError(f"field {name!r}: dtype {tensor.dtype} cannot go on the wire (known: {known})")
    return tensor.detach().cpu().contiguous()


def _describe(name: str, kind: str, tensor: Tensor) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "dtype": _DTYPE_NAMES[tensor.dtype],
        "shape": list(tensor.shape),
        "nbytes": tensor.numel() * tensor.element_size(),
    }


def _raw(tensor: Tensor) -> memoryview:
    if tensor.numel() == 0:
        return memoryview(b"")  # memoryview cannot cast a shape with a zero in it
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: send its bits
        tensor = tensor.view(torch.int16)
    # the array's base is the tensor, so the view keeps the tensor's storage alive
    array: Any = tensor.numpy()  # numpy's stubs predate typing.Buffer
    return memoryview(array).cast("B")


def decode(
    frames: Sequence[Frame],
    *,
    sender: str,
    max_frame_bytes: int = 1 << 30,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> tuple[Batch, dict[str, Any]]:
    """The batch and meta carried by `frames`, wrapped without copying.

    `sender` is how errors name the peer (e.g. `'score'[1]`). Every check runs before this
    process allocates anything: a header claiming 10 GB costs nothing (offsets and bools are
    checked through views of their own frames). Raises `WireError`.
    """
    if not frames:
        raise WireError(f"from {sender}: empty message; expected a header frame")
    views = [_view(frame, i, sender) for i, frame in enumerate(frames)]
    header = _read_header(views[0], sender, max_header_bytes)
    specs = _check_header(header, sender, max_frame_bytes)
    size: int = header["size"]
    _check_frames(specs, views, sender, size)
    if not any(view.readonly for view in views[1:]):
        return _build(specs, views, size, sender), header["meta"]
    # bytes frames (tests, in-process use) are read-only and torch warns about them; zmq frames are not
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        return _build(specs, views, size, sender), header["meta"]


def _build(specs: list[_Spec], views: list[memoryview], size: int, sender: str) -> Batch:
    out: dict[str, Field] = {}
    for spec in specs:
        if spec.kind == "json":
            out[spec.name] = spec.value
        elif spec.kind == "tensor":
            _check_bools(views[spec.frame], spec, spec.frame, sender)
            out[spec.name] = _tensor(views[spec.frame], spec.dtype, spec.shape)
        else:
            _check_bools(views[spec.frame], spec, spec.frame, sender)
            offsets = _tensor(views[spec.frame + 1], torch.int64, [size + 1])
            _check_offsets(offsets, spec, sender)
            out[spec.name] = Ragged(_tensor(views[spec.frame], spec.dtype, spec.shape), offsets)
    return Batch(out)


class _Spec:
    """One field as the header describes it, already checked, with its first frame's index."""

    __slots__ = ("name", "kind", "dtype", "shape", "nbytes", "value", "frame")

    def __init__(self, name: str, kind: str, frame: int) -> None:
        self.name, self.kind, self.frame = name, kind, frame
        self.dtype = torch.uint8
        self.shape: list[int] = []
        self.nbytes = 0
        self.value: list[Any] = []

    def __str__(self) -> str:
        return f"{_DTYPE_NAMES[self.dtype]}[{','.join(map(str, self.shape))}] ({self.nbytes} B)"


def _view(frame: Frame, index: int, sender: str) -> memoryview:
    try:
        view = memoryview(frame)
    except TypeError:
        raise WireError(f"frame {index} from {sender}: not a buffer (got {type(frame).__name__})") from None
    if view.ndim != 1 or view.format != "B":
        if not view.c_contiguous:
            raise WireError(f"frame {index} from {sender}: buffer is not contiguous")
        view = view.cast("B")
    return view


def _read_header(view: memoryview, sender: str, max_header_bytes: int) -> dict[str, Any]:
    at, n = f"frame 0 from {sender}", view.nbytes
    if n > max_header_bytes:
        raise WireError(f"{at}: header is {n} B, over the {max_header_bytes} B limit "
                        "(json fields too large? raise max_header_bytes on the receiver)")
    try:
        # every limit is the frame's own length: no length prefix can claim more than arrived;
        # max_ext_len=0 refuses every extension type (timestamps included)
        header = msgpack.unpackb(view, raw=False, strict_map_key=True, use_list=True,
                                 max_bin_len=n, max_str_len=n, max_array_len=n, max_map_len=n, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise WireError(f"{at}: header is not valid msgpack ({exc})") from None
    if not isinstance(header, dict):
        raise WireError(f"{at}: header must be a msgpack map, got {_kind(header)}")
    if set(header) != _HEADER_KEYS:
        raise WireError(f"{at}: header keys are {_keys(header)}; expected {_keys(_HEADER_KEYS)}")
    if not _is_int(header["v"]) or header["v"] != WIRE_VERSION:
        raise WireError(f"{at}: wire version {_show(header['v'])}, expected {WIRE_VERSION}")
    if not isinstance(header["meta"], dict):
        raise WireError(f"{at}: header 'meta' must be a map, got {_kind(header['meta'])}")
    if not _is_int(header["size"]) or header["size"] < 0:
        raise WireError(f"{at}: header 'size' must be an int >= 0, got {_show(header['size'])}")
    if not isinstance(header["fields"], list):
        raise WireError(f"{at}: header 'fields' must be a list, got {_kind(header['fields'])}")
    return header


def _check_header(header: dict[str, Any], sender: str, max_frame_bytes: int) -> list[_Spec]:
    size: int = header["size"]
    specs: list[_Spec] = []
    seen: set[str] = set()
    frame = 1
    for i, entry in enumerate(header["fields"]):
        at = f"frame 0 from {sender}, field #{i}"
        if not isinstance(entry, dict):
            raise WireError(f"{at}: must be a map, got {_kind(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise WireError(f"{at}: 'name' must be a str of 1..{MAX_NAME_CHARS} chars, got {_show(name)}")
        at = f"frame 0 from {sender}, field {_show(name)}"
        if name in seen:
            raise WireError(f"{at}: appears twice")
        seen.add(name)
        kind = entry.get("kind")
        if not isinstance(kind, str) or kind not in _FIELD_KEYS:
            raise WireError(f"{at}: kind {_show(kind)}, expected one of {', '.join(_FIELD_KEYS)}")
        if set(entry) != _FIELD_KEYS[kind]:
            raise WireError(f"{at}: keys are {_keys(entry)}; a {kind} field has {_keys(_FIELD_KEYS[kind])}")
        spec = _Spec(name, kind, frame)
        if kind == "json":
            value = entry["value"]
            if not isinstance(value, list) or len(value) != size:
                got = f"{len(value)} items" if isinstance(value, list) else _kind(value)
                raise WireError(f"{at}: a json field is a list of {size} items (header size), got {got}")
            spec.value = value
        else:
            _check_tensor_entry(spec, entry, sender, size, max_frame_bytes)
            frame += 2 if kind == "ragged" else 1
        specs.append(spec)
    if not specs and size != 0:
        raise WireError(f"frame 0 from {sender}: header says {size} samples but lists no fields")
    return specs


def _check_tensor_entry(spec: _Spec, entry: dict[str, Any], sender: str, size: int, max_bytes: int) -> None:
    at = f"frame 0 from {sender}, field {_show(spec.name)}"
    dtype, shape, nbytes = entry["dtype"], entry["shape"], entry["nbytes"]
    if not isinstance(dtype, str) or dtype not in WIRE_DTYPES:
        raise WireError(f"{at}: unknown dtype {_show(dtype)} (known: {', '.join(WIRE_DTYPES)})")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMS
            or not all(_is_int(d) and d >= 0 for d in shape)):
        raise WireError(f"{at}: shape must be a list of 1..{MAX_DIMS} ints >= 0, got {_show(shape)}")
    if not _is_int(nbytes) or nbytes < 0:
        raise WireError(f"{at}: 'nbytes' must be an int >= 0, got {_show(nbytes)}")
    spec.dtype, spec.shape, spec.nbytes = WIRE_DTYPES[dtype], shape, nbytes
    expected = math.prod(shape) * spec.dtype.itemsize
    if expected != nbytes:
        raise WireError(f"{at}: {dtype}[{','.join(map(str, shape))}] is {expected} B, 'nbytes' says {nbytes}")
    if nbytes > max_bytes:
        raise WireError(f"frame {spec.frame} from {sender}, field {_show(spec.name)}: header says {spec}, "
                        f"over the {max_bytes} B limit (max_frame_bytes)")
    if spec.kind == "tensor" and shape[0] != size:
        raise WireError(f"{at}: shape {shape} does not start with the header's size {size}")
    if spec.kind == "ragged" and (size + 1) * 8 > max_bytes:
        raise WireError(f"frame {spec.frame + 1} from {sender}, field {_show(spec.name)}: "
                        f"{size + 1} offsets are over the {max_bytes} B limit (max_frame_bytes)")


def _check_frames(specs: list[_Spec], views: list[memoryview], sender: str, size: int) -> None:
    expected: list[tuple[_Spec, str, int]] = []  # (field, what the header says, nbytes) of frames 1..
    for spec in specs:
        if spec.kind != "json":
            expected.append((spec, f"header says {spec}", spec.nbytes))
        if spec.kind == "ragged":
            offsets_bytes = (size + 1) * 8
            expected.append((spec, f"{size} samples need int64[{size + 1}] offsets ({offsets_bytes} B)",
                             offsets_bytes))
    need, got = 1 + len(expected), len(views)
    if got < need:
        raise WireError(f"frame {got} from {sender}, field {_show(expected[got - 1][0].name)}: missing; "
                        f"the header's fields need {need} frames, got {got}")
    if got > need:
        raise WireError(f"frame {need} from {sender}: unexpected; the header's fields need {need} frames, "
                        f"got {got}")
    # the header's sizes are already within max_frame_bytes, so equal lengths are too
    for index, (spec, says, nbytes) in enumerate(expected, start=1):
        if views[index].nbytes != nbytes:
            raise WireError(f"frame {index} from {sender}, field {_show(spec.name)}: {says}, "
                            f"got {views[index].nbytes} B")


def _tensor(view: memoryview, dtype: torch.dtype, shape: list[int]) -> Tensor:
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dtype)  # frombuffer refuses empty buffers
    return torch.frombuffer(view, dtype=dtype).view(shape)


def _check_bools(view: memoryview, spec: _Spec, frame: int, sender: str) -> None:
    # a torch bool holding a byte other than 0 or 1 makes later ops undefined
    if spec.dtype == torch.bool and view.nbytes and np.frombuffer(view, dtype=np.uint8).max() > 1:
        raise WireError(f"frame {frame} from {sender}, field {_show(spec.name)}: bool bytes must be 0 or 1")


def _check_offsets(offsets: Tensor, spec: _Spec, sender: str) -> None:
    where = f"frame {spec.frame + 1} from {sender}, field {_show(spec.name)}"
    values = offsets.numpy()  # numpy: a few µs for 8 samples, vectorised for 100k
    if values[0] != 0:
        raise WireError(f"{where}: ragged offsets start at {values[0]}, expected 0")
    decreasing = (values[1:] < values[:-1]).nonzero()[0]
    if len(decreasing):
        row = int(decreasing[0])
        raise WireError(f"{where}: ragged offsets decrease at row {row} "
                        f"({values[row]} -> {values[row + 1]}); expected non-decreasing")
    if values[-1] != spec.shape[0]:
        raise WireError(f"{where}: ragged offsets end at {values[-1]} but values hold {spec.shape[0]} rows")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    names: dict[type, str] = {dict: "a map", list: "a list", str: "a str", bytes: "bytes"}
    return names.get(type(value), type(value).__name__)


def _keys(keys: Any) -> str:
    return "[" + ", ".join(sorted(_show(k) for k in keys)) + "]"


def _show(value: object) -> str:
    """repr() cut short: values in errors come from the peer and may be huge or hostile."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
