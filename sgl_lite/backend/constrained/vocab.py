"""Token id → raw bytes, built once per tokenizer.

The grammar automata run on bytes, so every token is turned into the bytes it stands for:
byte-level BPE tokens (GPT-2 style, `Ġ` for a space) go through the GPT-2 byte decoder;
SentencePiece tokens map `▁` to a space and byte-fallback tokens (`<0x0A>`) to their byte.
Special and added tokens (eos included) get no bytes, so they are never allowed inside a
constrained span; eos is handed to outlines-core separately and allowed only in accepting states.
This module knows nothing about grammars or requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outlines_core import Vocabulary

# NOTE: the byte vocabulary maps token id b to the single byte b; 256 is its (never used) eos.
BYTE_EOS_ID = 256
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table of byte → printable character used by byte-level BPE vocabularies."""
    bs = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def token_to_bytes(token: str, *, byte_level: bool) -> bytes:
    """The bytes one vocabulary entry stands for (`Ġ"` → b' "', `<0x0A>` → b'\\n', `▁a` → b' a')."""
    if byte_level:
        if all(c in _BYTE_DECODER for c in token):
            return bytes(_BYTE_DECODER[c] for c in token)
        return token.encode("utf-8")  # an added token written in plain text
    match = _BYTE_FALLBACK.match(token)
    if match:
        return bytes([int(match.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


def is_byte_level(tokenizer: Any, vocab: dict[str, int]) -> bool:
    """Whether the tokenizer is GPT-2 style byte-level BPE (else SentencePiece-like)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = repr(getattr(backend, "decoder", None)) if backend is not None else ""
    if "ByteLevel" in decoder:
        return True
    if "ByteFallback" in decoder or "Metaspace" in decoder or "▁" in decoder:
        return False
    if hasattr(tokenizer, "sp_model"):
        return False
    # No decoder to ask: byte-level vocabularies spell every token in the byte alphabet.
    return "Ġ" in "".join(vocab) and all(c in _BYTE_DECODER for t in vocab for c in t)


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """What the grammar layer needs from a tokenizer, built once per tokenizer.

    `token_bytes[i]` is token i's bytes, or None where token i may never appear in a
    constrained span (special/added tokens, holes, empty tokens). `size` is the mask width.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: int
    special_ids: frozenset[int]
    size: int
    index_vocab: Vocabulary  # outlines-core vocabulary over the allowed tokens

    def decode_bytes(self, ids: list[int]) -> bytes | None:
        """The bytes of `ids` joined, or None if one of them is special or unknown."""
        parts = []
        for i in ids:
            b = self.token_bytes[i] if 0 <= i < len(self.token_bytes) else None
            if b is None:
                return None
            parts.append(b)
        return b"".join(parts)


def build_token_vocabulary(
    vocab: dict[str, int],
    *,
    eos_token_id: int,
    special_ids: set[int],
    byte_level: bool,
    size: int | None = None,
) -> TokenVocabulary:
    """Builds the vocabulary from a token → id table (pure; `vocabulary_for` wraps a tokenizer)."""
    if eos_token_id is None:
        raise ValueError("constrained decoding needs a tokenizer with an eos token; got none")
    special = frozenset(special_ids) | {eos_token_id}
    width = max(size or 0, max(vocab.values(), default=-1) + 1, eos_token_id + 1)
    token_bytes: list[bytes | None] = [None] * width
    by_bytes: dict[bytes, list[int]] = {}
    for token, i in vocab.items():
        if i in special:
            continue
        b = token_to_bytes(token, byte_level=byte_level)
        if not b:
            continue  # an empty token would loop in every state
        token_bytes[i] = b
        by_bytes.setdefault(b, []).append(i)
    return TokenVocabulary(
        token_bytes=tuple(token_bytes),
        eos_token_id=eos_token_id,
        special_ids=special,
        size=width,
        index_vocab=Vocabulary(eos_token_id, by_bytes),
    )


def tokenizer_key(tokenizer: Any) -> str:
    """What a tokenizer's token view depends on, as a key: its vocabulary (ids and strings,
    added tokens among them), width and eos. Engines that load the same tokenizer (every test
    and server restart loads its own object) share one vocabulary and one llguidance view.

    Hashing a 49k-token vocabulary takes tens of milliseconds and llguidance asks for its view
    at every validation, so the key is remembered per tokenizer object (by identity, with the
    object's size, which adding tokens changes)."""
    known = _KEYS.get(id(tokenizer))
    size = len(tokenizer)
    if known is not None and known[1] == size and known[0]() is tokenizer:
        return known[2]
    key = _content_key(tokenizer)
    with contextlib.suppress(TypeError):  # an object that takes no weak reference: not kept
        _KEYS[id(tokenizer)] = (weakref.ref(tokenizer), size, key)
    return key


_KEYS: dict[int, tuple[weakref.ref[Any], int, str]] = {}


def _content_key(tokenizer: Any) -> str:
    vocab = tokenizer.get_vocab()
    special = sorted(getattr(tokenizer, "all_special_ids", []) or [])
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = repr(getattr(backend, "decoder", None)) if backend is not None else ""
    content = json.dumps([sorted(vocab.items()), special, decoder, type(tokenizer).__name__])
    digest = hashlib.sha256(content.encode()).hexdigest()[:24]
    return f"{len(tokenizer)}:{tokenizer.eos_token_id}:{digest}"


class KeyedCache:
    """A small LRU of values built per tokenizer (`tokenizer_key`): a process holds a few at
    most, however many engines it starts (each build takes seconds and holds megabytes)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_build(self, tokenizer: Any, build: Callable[[Any], Any]) -> Any:
        """The cached value for `tokenizer`, or `build(tokenizer)` cached."""
        key = tokenizer_key(tokenizer)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        built = build(tokenizer)
        with self._lock:
            self._items[key] = built
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return built


_CACHE = KeyedCache()


def vocabulary_for(tokenizer: Any) -> TokenVocabulary:
    """The tokenizer's vocabulary, built on first use and cached by its content.

    Mask width is `len(tokenizer)` (the model's logits width for SmolLM2); a model whose
    logits are wider pads the mask with False.
    """
    return _CACHE.get_or_build(tokenizer, _build_vocabulary)


def _build_vocabulary(tokenizer: Any) -> TokenVocabulary:
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return build_token_vocabulary(
        vocab,
        eos_token_id=tokenizer.eos_token_id,
        special_ids=special,
        byte_level=is_byte_level(tokenizer, vocab),
        size=len(tokenizer),
    )


_BYTE_VOCAB: Vocabulary | None = None


def byte_vocabulary() -> Vocabulary:
    """The 256-entry vocabulary (id b = byte b) that jump-forward walks one byte at a time."""
    global _BYTE_VOCAB
    if _BYTE_VOCAB is None:
        _BYTE_VOCAB = Vocabulary(BYTE_EOS_ID, {bytes([b]): [b] for b in range(256)})
    return _BYTE_VOCAB
