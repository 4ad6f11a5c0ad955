"""The GPU suite's results as the markdown tables pasted into docs/benchmarks.md and a closing note."""

from __future__ import annotations

from collections.abc import Iterable


def _cell(value: object, spec: str = ".3g") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return " ".join(str(value).split())  # an error's lines would end the table's row


def _table(header: list[str], rows: Iterable[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.1f} %"


def _device(results: dict[str, dict]) -> list[str]:
    facts = next((r["device"] for r in results.values() if isinstance(r.get("device"), dict)), None)
    if facts is None:
        return []
    return ["## Device", ""] + _table(
        ["device", "torch", "CUDA", "transformers", "bf16 matmul measured (TFLOP/s)", "datasheet bf16 (TFLOP/s)"],
        [[facts["name"], facts["torch"], facts.get("cuda"), facts["transformers"], facts["matmul_tflops"],
          facts["datasheet_tflops"]]]) + [""]


def _generation(r: dict) -> list[str]:
    rows = r["rows"]
    engine_fixed = rows["fixed: engine"]["tokens_per_s"]
    engine_tails = rows["tails: engine, refill at 1 free"]["tokens_per_s"]
    lines = [f"## Generation: {r['model']['shape']} ({r['model']['params'] / 1e6:.3g} M params), {r['dtype']}, "
             f"batch {r['sizes']['batch']}", "",
             f"Fixed: {r['sizes']['batch']} rows × {r['sizes']['new_tokens']} new tokens. Tails: "
             f"{r['sizes']['requests']} requests, output lengths mean {r['lengths']['mean']:.0f}, max "
             f"{r['lengths']['max']}.", ""]
    if "graphs" in r:
        lines += ["\"engine\" is today's (Hugging Face's forward); \"fixed step\" the slot cache and lean forward, "
                  f"its decode step in CUDA graphs ({r['graphs']}; {r['graphs_captured']} captured for the fixed "
                  "batch) or eager.", ""]
    generate = {kind: rows.get(f"{kind}: transformers generate" + (", static batches" if kind == "tails" else ""),
                               {}).get("tokens_per_s") for kind in ("fixed", "tails")}
    body = []
    for name, row in rows.items():
        kind = "fixed" if name.startswith("fixed") else "tails"
        base = engine_fixed if kind == "fixed" else engine_tails
        versus = generate[kind]
        body.append([name, row["tokens"], row["seconds"], f"{row['tokens_per_s']:.0f}",
                     f"{row['tokens_per_s'] / base:.2f}x", f"{row['tokens_per_s'] / versus:.2f}x" if versus else "—",
                     row["peak_gib"]])
    return lines + _table(["path", "tokens", "s", "tokens/s", "× today's engine", "× generate", "peak GiB"],
                          body) + [""]


def _training(results: dict[str, dict]) -> list[str]:
    runs = [r for k, r in results.items() if k.startswith("training") and "rows" in r]
    if not runs:
        return []
    first = runs[0]
    lines = [f"## Training: {first['model']['shape']}, {first['dtype']}, {first['sizes']['sequences']} sequences × "
             f"{first['sizes']['length']} tokens, micro-batches of {first['sizes']['microbatch_tokens']} tokens", ""]
    body = [[r["engine"], name + (f" ({row['positions']} positions)" if "positions" in row else ""),
             f"{row['tokens_per_s']:.0f}", row["seconds"], _percent(row["mfu_datasheet"]),
             _percent(row["mfu_matmul"]), row["peak_gib"]] for r in runs for name, row in r["rows"].items()]
    header = ["engine", "pass", "tokens/s", "s per pass", "MFU (datasheet)", "MFU (measured matmul)", "peak GiB"]
    return lines + _table(header, body) + [""]


def _weights(r: dict) -> list[str]:
    lines = [f"## Weight publication: {r['model']['shape']}, {r['dtype']}, {r['tensors']} tensors, "
             f"{r['bytes'] / 1e9:.2f} GB, best of {r['rounds']}", ""]
    body = [[route, row.get("latency_s"), row.get("gb_per_s"), row.get("trainer_blocked_s"),
             row.get("trainer_peak_gib"), row.get("error", "")] for route, row in r["rows"].items()]
    header = ["route", "trainer start → generator loaded (s)", "GB/s", "trainer blocked (s)", "trainer peak GiB",
              "note"]
    return lines + _table(header, body) + [""]


def _recipe(r: dict) -> list[str]:
    sync = r["rows"]["sync η=0"]["samples_per_s"]
    lines = [f"## The runtime on the device: {r['recipe']}, {r['steps']} steps each", ""]
    if r.get("code_rl_error"):
        lines += [f"code_rl failed here ({r['code_rl_error'][:200]}); {r['recipe']} ran in its place.", ""]
    body = [[mode, f"{row['samples_per_s']:.1f}", f"{row['samples_per_s'] / sync:.2f}x", row["wall_s"],
             row["trained"], row["t_train_s"], row["t_step_s"], row["gpu_peak_mib"]]
            for mode, row in r["rows"].items()]
    header = ["mode", "samples/s", "vs sync", "wall s", "trained", "train s/step", "step s", "GPU peak MiB"]
    return lines + _table(header, body) + [""]


def _vllm_api(r: dict) -> list[str]:
    supported = " to ".join(r["supported"])
    if r.get("vllm") is None:
        return [f"## vLLM's API: {r.get('skipped', 'not checked')} (supported: {supported})", ""]
    lines = [f"## vLLM's API: every call of the backend against vLLM {r['vllm']} (supported: {supported})", ""]
    return lines + _table(["call", "check"], ([what, why] for what, why in r["rows"].items())) + [""]


RENDERERS = {"generation": _generation, "weights": _weights, "recipe": _recipe, "vllm api": _vllm_api}


def render(results: dict[str, dict]) -> str:
    lines = ["# GPU suite", ""] + _device(results)
    for key, result in results.items():
        if "error" in result:
            lines += [f"**{key}**: {result['error']}", ""]
    lines += _training(results)
    for key, renderer in RENDERERS.items():
        if key in results and "error" not in results[key]:
            lines += renderer(results[key])
    walls = ", ".join(f"{k} {r['wall_s']:.0f} s" for k, r in results.items() if "wall_s" in r)
    return "\n".join(lines + [f"Section wall times: {walls}.", ""])
