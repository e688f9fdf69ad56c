"""A tiny random Llama answering multiple-choice echo requests (one context, four continuations,
each scored through its prompt logprobs, lm-eval's way): with the radix cache on, the context's
logprobs and top entries come from the tree, bit for bit what the cache-off engine computes in
the deterministic mode, and within the engine's logprob tolerance in the fast mode."""

from __future__ import annotations

import pytest

from sgl_lite.backend.engine import Engine

CONTEXT = (
    "Q: Best pet? A dog, a cat and a hamster. The capital of France is Paris. Paris is a city"
    " in France. What is"
)
CHOICES = (" Paris", " a cat", " red or blue", " hello")
ECHO = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3}
ONE = {"temperature": 0, "max_new_tokens": 1}
LOGPROB_TOL = 1e-3  # tests/e2e/test_engine.py: logprobs against a full forward


def _score(folder, prompts: list[list[int]], disable: bool, deterministic: bool) -> list[dict]:
    with Engine(
        model_path=str(folder),
        num_threads=1,
        max_total_tokens=512,
        disable_radix_cache=disable,
        dtype="float32",
        enable_deterministic_inference=deterministic,
    ) as engine:
        metas = [
            engine.generate(input_ids=p, sampling_params=ONE, **ECHO)["meta_info"] for p in prompts
        ]
        engine.check_integrity()
    return metas


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "fast"])
def test_multiple_choice_logprobs_from_the_cache_match_the_uncached_engine(
    tiny_llama_folder, tiny_tokenizer, deterministic
):
    context = tiny_tokenizer.encode(CONTEXT)
    prompts = [context + tiny_tokenizer.encode(c) for c in CHOICES]
    cached = _score(tiny_llama_folder, prompts, False, deterministic)
    uncached = _score(tiny_llama_folder, prompts, True, deterministic)
    assert [m["cached_tokens"] for m in uncached] == [0] * len(prompts)
    assert cached[0]["cached_tokens"] == 0
    assert all(m["cached_tokens"] >= len(context) - 1 for m in cached[1:])  # served from the tree
    for got, want in zip(cached, uncached, strict=True):
        if deterministic:
            assert got["input_token_logprobs"] == want["input_token_logprobs"]
            assert got["input_top_logprobs"] == want["input_top_logprobs"]
            assert got["output_token_logprobs"] == want["output_token_logprobs"]
            continue
        entries = zip(got["input_token_logprobs"], want["input_token_logprobs"], strict=True)
        for (lp, token, _), (ref, ref_token, _) in entries:
            assert token == ref_token and (lp is None) == (ref is None)
            assert lp is None or abs(lp - ref) < LOGPROB_TOL
        tops = zip(got["input_top_logprobs"][1:], want["input_top_logprobs"][1:], strict=True)
        for top, ref_top in tops:
            assert max(abs(a[0] - b[0]) for a, b in zip(top, ref_top, strict=True)) < LOGPROB_TOL
