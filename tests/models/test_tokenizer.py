from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizer

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
