"""What areal's vLLM backend (generate.py) calls of vLLM, written down as data, and the releases it was
checked against.

vLLM's engine API moves between releases, and the backend runs only on a GPU, so a renamed argument would
surface on the first lent GPU machine, mid-run. Here each call is listed with the arguments the backend passes
(and what it reads back from each step's outputs); `check(vllm)` holds them against the installed release's
own signatures with `inspect.signature`, which needs vLLM importable and no GPU. benchmarks/gpu/vllm_api.py runs
it, in a virtual environment of its own (vLLM brings a CUDA build of torch) and in the GPU suite; a test records
every call the backend makes against a stand-in vLLM and fails if one is missing here.

`SUPPORTED` is the range the check passed on, oldest and newest checked release; `unsupported` is the sentence
a run refuses another release with, before any engine starts (engines/__init__.py). Standard library only: the
check loads this file by its path, where areal's own dependencies may be missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from dataclasses import dataclass
from typing import Any

SUPPORTED = ("0.11.0", "0.33.0")  # the oldest and the newest release `check` passed on, both included


@dataclass(frozen=True)
class Call:
    """One call of the backend: `target` from the vllm package (`LLMEngine.add_request`), the positional arguments
    it passes after self, its keyword arguments, and keyword values that must be among the parameter's Literal."""

    target: str
    args: int = 0
    kwargs: tuple[str, ...] = ()
    values: tuple[tuple[str, str], ...] = ()
    use: str = ""  # what the backend uses it for


_ENGINE = ("model", "dtype", "seed", "gpu_memory_utilization", "max_num_seqs", "skip_tokenizer_init", "logprobs_mode",
           "worker_extension_cls", "scheduling_policy")
_CHOICES = (("logprobs_mode", "processed_logprobs"), ("scheduling_policy", "priority"))
CALLS = (
    Call("EngineArgs", kwargs=_ENGINE, values=_CHOICES,
         use="the engine: token ids only, behaviour log-probs after temperature, resubmitted requests first"),
    Call("EngineArgs", kwargs=(*_ENGINE, "enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank"),
         values=_CHOICES, use="a LoRA policy's engine: one adapter per version (engines/lora/slots.py)"),
    Call("LLMEngine.from_engine_args", args=1),
    Call("LLMEngine.add_request", args=3, kwargs=("priority",), use="a request, ahead of new ones when resubmitted"),
    Call("LLMEngine.add_request", args=3, kwargs=("lora_request", "priority"), use="a request under an adapter"),
    Call("LLMEngine.abort_request", args=1, use="interrupt: abort before new weights"),
    Call("LLMEngine.step", use="one scheduler step"),
    Call("LLMEngine.collective_rpc", args=1, kwargs=("args",), use="load weights in each worker (its extension)"),
    Call("LLMEngine.collective_rpc", args=1, use="take part in the weights group's broadcast, in each worker"),
    Call("LLMEngine.reset_prefix_cache", use="drop KV computed with the old weights"),
    Call("LLMEngine.add_lora", args=1, use="register a version's adapter"),
    Call("LLMEngine.remove_lora", args=1, use="retire an adapter"),
    Call("SamplingParams", kwargs=("max_tokens", "temperature", "top_p", "seed", "logprobs", "detokenize",
                                   "output_kind"), use="sampling: seeded per request, new tokens only"),
    Call("sampling_params.RequestOutputKind.DELTA", use="each step returns only the new tokens"),
    Call("lora.request.LoRARequest", kwargs=("lora_name", "lora_int_id", "lora_path"), use="an adapter"),
)
# what the backend reads of each step's outputs: class -> attributes
READS = {
    "outputs.RequestOutput": ("request_id", "outputs", "finished"),
    "outputs.CompletionOutput": ("token_ids", "logprobs"),
    "logprobs.Logprob": ("logprob",),
}


def release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string ("0.33.0", "0.12.0rc1", "0.33.1.dev5+gabc" -> (0, 33, 1))."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if found is None:
        raise ValueError(f"not a release: {version!r}")
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def supported_range() -> str:
    return f"{SUPPORTED[0]} to {SUPPORTED[1]}"


def unsupported(installed: str) -> str | None:
    """None when `installed` is in the checked range, else the sentence a run refuses it with."""
    oldest, newest = (release(v) for v in SUPPORTED)
    try:
        inside = oldest <= release(installed) <= newest
    except ValueError:
        inside = False
    if inside:
        return None
    return (f'generation.engine="vllm": vLLM {installed} is installed, but areal\'s vLLM backend is checked against '
            f"vLLM {supported_range()} (pip install 'vllm>={SUPPORTED[0]},<={SUPPORTED[1]}'); "
            'generation.engine="torch" runs without it.')


def check(vllm: Any, calls: tuple[Call, ...] = CALLS,
          reads: dict[str, tuple[str, ...]] = READS) -> list[tuple[str, str]]:
    """Each call and read (`CALLS`, `READS`) against the vLLM module given: (what, "ok" or what is wrong)."""
    rows = []
    for call in calls:
        called = call.args or call.kwargs or not call.target.endswith(".DELTA")
        shown = call.target + (f"({', '.join(['_'] * call.args + [f'{k}=' for k in call.kwargs])})" if called else "")
        try:
            rows.append((shown, _check_call(vllm, call)))
        except Exception as err:  # a missing module or attribute: said as the row's problem
            rows.append((shown, f"{type(err).__name__}: {err}"))
    for target, names in reads.items():
        try:
            have = _attributes(_resolve(vllm, target))
            missing = [n for n in names if n not in have]
            rows.append((f"{target}.{{{', '.join(names)}}}", f"no attribute {', '.join(missing)}" if missing else "ok"))
        except Exception as err:
            rows.append((target, f"{type(err).__name__}: {err}"))
    return rows


def _resolve(vllm: Any, target: str) -> Any:
    """`target` from the vllm package: a top-level name (`LLMEngine.step`), else the longest submodule its start
    names (`sampling_params.RequestOutputKind.DELTA`, `lora.request.LoRARequest`), then attributes."""
    parts = target.split(".")
    obj, rest = vllm, parts
    if not hasattr(vllm, parts[0]):
        for i in range(len(parts), 0, -1):
            try:
                obj, rest = importlib.import_module(".".join([vllm.__name__, *parts[:i]])), parts[i:]
                break
            except ImportError:
                continue
        else:
            raise ImportError(f"vllm has no {parts[0]!r}")
    for name in rest:
        obj = getattr(obj, name)
    return obj


def _check_call(vllm: Any, call: Call) -> str:
    obj = _resolve(vllm, call.target)
    if not call.args and not call.kwargs and not callable(obj) or call.target.endswith(".DELTA"):
        return "ok"  # an attribute read: resolving it was the check
    owner_path, _, name = call.target.rpartition(".")
    owner = _resolve(vllm, owner_path) if owner_path else None
    # a method read off its class takes self first; a classmethod (from_engine_args) comes bound
    takes_self = inspect.isclass(owner) and not isinstance(inspect.getattr_static(owner, name),
                                                           (classmethod, staticmethod))
    signature = inspect.signature(obj)
    try:
        signature.bind(*([None] * (call.args + takes_self)), **dict.fromkeys(call.kwargs))
    except TypeError as err:
        return f"does not take the call: {err} (signature {signature})"
    for keyword, value in call.values:
        options = _literal(obj, keyword)
        if options is not None and value not in options:
            return f"{keyword}={value!r} is not one of {options}"
    return "ok"


def _literal(obj: Any, name: str) -> tuple[Any, ...] | None:
    """The values a dataclass field's Literal type allows (read from its text when it cannot be resolved); None when
    it is no Literal."""
    annotation: Any = next((f.type for f in dataclasses.fields(obj) if f.name == name), None) \
        if dataclasses.is_dataclass(obj) else None
    try:
        annotation = typing.get_type_hints(obj).get(name, annotation)
    except Exception:
        pass  # a forward reference this check cannot resolve: the annotation's text is read instead
    if isinstance(annotation, str):
        quoted = [a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", annotation)]
        return tuple(quoted) if annotation.startswith(("Literal", "typing.Literal")) and quoted else None
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return None


def _attributes(cls: Any) -> set[str]:
    names = set(getattr(cls, "__annotations__", {})) | set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    try:
        names |= set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        pass
    return names
