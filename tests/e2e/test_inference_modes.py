"""The two inference modes on the embedded SmolLM2 (its GGUF's own Q4_1 codes): the default
fast mode repeats itself for the same request and passes, and the deterministic mode gives the
same greedy tokens with the radix cache cold and warm, alone and batched, and says so in its
server info. Their agreement with float32 is in tests/e2e/test_smollm_logits.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.smollm import chat_prompt

GREEDY = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
SHARED = "You are a careful assistant who answers in one short sentence. "
QUESTIONS = ["Why is the sky blue?", "What does a CPU do?", "Name a primary color."]


def _prompts(tokenizer) -> list[str]:
    return [chat_prompt(tokenizer, SHARED + q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def fast_engine() -> Iterator[Engine]:
    """One engine in the default (fast) mode for this module's fast-mode tests; each starts
    from an empty cache."""
    with Engine(num_threads=NUM_THREADS, max_total_tokens=4096) as engine:
        yield engine


def test_the_fast_default_repeats_a_request_token_for_token(fast_engine, smollm_tokenizer):
    prompts = _prompts(smollm_tokenizer)
    engine = fast_engine
    assert engine.flush_cache()
    fmt = engine.runner.format
    assert not fmt.deterministic and fmt.int_kind == "int4", fmt.describe()
    first = engine.generate(prompts[0], GREEDY)["output_ids"]
    assert engine.flush_cache()
    again = engine.generate(prompts[0], GREEDY)["output_ids"]
    assert again == first


REPEATS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is 12 times 7?",
    "Who wrote Hamlet?",
    "Give a synonym for happy.",
    "What is water made of?",
    "Why is the sky blue?",
]


def test_the_fast_default_repeats_a_request_whose_prompt_the_cache_holds(
    fast_engine, smollm_tokenizer
):
    """Sent twice, the second time with the whole prompt cached (only its last token is
    computed again): the same tokens for every prompt. Before the runner computed that token
    the same way both times, and the graph's decode copies kept what the pool keeps, 3 of
    these 8 repeated."""
    prompts = [chat_prompt(smollm_tokenizer, SHARED + q) for q in REPEATS]
    greedy = {**GREEDY, "max_new_tokens": 24}
    engine = fast_engine
    assert engine.flush_cache()  # the first sends are computed, not found in the cache
    assert not engine.runner.format.deterministic
    first = [engine.generate(p, greedy) for p in prompts]
    again = [engine.generate(p, greedy) for p in prompts]
    assert all(
        o["meta_info"]["cached_tokens"] == o["meta_info"]["prompt_tokens"] - 1 for o in again
    )
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first]


def test_the_deterministic_mode_is_identical_cold_warm_alone_and_batched(smollm_tokenizer):
    prompts = _prompts(smollm_tokenizer)
    with Engine(
        num_threads=NUM_THREADS, max_total_tokens=4096, enable_deterministic_inference=True
    ) as engine:
        assert engine.runner.format.deterministic
        assert engine.get_server_info()["enable_deterministic_inference"] is True
        cold = [engine.generate(p, GREEDY)["output_ids"] for p in prompts]  # shared prefix cached
        warm = [engine.generate(p, GREEDY)["output_ids"] for p in prompts]  # whole prompt cached
        assert engine.flush_cache()
        batched = [o["output_ids"] for o in engine.generate(prompts, GREEDY)]
    assert warm == cold
    assert batched == cold
