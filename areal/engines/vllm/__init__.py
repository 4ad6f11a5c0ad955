"""vLLM: the generation engine on vLLM (`generate.py`) and every vLLM call it makes, written down as data with the
releases they were checked against (`api.py`).

Part of the engines layer. Nothing here imports vLLM at import time: vLLM is imported where an engine starts, and
`api.py` is standard library only, so benchmarks/gpu/vllm_api.py can load it by its path beside a real vLLM.
"""
