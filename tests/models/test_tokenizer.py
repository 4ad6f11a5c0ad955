from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizer, PreTrainedTokenizerFast

from areal.models.loading import load_tokenizer
from areal.models.tokenizer import ALPHABET, CharTokenizer

TOKENIZER = CharTokenizer()


@given(st.text(alphabet=ALPHABET))
def test_decode_of_encode_is_the_text_with_bos_in_front(text):
    ids = TOKENIZER.encode(text)
    assert ids[0] == TOKENIZER.bos_token_id
    assert len(ids) == len(text) + 1
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_have_fixed_ids_and_vocab_is_about_100():
    assert (TOKENIZER.pad_token_id, TOKENIZER.bos_token_id, TOKENIZER.eos_token_id) == (0, 1, 2)
    assert len(TOKENIZER) == TOKENIZER.vocab_size == 101
    assert TOKENIZER.decode([1, *TOKENIZER.encode("hi", add_special_tokens=False), 2]) == "<bos>hi<eos>"


def test_text_spelling_a_special_token_stays_characters():
    ids = TOKENIZER.encode("'<eos>'", add_special_tokens=False)
    assert TOKENIZER.eos_token_id not in ids
    assert len(ids) == 7


def test_unknown_character_becomes_unk():
    assert TOKENIZER.encode("é", add_special_tokens=False) == [TOKENIZER.unk_token_id]


def test_save_and_load_round_trip(tmp_path):
    TOKENIZER.save_pretrained(tmp_path)
    loaded = CharTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "def f(x):\n\treturn x + 3\n"
    assert loaded.encode(text) == TOKENIZER.encode(text)
    assert loaded.get_vocab() == TOKENIZER.get_vocab()
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_batch_padding_uses_pad_id():
    batch = TOKENIZER(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][-2:] == [0, 0]
    assert batch["attention_mask"][0] == [1, 1, 1, 0, 0]


@given(st.lists(st.integers(min_value=0, max_value=TOKENIZER.vocab_size + 2)), st.booleans())
def test_the_fast_decode_of_a_list_equals_the_base_classs(ids, skip_special_tokens):
    base = PreTrainedTokenizer.decode(TOKENIZER, ids, skip_special_tokens=skip_special_tokens)
    assert TOKENIZER.decode(ids, skip_special_tokens=skip_special_tokens) == base


# -- the Hugging Face tokenizer contract, on the installed transformers --------------------------------------------
# The reference is a stock HF tokenizer (tokenizers' WordLevel behind PreTrainedTokenizerFast) with the same
# vocabulary, <bos> added in front and the same special tokens: on every call below HF documents what it returns,
# and the built-in tokenizer must return exactly that (types, shapes, padding, special tokens).


def _stock_tokenizer() -> PreTrainedTokenizerFast:
    chars = Tokenizer(models.WordLevel(TOKENIZER.get_vocab(), unk_token="<unk>"))
    chars.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    chars.decoder = decoders.Fuse()
    chars.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                         special_tokens=[("<bos>", TOKENIZER.bos_token_id)])
    return PreTrainedTokenizerFast(tokenizer_object=chars, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", split_special_tokens=True)


STOCK = _stock_tokenizer()
TEMPLATE = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
CHAT = [{"role": "user", "content": "add 1"}, {"role": "assistant", "content": "x + 1"}]
CALLS = {  # what HF documents each returns
    "call: one text -> input_ids, attention_mask (lists)": lambda t: t("def f(x):\n\treturn x"),
    "call: a batch -> a list per text": lambda t: t(["ab", "abcd", ""]),
    "call: padding=True -> right-padded with pad_token_id, mask 0": lambda t: t(["ab", "abcd"], padding=True),
    "call: padding_side=left": lambda t: t(["ab", "abcd"], padding=True, padding_side="left"),
    "call: padding=max_length": lambda t: t(["ab", "abcd"], padding="max_length", max_length=7),
    "call: truncation": lambda t: t(["abcdef", "ab"], truncation=True, max_length=3),
    "call: return_tensors=pt -> int64 tensors [B, L]": lambda t: t(["ab", "abcd"], padding=True, return_tensors="pt"),
    "call: a text that spells a special token": lambda t: t("'<eos>' <pad>"),
    "encode: <bos> in front": lambda t: t.encode("x = é"),
    "encode: add_special_tokens=False": lambda t: t.encode("x = 1", add_special_tokens=False),
    "decode: special tokens shown": lambda t: t.decode([1, 69, 70, 0, 2]),
    "decode: skip_special_tokens": lambda t: t.decode([1, 69, 70, 0, 2], skip_special_tokens=True),
    "decode: a tensor": lambda t: t.decode(torch.tensor([1, 69, 70, 2])),
    "decode: one id": lambda t: t.decode(69),
    "decode: a batch -> a list of strings": lambda t: t.decode([[5, 6, 7], [8, 9]]),
    "batch_decode: a list of strings": lambda t: t.batch_decode([[5, 6, 7], [8, 9]]),
    "batch_decode: skip_special_tokens": lambda t: t.batch_decode([[1, 5, 2, 0], [1, 8]], skip_special_tokens=True),
    "batch_decode: a 2-D tensor": lambda t: t.batch_decode(torch.tensor([[1, 5, 6], [1, 7, 0]])),
    "batch_decode: an empty batch": lambda t: t.batch_decode([]),
    "pad: a list of encodings": lambda t: t.pad([{"input_ids": [1, 5]}, {"input_ids": [1, 5, 6, 7]}]),
    "pad: to tensors": lambda t: t.pad({"input_ids": [[1, 5], [1, 5, 6, 7]]}, return_tensors="pt"),
    "pad: left, to a multiple": lambda t: t.pad([{"input_ids": [1, 5]}], padding_side="left", pad_to_multiple_of=4),
    "apply_chat_template: given a template, the text": lambda t: t.apply_chat_template(
        CHAT, chat_template=TEMPLATE, tokenize=False),
    "apply_chat_template: given a template, tokenized": lambda t: t.apply_chat_template(CHAT, chat_template=TEMPLATE),
    "convert_ids_to_tokens, tokenize, len, special ids": lambda t: (
        t.convert_ids_to_tokens([1, 69, 3]), t.tokenize("a b"), len(t), sorted(t.all_special_ids),
        (t.pad_token_id, t.bos_token_id, t.eos_token_id, t.unk_token_id), t.padding_side),
}


def _plain(value):
    """A call's result as comparable plain values: tensors with their dtype, BatchEncodings as dicts."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("call", CALLS)
def test_each_call_of_the_hf_tokenizer_api_returns_what_a_stock_hf_tokenizer_returns(call):
    assert _plain(CALLS[call](TOKENIZER)) == _plain(CALLS[call](STOCK))


def test_batch_decode_is_one_string_per_sequence():
    assert TOKENIZER.batch_decode([[5, 6, 7], [8, 9]]) == ['!"#', "$%"]
    assert TOKENIZER.batch_decode(torch.tensor([[1, 69, 2]]), skip_special_tokens=True) == ["a"]


def test_without_a_chat_template_apply_chat_template_says_so_as_hf_does():
    with pytest.raises(ValueError, match="tokenizer.chat_template is not set"):
        TOKENIZER.apply_chat_template(CHAT, tokenize=False)


def test_save_pretrained_then_from_pretrained_answers_every_call_the_same(tmp_path):
    original = CharTokenizer(padding_side="left", chat_template=TEMPLATE, model_max_length=256)
    original.save_pretrained(tmp_path)
    for loaded in (CharTokenizer.from_pretrained(tmp_path, local_files_only=True), load_tokenizer(tmp_path)):
        assert type(loaded) is CharTokenizer
        assert (loaded.padding_side, loaded.chat_template, loaded.model_max_length) == ("left", TEMPLATE, 256)
        assert loaded.apply_chat_template(CHAT, tokenize=False) == original.apply_chat_template(CHAT, tokenize=False)
        for call in CALLS.values():
            assert _plain(call(loaded)) == _plain(call(original))
