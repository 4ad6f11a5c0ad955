"""The torch engine passes and reads the KV cache by the name transformers keeps (`cache`): the deprecated
`past_key_values` warned on every run and goes away in transformers 5.40."""

from __future__ import annotations

import logging
import warnings

from areal.engines import TorchGenerationEngine
from tests.engines.test_torch_generate import HEAVY_TAIL, NEVER, requests


def test_generating_with_a_refilled_batch_warns_of_no_deprecated_cache_name(make_model, monkeypatch):
    logged: list[str] = []  # transformers logs (once per process) when an output's `past_key_values` is read
    monkeypatch.setattr(logging.Logger, "warning_once", lambda self, message, *args, **kwargs: logged.append(message))
    engine = TorchGenerationEngine(make_model(0), eos_token_id=NEVER, pad_token_id=0, max_batch=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        results = engine.generate(requests(HEAVY_TAIL))
    assert [len(r.output_ids) for r in results] == [n for _, n in HEAVY_TAIL]  # prefill, refill and decode all ran
    assert not [m for m in logged if "past_key_values" in str(m)]

