"""Every vLLM call areal's vLLM backend makes, checked against the installed vLLM's own signatures (no GPU needed).

    /work/vllm-venv/bin/python benchmarks/gpu/vllm_api.py      # a virtual environment holding vLLM alone
    python -m benchmarks.gpu.vllm_api --json out.json          # as a section of the GPU suite (suite.py)

The calls are listed in areal/engines/vllm/api.py, which is loaded by its path, so this runs where vLLM is
installed and areal's own dependencies are not (vLLM brings a CUDA build of torch: keep it out of the project's
environment). Without vLLM it says so and checks nothing; a call the installed release does not take, or a
release outside the supported range, is an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "areal" / "engines" / "vllm" / "api.py"


def _api():
    spec = importlib.util.spec_from_file_location("areal_vllm_api", API)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def measure() -> dict:
    api = _api()
    try:
        import vllm  # type: ignore[import-not-found]
    except ImportError as err:
        return {"vllm": None, "skipped": f"vLLM is not installed here ({err}): nothing to check",
                "supported": list(api.SUPPORTED)}
    rows = api.check(vllm)
    result = {"vllm": vllm.__version__, "supported": list(api.SUPPORTED), "rows": dict(rows)}
    problems = [f"{what}: {why}" for what, why in rows if why != "ok"]
    refused = api.unsupported(vllm.__version__)
    if refused:
        problems.append(refused)
    if problems:
        result["error"] = f"{len(problems)} problem(s) with vLLM {vllm.__version__}: " + "; ".join(problems)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the result here (the GPU suite's sections do)")
    parser.add_argument("--device", default="", help="ignored: the check needs no device")
    parser.add_argument("--tiny", action="store_true", help="ignored: the check has one size")
    parser.add_argument("--variant", default="", help="ignored")
    args = parser.parse_args()
    result = measure()
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"vLLM {result['vllm'] or '(not installed)'}; supported {' to '.join(result['supported'])}")
    for what, why in result.get("rows", {}).items():
        print(f"  {'ok ' if why == 'ok' else 'BAD'} {what}" + ("" if why == "ok" else f"\n      {why}"))
    print(result.get("error") or result.get("skipped") or f"every call checked: {len(result['rows'])} ok")
    sys.exit(1 if "error" in result else 0)


if __name__ == "__main__":
    main()
