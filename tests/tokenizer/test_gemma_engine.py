"""Gemma, Gemma 2 and Gemma 3 text through `Engine` on tiny random configs with SmolLM2's
tokenizer: greedy tokens against transformers' `generate` with the radix cache on and off and
in chunks, and a prefix shared through the cache that is longer than the sliding window."""

from __future__ import annotations

import pytest
import torch

from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.tiny_gemma import FAMILIES, WINDOW, configs, hf_model


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def until_eos(tokens: list[int], eos: int = 2) -> list[int]:
    """min_new_tokens in transformers masks EOS; ignore_eos here may emit it: compare up to it."""
    return tokens[: next((i for i, t in enumerate(tokens) if t == eos), len(tokens))]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_tokens_match_transformers_generate(tmp_path, family, smollm_tokenizer):
    """Several prompts, the longest 40 tokens (5 windows), decoding past the window, batched."""
    hf = hf_model(configs(smollm_tokenizer.vocab_size)[family])
    hf.save_pretrained(tmp_path)
    smollm_tokenizer.save_pretrained(tmp_path)
    long = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 4
    prompts = [
        smollm_tokenizer.encode("A tiny random model says"),
        smollm_tokenizer.encode(long)[:40],
        smollm_tokenizer.encode("Sliding windows forget"),
    ]
    assert len(prompts[1]) == 40
    new = 12
    expected = [until_eos(hf_greedy(hf, ids, new)) for ids in prompts]
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    # Cache on, off, and on with prompts cut into 16-token chunks (2 windows).
    for disable, chunk in ((False, 2048), (True, 2048), (False, 16)):
        with Engine(
            model_path=str(tmp_path),
            num_threads=NUM_THREADS,
            max_total_tokens=512,
            disable_radix_cache=disable,
            chunked_prefill_size=chunk,
            dtype="float32",
        ) as engine:
            batched = engine.generate(input_ids=prompts, sampling_params=params)
            alone = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompts]
        for want, got, again in zip(expected, batched, alone):
            assert got["output_ids"][: len(want)] == want, f"cache off: {disable}, chunk {chunk}"
            assert again["output_ids"] == got["output_ids"]


@pytest.mark.parametrize("family", ("gemma2", "gemma3"))
def test_prefix_shared_through_the_cache_is_longer_than_the_window(
    tmp_path, family, smollm_tokenizer
):
    """Two requests share a 30-token prefix (almost 4 windows): the second reads it from the
    radix cache and still decodes what transformers does from scratch."""
    hf = hf_model(configs(smollm_tokenizer.vocab_size)[family])
    hf.save_pretrained(tmp_path)
    smollm_tokenizer.save_pretrained(tmp_path)
    prefix = smollm_tokenizer.encode("In a village by the sea there lived an old sailor who " * 3)
    prefix = prefix[:30]
    prompts = [prefix + smollm_tokenizer.encode(t) for t in (" told tales", " sang songs at night")]
    new = 12
    expected = [until_eos(hf_greedy(hf, ids, new)) for ids in prompts]
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    with Engine(
        model_path=str(tmp_path), num_threads=NUM_THREADS, max_total_tokens=512, dtype="float32"
    ) as engine:
        first = engine.generate(input_ids=prompts[0], sampling_params=params)
        second = engine.generate(input_ids=prompts[1], sampling_params=params)
        cached = second["meta_info"].get("cached_tokens")
    assert first["output_ids"][: len(expected[0])] == expected[0]
    assert second["output_ids"][: len(expected[1])] == expected[1]
    assert cached is not None and cached >= len(prefix) > WINDOW
