"""The engines RunConfig names: torch by default, vLLM refused with the way out, FSDP on one gloo rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from areal.cli.run import _check_engines, build_controller
from areal.config import GenerationConfig, RunConfig, TrainerConfig
from areal.engines import (
    TorchGenerationEngine,
    TorchTrainEngine,
    engine_problems,
    generation_engine,
    torch_generation_engine,
    train_engine,
)
from areal.engines.decode import SlotGenerationEngine
from areal.errors import ConfigError
from areal.graph.batch import Batch, Ragged
from areal.graph.recipe import load_recipe
from areal.models.loading import load_model, load_tokenizer
from areal.nodes.workers.generate import GenerateNode
from areal.nodes.workers.trainer import TrainerNode
from tests.local_model import make_checkpoint

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "code_rl.py"
NO_VLLM_NO_GPU = ("generation.engine=\"vllm\" needs the 'vllm' package (pip install 'areal[gpu]') and a CUDA GPU "
                  "(this process sees none); generation.engine=\"torch\" runs without them.")
VLLM = RunConfig(generation=GenerationConfig(engine="vllm"))


@pytest.fixture
def bare_machine(monkeypatch):
    """This process sees neither vllm nor a GPU, whatever the machine has."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec gives None, import raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_rank_group():
    """Tear down the process group the FSDP trainer starts, so later tests start from none."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_vllm_without_the_package_or_a_gpu_fails_worker_setup_naming_both(bare_machine, tmp_path):
    context = SimpleNamespace(config=VLLM, run_dir=tmp_path, version=0, resume_dir=None, note=None, report=None)
    with pytest.raises(ConfigError) as info:
        GenerateNode().setup(context)  # before the model or tokenizer is touched: nothing to load here
    assert str(info.value) == NO_VLLM_NO_GPU


def test_vllm_with_the_package_but_no_gpu_names_only_the_gpu(bare_machine, monkeypatch):
    monkeypatch.setattr("areal.engines._has_package", lambda name: True)
    with pytest.raises(ConfigError) as info:
        generation_engine(VLLM, Path("unused"), None, weights=None, version=0, decode=str)
    assert str(info.value) == ('generation.engine="vllm" needs a CUDA GPU (this process sees none); '
                               'generation.engine="torch" runs without it.')


def test_a_local_run_refuses_vllm_before_its_run_directory_or_workers_exist(bare_machine, tmp_path):
    with pytest.raises(ConfigError) as info:
        build_controller(RECIPE, ["generation.engine=vllm"], tmp_path / "run")
    assert str(info.value) == NO_VLLM_NO_GPU
    assert not (tmp_path / "run").exists()


def test_a_ray_run_leaves_the_check_to_the_workers_hosts(bare_machine):
    _check_engines(load_recipe(RECIPE, ["generation.engine=vllm", "cluster.backend=ray"]))  # no error


def test_the_factories_build_the_torch_engines_by_default_with_the_given_weights(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    config = RunConfig(model=str(checkpoint))
    published = {k: v + 0.5 for k, v in load_model(checkpoint).state_dict().items()}
    save_file({k: v.contiguous() for k, v in published.items()}, str(tmp_path / "v000003.safetensors"))
    gen = generation_engine(config, checkpoint, load_tokenizer(checkpoint), weights=tmp_path / "v000003.safetensors",
                            version=3, decode=str)
    train = train_engine(config, lambda: load_model(checkpoint))
    assert (type(gen), type(train)) == (SlotGenerationEngine, TorchTrainEngine)  # the fixed decode step: a Qwen2
    assert gen.version == 3
    assert all(torch.equal(gen.model.state_dict()[k], v) for k, v in published.items())
    assert gen.refill_min_free == 32 // 4  # a quarter of the default batch
    assert not gen.keep_kv_on_update  # new weights re-read the running rows unless asked otherwise
    kept = generation_engine(RunConfig(model=str(checkpoint), generation={"on_new_weights": "keep-kv"}), checkpoint,
                             load_tokenizer(checkpoint), weights=None, version=0, decode=str)
    assert kept.keep_kv_on_update
    settings = (({"max_batch": 128}, 32), ({"max_batch": 3}, 1), ({"max_batch": 128, "refill_min_free": 5}, 5))
    for setting, rows in settings:
        assert GenerationConfig(**setting).refill_rows == rows


def _no_pad_checkpoint(folder: Path, family: str, **config: Any) -> Any:
    """A tiny checkpoint whose tokenizer, like GPT-2's and Llama 3's, has no pad token; its tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models

    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate("abcdefgh")}}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="a")),
                                                eos_token="<eos>")
    shape = dict(vocab_size=len(vocab), bos_token_id=0, eos_token_id=0, **config)
    model = (transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, **shape))
             if family == "gpt2" else transformers.LlamaForCausalLM(transformers.LlamaConfig(
                 hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, **shape)))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return fast


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # Hugging Face's forward, the lean one
def test_a_tokenizer_without_a_pad_token_generates_padded_rows_with_its_eos(tmp_path, family):
    from areal.engines.generation import GenRequest

    fast = _no_pad_checkpoint(tmp_path / family, family)
    assert fast.pad_token_id is None
    config = RunConfig(model=str(tmp_path / family), generation={"max_new_tokens": 4, "stop": []})
    engine = generation_engine(config, tmp_path / family, load_tokenizer(tmp_path / family), weights=None, version=0,
                               decode=fast.decode)
    done = engine.generate([GenRequest(0, [1, 2, 3, 4, 5]), GenRequest(1, [6])])
    assert sorted(r.request_id for r in done) == [0, 1] and all(len(r.output_ids) >= 1 for r in done)


@pytest.mark.parametrize(("template", "stop", "engine_stops"), [
    (None, None, ["\n\n"]),  # a plain prompt continued: the training tasks' own
    ("{{ messages[0]['content'] }}", None, []),  # a chat reply ends at its turn's end token
    ("{{ messages[0]['content'] }}", ["END"], ["END"]),  # what the run sets holds for both
])
def test_the_training_tasks_stop_strings_cut_a_continuation_but_not_a_chat_reply(tmp_path, template, stop,
                                                                               engine_stops):
    fast = _no_pad_checkpoint(tmp_path / "ckpt", "llama")
    fast.chat_template = template
    fast.save_pretrained(tmp_path / "ckpt")
    config = RunConfig(model=str(tmp_path / "ckpt"), generation={"stop": stop, "tasks_stop": ["\n\n"]})
    engine = generation_engine(config, tmp_path / "ckpt", load_tokenizer(tmp_path / "ckpt"), weights=None,
                               version=0, decode=fast.decode)
    assert engine.stop_strings == engine_stops


def test_every_eos_the_generation_config_lists_ends_a_completion_in_the_run_and_in_eval(tmp_path):
    # Llama 3 instruct lists <|eot_id|> and <|eom_id|> beside the tokenizer's eos: a turn ending on either must end
    # the completion, as it does under Hugging Face's generate and vLLM
    from areal.cli.evaluate import EvalSettings, generate_completions
    from areal.engines.generation import GenRequest

    fast = _no_pad_checkpoint(tmp_path / "ckpt", "llama", tie_word_embeddings=False)
    config = json.loads((tmp_path / "ckpt" / "generation_config.json").read_text())
    (tmp_path / "ckpt" / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [0, 7, 0]}))
    model = load_model(tmp_path / "ckpt")
    with torch.no_grad():  # every position's hidden state is one vector v, and token 7's logit is 50|v|: always 7
        v = torch.randn(16)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:] = v
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[7] = 50.0 * v / v.norm()
    model.save_pretrained(tmp_path / "ckpt")
    run = RunConfig(model=str(tmp_path / "ckpt"), generation={"max_new_tokens": 6, "stop": [], "temperature": 1e-3})
    engine = generation_engine(run, tmp_path / "ckpt", load_tokenizer(tmp_path / "ckpt"), weights=None, version=0,
                               decode=fast.decode)
    assert (engine.eos_token_id, engine.stop_sequences) == (0, [[7]])
    results = engine.generate([GenRequest(i, [1, 2, i + 1]) for i in range(4)])
    assert all(r.output_ids.tolist()[-1] == 7 and r.finish_reason == "stop" for r in results)
    assert any(len(r.output_ids) < 6 for r in results)
    settings = EvalSettings(benchmark="code-tasks", max_new_tokens=6)
    outputs = generate_completions(model, fast, [{"prompt": "abc"}, {"prompt": "h"}], settings, False, [],
                                   lambda *_: None)
    assert all(tokens < 6 for _, tokens in outputs)  # ended on 7, not at the length


def test_decode_step_picks_the_engine_and_a_model_the_lean_forward_does_not_know_keeps_hfs_forward(capsys, tmp_path):
    import transformers

    qwen2 = load_model(make_checkpoint(tmp_path / "ckpt"))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    settings = dict(eos_token_id=1, pad_token_id=0)
    assert type(torch_generation_engine(qwen2, GenerationConfig(decode_step="hf"), **settings)) is TorchGenerationEngine
    engine = torch_generation_engine(qwen2, GenerationConfig(), **settings)
    assert type(engine) is SlotGenerationEngine and not engine._step.graphs  # on a CPU, auto: no graphs
    assert type(torch_generation_engine(gpt2, GenerationConfig(), **settings)) is TorchGenerationEngine
    assert capsys.readouterr().err == ("areal: generation: the lean forward knows qwen2 and llama models, not 'gpt2'; "
                                       "decoding with Hugging Face's forward (generation.decode_step=auto)\n")
    with pytest.raises(ConfigError, match="generation.decode_step=\"fixed\": the lean forward knows qwen2 and llama "
                                          "models, not 'gpt2'; decode_step=\"auto\" or \"hf\" decodes it"):
        torch_generation_engine(gpt2, GenerationConfig(decode_step="fixed"), **settings)


def test_cuda_graphs_on_are_refused_without_a_gpu_or_without_the_fixed_step(bare_machine):
    assert engine_problems(RunConfig(generation={"cuda_graphs": "on"}), training=False) == [
        'generation.cuda_graphs="on" needs the generator on a CUDA GPU (generation.device="auto" is cpu here); '
        'cuda_graphs="auto" decodes eagerly on a CPU.']
    with pytest.raises(ValueError, match='cuda_graphs="on" captures the fixed decode step; decode_step="hf" has none'):
        GenerationConfig(cuda_graphs="on", decode_step="hf")


def test_a_refill_larger_than_the_batch_is_refused_naming_both():
    with pytest.raises(ValueError, match="refill_min_free=40 rows can never be free in a batch of max_batch=32"):
        GenerationConfig(refill_min_free=40)


def test_keeping_the_kv_across_updates_is_refused_on_vllm_which_cannot():
    with pytest.raises(ValueError, match="on_new_weights=keep-kv is the torch and emulated engines' option"):
        GenerationConfig(engine="vllm", on_new_weights="keep-kv")


def test_the_emulated_engines_load_no_model():
    from areal.engines.emulated.device import ByteTokenizer
    from areal.engines.emulated.generate import EmulatedGenerationEngine
    from areal.engines.emulated.train import EmulatedTrainEngine

    config = RunConfig(model="/nowhere", generation={"engine": "emulated"}, trainer={"engine": "emulated"})

    def no_model():
        raise AssertionError("an emulated trainer loaded the policy")

    gen = generation_engine(config, None, ByteTokenizer(), weights=None, version=2, decode=str)
    train = train_engine(config, no_model)
    assert (type(gen), type(train), gen.version) == (EmulatedGenerationEngine, EmulatedTrainEngine, 2)


def _batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 90, (n,), generator=g) for n in (7, 12, 5)]
    outputs = [torch.randint(4, 90, (n,), generator=g) for n in (9, 4, 11)]
    logp = Ragged.from_rows([-torch.rand(len(o), generator=g) - 1 for o in outputs])
    return Batch({
        "prompt_ids": Ragged.from_rows(prompts), "output_ids": Ragged.from_rows(outputs),
        "behav_logp": logp, "prox_logp": logp, "advantage": torch.randn(3, generator=g),
        "versions": Ragged.from_rows([torch.zeros(len(o), dtype=torch.int32) for o in outputs]),
    })


def _trainer(checkpoint: Path, engine: str, run_dir: Path, resume_dir: Path | None = None) -> TrainerNode:
    config = RunConfig(model=str(checkpoint), trainer=TrainerConfig(engine=engine, lr=1e-2, warmup_steps=0,
                                                                   microbatch_tokens=24))
    node = TrainerNode()
    node.setup(SimpleNamespace(config=config, resume_dir=resume_dir, version=0 if resume_dir is None else 1,
                               node=f"actor-{engine}",
                               run_dir=run_dir))
    return node


def test_a_one_rank_fsdp_trainer_steps_saves_and_resumes_like_the_torch_trainer(tmp_path, one_rank_group):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    torch_node, fsdp_node = _trainer(checkpoint, "torch", tmp_path), _trainer(checkpoint, "fsdp", tmp_path)
    assert type(fsdp_node.engine).__name__ == "FSDPTrainEngine" and dist.get_world_size() == 1
    start = {k: v.clone() for k, v in torch_node.engine.state_dict().items()}
    got, want = fsdp_node(_batch(1)), torch_node(_batch(1))
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)

    fsdp_node.save_weights(str(tmp_path / "published.safetensors"))  # gathered from the shards
    published, expected = load_file(str(tmp_path / "published.safetensors")), torch_node.engine.state_dict()
    assert published.keys() == expected.keys()
    assert max(float((expected[k] - start[k]).abs().max()) for k in expected) > 1e-3  # the step moved them
    for name, value in expected.items():
        torch.testing.assert_close(published[name], value, rtol=0, atol=1e-6, msg=name)

    # each engine's checkpoint resumes on the other (the worker saves under <checkpoint>/trainer-NODE), and
    # the next step still agrees with the trainer that never stopped
    fsdp_node.save_checkpoint(str(tmp_path / "from-fsdp" / "trainer-actor-torch"))
    torch_node.save_checkpoint(str(tmp_path / "from-torch" / "trainer-actor-fsdp"))
    torch_resumed = _trainer(checkpoint, "torch", tmp_path, resume_dir=tmp_path / "from-fsdp")
    fsdp_resumed = _trainer(checkpoint, "fsdp", tmp_path, resume_dir=tmp_path / "from-torch")
    assert (torch_resumed.engine.step, fsdp_resumed.engine.step) == (1, 1)
    for node in (torch_resumed, fsdp_resumed, torch_node):
        node(_batch(2))
    after = torch_node.engine.state_dict()
    for engine in (torch_resumed.engine, fsdp_resumed.engine):
        for name, value in engine.state_dict().items():
            torch.testing.assert_close(value, after[name], rtol=0, atol=1e-6, msg=name)
