"""Per-tokenizer builds (the grammar vocabulary, llguidance's view) are cached by the
tokenizer's content: engines that each load the same tokenizer share one build, a bounded
number of builds stay alive, and a tokenizer with other content gets its own."""

from __future__ import annotations

from sgl_lite.backend.constrained.vocab import KeyedCache, tokenizer_key, vocabulary_for
from tests.support.tiny import build_tiny_tokenizer


def test_two_loads_of_one_tokenizer_share_a_vocabulary():
    first, second = build_tiny_tokenizer(), build_tiny_tokenizer()
    assert first is not second
    assert tokenizer_key(first) == tokenizer_key(second)
    assert vocabulary_for(first) is vocabulary_for(second)


def test_a_tokenizer_with_other_content_gets_its_own_build():
    plain, grown = build_tiny_tokenizer(), build_tiny_tokenizer()
    grown.add_tokens(["<extra_token>"])
    assert tokenizer_key(plain) != tokenizer_key(grown)
    assert vocabulary_for(grown).size == vocabulary_for(plain).size + 1


def test_the_cache_keeps_only_its_most_recent_builds():
    cache = KeyedCache(size=2)
    builds: list[int] = []

    def build(tokenizer):
        builds.append(len(tokenizer))
        return object()

    tokenizers = [build_tiny_tokenizer() for _ in range(3)]
    for i, tok in enumerate(tokenizers):
        tok.add_tokens([f"<t{j}>" for j in range(i + 1)])  # three different contents
    values = [cache.get_or_build(tok, build) for tok in tokenizers]
    assert cache.get_or_build(tokenizers[2], build) is values[2]  # a hit: no build
    assert len(builds) == 3
    cache.get_or_build(tokenizers[0], build)  # evicted by the third: built again
    assert len(builds) == 4
