"""LoRA on the trainer and what travels: only adapters train (and only their moments are kept), the factors a
trainer publishes merge on a generator into exactly the policy the trainer holds (float64), the gradient through
the adapters is float64's, a PEFT directory loads back in peft as the same policy, and a checkpoint's adapter
resumes only onto its own base."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from areal.config import LoraConfig
from areal.engines import TorchTrainEngine
from areal.engines.lora import KIND, Merger, adapter_file, factor_pairs, is_adapter, save_adapter, write_peft_dir
from areal.engines.lora.training import adapter_factors, base_sha256, with_adapters
from areal.engines.training.trainer_settings import TrainSettings, enter_update_mode
from areal.errors import ConfigError
from areal.nodes.workers.trainer import BASE_FILE, TrainerNode
from tests.engines.conftest import tiny_qwen2

LORA = LoraConfig(rank=4, alpha=12.0)  # scale α/r = 3
SEQS = [torch.tensor([1, 5, 9, 2, 7, 3]), torch.tensor([4, 4, 8, 1]), torch.tensor([2, 6, 3, 3, 9, 9, 1])]


def _trained_adapters(model, seed: int = 1):
    """A policy with LoRA adapters whose B is no longer zero (as after some steps)."""
    wrapped = with_adapters(model, LORA)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return wrapped


def _logits(model, seqs=SEQS):
    model.eval()
    with torch.no_grad():
        return [model(input_ids=s[None], use_cache=False).logits[0] for s in seqs]


def test_the_published_factors_merge_into_exactly_the_policy_the_trainer_holds_in_float64():
    trainer = _trained_adapters(tiny_qwen2(0).double())
    adapter = adapter_factors(trainer)
    assert is_adapter(adapter) and all(k.endswith(("::lora_A", "::lora_B")) for k in adapter)
    # every linear layer but the output head: 7 per layer (q k v o gate up down), 2 layers
    assert len(factor_pairs(adapter)) == 14
    generator = tiny_qwen2(0).double()  # a generator holds the base only
    generator.load_state_dict(Merger(generator.state_dict()).merged(adapter))
    for got, want in zip(_logits(generator), _logits(trainer)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # one weight by hand: W0 + (α/r)·B·A
    q = trainer.base_model.model.model.layers[0].self_attn.q_proj
    by_hand = q.base_layer.weight + 3.0 * q.lora_B["default"].weight @ q.lora_A["default"].weight
    torch.testing.assert_close(generator.model.layers[0].self_attn.q_proj.weight, by_hand, rtol=0, atol=1e-12)


def test_a_merger_keeps_the_base_so_each_version_replaces_the_last_instead_of_adding_to_it():
    generator = tiny_qwen2(0)
    merger = Merger(generator.state_dict())
    first = adapter_factors(_trained_adapters(tiny_qwen2(0), seed=1))
    second = adapter_factors(_trained_adapters(tiny_qwen2(0), seed=2))
    generator.load_state_dict(merger.merged(first))
    generator.load_state_dict(merger.merged(second))
    fresh = tiny_qwen2(0)
    fresh.load_state_dict(Merger(fresh.state_dict()).merged(second))
    for got, want in zip(generator.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(got, want)
    assert len(merger.base) == 14  # copies of the touched weights only: not the embedding, not the norms


def test_only_the_adapters_train_and_the_optimizer_holds_their_moments_alone():
    base = tiny_qwen2(0)
    before = copy.deepcopy(base.state_dict())
    engine = TorchTrainEngine(with_adapters(base, LORA), TrainSettings(lr=1e-2))
    adapters_before = {k: t.clone() for k, t in adapter_factors(engine.model).items()}
    engine.train_step(SEQS, [2, 1, 3], lambda logp, mb: (-logp.mean(), {}))
    moments = engine.optimizer_moments()
    assert moments and all("lora_" in k for k in moments)
    frozen = {k.replace("base_model.model.", "").replace("base_layer.", ""): t
              for k, t in engine.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(frozen[k], t) for k, t in before.items())  # the base did not move
    after = adapter_factors(engine.model)
    assert any(not torch.equal(after[k], t) for k, t in adapters_before.items())


def test_the_adapters_gradient_in_the_engine_is_float64s():
    model32 = _trained_adapters(tiny_qwen2(0))
    model64 = copy.deepcopy(model32).double()
    grads = {}
    for name, model in (("32", model32), ("64", model64)):
        engine = TorchTrainEngine(model, TrainSettings(lr=0.0, grad_clip=None))
        engine.optimizer.step = lambda: None  # keep the gradients for reading
        engine.train_step(SEQS, [2, 1, 3], lambda logp, mb: (-(logp * torch.arange(len(logp))).mean(), {}))
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert set(grads["32"]) == set(grads["64"]) and all("lora_" in n for n in grads["32"])
    for n, g64 in grads["64"].items():
        torch.testing.assert_close(grads["32"][n].double(), g64, rtol=1e-4, atol=1e-6)


def test_a_peft_directory_loads_back_in_peft_as_the_same_policy(tmp_path):
    from peft import PeftModel

    trainer = _trained_adapters(tiny_qwen2(0).double())
    folder = write_peft_dir(adapter_factors(trainer), tmp_path / "adapter", base="tiny", base_sha256="abc")
    assert json.loads((folder / "areal_adapter.json").read_text())["base_sha256"] == "abc"
    loaded = PeftModel.from_pretrained(tiny_qwen2(0).double(), str(folder))
    for got, want in zip(_logits(loaded), _logits(trainer)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_an_adapter_file_is_marked_and_names_its_base_and_a_full_weights_file_is_not(tmp_path):
    trainer = _trained_adapters(tiny_qwen2(0))
    save_adapter(adapter_factors(trainer), tmp_path / "a.safetensors", base_sha256="f00d")
    assert adapter_file(tmp_path / "a.safetensors") == {"areal_weights": KIND, "base_sha256": "f00d"}
    from safetensors.torch import save_file

    save_file({k: t.clone() for k, t in tiny_qwen2(0).state_dict().items()}, str(tmp_path / "full.safetensors"))
    assert adapter_file(tmp_path / "full.safetensors") is None


def test_a_lora_checkpoint_resumes_its_adapters_and_only_onto_its_own_base(tmp_path):
    engine = TorchTrainEngine(_trained_adapters(tiny_qwen2(0)), TrainSettings(lr=1e-2))
    engine.train_step(SEQS, [2, 1, 3], lambda logp, mb: (-logp.mean(), {}))
    node = TrainerNode()
    node.lora, node.engine, node.version = LORA, engine, 1
    node.base_sha256 = base_sha256(tiny_qwen2(0).state_dict())
    node.save_checkpoint(str(tmp_path))
    assert (tmp_path / "model" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "model" / "model.safetensors").exists()  # the base is not written again
    resumed = TorchTrainEngine(with_adapters(tiny_qwen2(0), LORA), TrainSettings(lr=1e-2))
    assert resumed.load(tmp_path) == 1
    want = adapter_factors(engine.model)
    assert all(torch.equal(t, want[k]) for k, t in adapter_factors(resumed.model).items())
    node._check_base(tmp_path)  # the same base: accepted
    node.base_sha256 = base_sha256(tiny_qwen2(1).state_dict())
    with pytest.raises(ConfigError, match=r"LoRA adapters of a base whose weights hash to .* but the run's model"):
        node._check_base(tmp_path)
    assert json.loads((tmp_path / BASE_FILE).read_text())["base_sha256"] != node.base_sha256


def test_a_target_that_is_not_a_linear_layer_is_refused_naming_it_and_the_models_linear_layers():
    with pytest.raises(ConfigError, match=r"reaches base_model\.model\.model\.embed_tokens \(Embedding\), not a "
                                          r"plain linear layer .*; name linear ones: this model's are down_proj, "
                                          r"gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj$"):
        with_adapters(tiny_qwen2(0), LoraConfig(rank=2, target_modules=["embed_tokens"]))
    import transformers  # GPT-2's projections are transposed Conv1D layers: nothing its generators could merge

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
    with pytest.raises(ConfigError, match=r"reaches .*c_attn \(Conv1D\).*this model has no linear layers but "
                                          r"its output head, so its LoRA cannot be trained here$"):
        with_adapters(gpt2, LoraConfig(rank=2))


def test_a_frozen_reference_inside_a_lora_trainer_is_its_model_with_the_adapters_off_in_float64():
    from types import SimpleNamespace

    from areal.graph.batch import Batch, Ragged
    from areal.nodes.workers.trainer import TRAINERS, ProximalNode

    trainer = SimpleNamespace(engine=TorchTrainEngine(_trained_adapters(tiny_qwen2(0).double())))
    TRAINERS["lora-actor"] = trainer
    try:
        reference = ProximalNode(frozen=True, output="ref_logp")
        reference.setup(SimpleNamespace(pool=SimpleNamespace(role="train", name="lora-actor")))
        batch = Batch({"prompt_ids": Ragged.from_rows([s[:2] for s in SEQS]),
                       "output_ids": Ragged.from_rows([s[2:] for s in SEQS])})
        got = reference(batch)["ref_logp"].rows()
    finally:
        del TRAINERS["lora-actor"]
    base = TorchTrainEngine(tiny_qwen2(0).double()).sequence_logprobs(SEQS)
    adapted = trainer.engine.sequence_logprobs(SEQS)  # the adapters are back on after the reference's pass
    for g, b, a in zip(got, base, adapted):
        torch.testing.assert_close(g.double(), b[1:].double(), rtol=0, atol=1e-6)  # float32 rows of float64 logps
        assert not torch.allclose(a[1:].double(), b[1:].double(), atol=1e-3)
    assert reference.engine is None  # no second model was loaded


@pytest.mark.parametrize("lora_dropout", [0.0, 0.5])
def test_an_adapters_dropout_acts_in_the_update_and_the_base_models_own_does_not(lora_dropout):
    model = tiny_qwen2(0)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    wrapped = with_adapters(model, LoraConfig(rank=4, alpha=12.0, dropout=lora_dropout))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    enter_update_mode(wrapped, TrainSettings())
    outputs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs.append(wrapped(input_ids=SEQS[0][None], use_cache=False).logits)
    assert torch.equal(*outputs) == (lora_dropout == 0.0)
