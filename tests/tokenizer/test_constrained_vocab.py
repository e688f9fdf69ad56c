"""Token → bytes: byte-level BPE, SentencePiece byte fallback, specials excluded."""

from __future__ import annotations

from sgl_lite.backend.constrained.vocab import (
    build_token_vocabulary,
    is_byte_level,
    token_to_bytes,
    vocabulary_for,
)
from tests.support.smollm import smollm2_tokenizer


def test_byte_level_tokens_decode_through_the_gpt2_byte_table() -> None:
    tokenizer = smollm2_tokenizer()
    vocab = vocabulary_for(tokenizer)
    assert vocab.token_bytes[tokenizer.convert_tokens_to_ids('Ġ"')] == b' "'
    assert vocab.token_bytes[tokenizer.convert_tokens_to_ids("Ċ")] == b"\n"
    assert token_to_bytes("Ġ", byte_level=True) == b" "
    assert is_byte_level(tokenizer, tokenizer.get_vocab())


def test_every_special_and_added_token_is_excluded() -> None:
    tokenizer = smollm2_tokenizer()
    vocab = vocabulary_for(tokenizer)
    assert vocab.eos_token_id == 2 and vocab.size == len(tokenizer) == 49152
    for i in set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids):
        assert vocab.token_bytes[i] is None and i in vocab.special_ids
    assert sum(b is not None for b in vocab.token_bytes) == 49152 - 17


def test_vocabulary_is_built_once_per_tokenizer() -> None:
    assert vocabulary_for(smollm2_tokenizer()) is vocabulary_for(smollm2_tokenizer())


def test_sentencepiece_byte_fallback_and_metaspace() -> None:
    table = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0x20>": 4, "▁": 5, "▁hi": 6, "é": 7}
    vocab = build_token_vocabulary(table, eos_token_id=2, special_ids={0, 1}, byte_level=False)
    assert vocab.token_bytes[3] == b"\n"
    assert vocab.token_bytes[4] == vocab.token_bytes[5] == b" "
    assert vocab.token_bytes[6] == b" hi" and vocab.token_bytes[7] == "é".encode()
    assert vocab.token_bytes[:3] == (None, None, None)
    assert vocab.decode_bytes([6, 3]) == b" hi\n" and vocab.decode_bytes([6, 2]) is None
    assert token_to_bytes("<0xFF>", byte_level=False) == b"\xff"
