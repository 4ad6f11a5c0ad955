"""A character-level tokenizer for the built-in tiny coder.

One id per character of printable ASCII plus "\\n" and "\\t", after four special tokens at fixed
ids (<pad> 0, <bos> 1, <eos> 2, <unk> 3). It is a `transformers.PreTrainedTokenizer`, so HF
`generate`, TRL and `save_pretrained`/`from_pretrained` treat it like any other tokenizer
(tests/models/test_tokenizer.py checks each call of that API against a stock HF tokenizer with the
same vocabulary, on the installed transformers). The vocabulary is defined by this code, not by a
file: a saved tokenizer is its config alone.

Text that spells a special token ("<eos>" inside a string literal) stays characters: special
ids are only ever added by the tokenizer itself, never read from user text.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizer

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n\t"


class CharTokenizer(PreTrainedTokenizer):
    """One token per character; `encode` prepends <bos>, generation stops at <eos>."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs: Any) -> None:
        self._vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(ALPHABET))}
        self._inverse = {i: tok for tok, i in self._vocab.items()}
        self._special_ids = frozenset(range(len(SPECIAL_TOKENS)))
        for key, value in (
            ("pad_token", "<pad>"),
            ("bos_token", "<bos>"),
            ("eos_token", "<eos>"),
            ("unk_token", "<unk>"),
            ("split_special_tokens", True),
            ("clean_up_tokenization_spaces", False),
            ("special_tokens_pattern", "bos"),
        ):
            kwargs.setdefault(key, value)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._vocab.get(token, self._vocab["<unk>"])

    def _convert_id_to_token(self, index: int) -> str:
        return self._inverse.get(index, "<unk>")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str | list[str]:
        """A list of ids joined here: generation's stop check decodes a few tokens of every row at every step,
        and the base class's general path was a quarter of the tiny coder's decode loop. Anything else
        (tensors, other options, a batch) takes that path, and returns what it returns: since transformers 5
        `decode` of a batch is a list of strings, and `batch_decode` calls it (so a str() here broke both)."""
        if kwargs or not isinstance(token_ids, list) or not all(type(i) is int for i in token_ids):
            return super().decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)  # type: ignore[no-any-return]
        skipped = self._special_ids if skip_special_tokens else frozenset()
        return "".join(self._inverse.get(i, "<unk>") for i in token_ids if i not in skipped)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """Nothing to write: the vocabulary is fixed by this module."""
        return ()
