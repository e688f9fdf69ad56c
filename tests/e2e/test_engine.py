"""End to end on the embedded SmolLM2: determinism with and without the cache, reuse, bad input."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.smollm import chat_prompt

GREEDY = {"temperature": 0, "max_new_tokens": 24}
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Write a haiku about rain.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "Who wrote Hamlet?",
    "What does a CPU do?",
]


@pytest.fixture(scope="module")
def uncached_engine():
    # float32 like the shared `engine`: the two are compared token for token
    eng = Engine(
        num_threads=NUM_THREADS,
        max_total_tokens=8192,
        disable_radix_cache=True,
        dtype="float32",
        quantization="none",
    )
    yield eng
    eng.shutdown()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b)) if x != y),
        None if len(a) == len(b) else min(len(a), len(b)),
    )


def assert_same_tokens(a: dict, b: dict, hf_model=None, prompt_ids=None) -> None:
    """Token-for-token equality; on a mismatch, report the top-2 margin at the first difference."""
    i = first_difference(a["output_ids"], b["output_ids"])
    if i is None:
        return
    detail = ""
    if hf_model is not None and prompt_ids is not None:
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt_ids + a["output_ids"][:i]])).logits[0, -1]
        top2 = logits.topk(2).values
        detail = f" (top-2 logit margin there: {(top2[0] - top2[1]).item():.3g})"
    pytest.fail(f"outputs differ at token {i}: {a['output_ids']} vs {b['output_ids']}{detail}")


def test_greedy_output_is_identical_with_cache_on_and_off(
    engine, uncached_engine, smollm_tokenizer, hf_smollm
):
    prompts = [chat_prompt(smollm_tokenizer, q) for q in QUESTIONS[:3]]
    for prompt in prompts:  # twice with the cache: the second run hits the first one's tokens
        cold = engine.generate(prompt, GREEDY)
        warm = engine.generate(prompt, GREEDY)
        off = uncached_engine.generate(prompt, GREEDY)
        assert warm["meta_info"]["cached_tokens"] >= warm["meta_info"]["prompt_tokens"] - 1
        assert off["meta_info"]["cached_tokens"] == 0
        ids = smollm_tokenizer.encode(prompt, add_special_tokens=False)
        assert_same_tokens(cold, warm, hf_smollm, ids)
        assert_same_tokens(cold, off, hf_smollm, ids)
    engine.check_integrity()
    uncached_engine.check_integrity()


def test_greedy_output_matches_transformers_generate(engine, smollm_tokenizer, hf_smollm):
    prompt = chat_prompt(smollm_tokenizer, QUESTIONS[0])
    ids = smollm_tokenizer.encode(prompt, add_special_tokens=False)
    ours = engine.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 12})
    with torch.no_grad():
        theirs = hf_smollm.generate(
            torch.tensor([ids]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=smollm_tokenizer.eos_token_id,
        )
    theirs = theirs[0, len(ids) :].tolist()
    assert ours["output_ids"] == theirs


def test_request_alone_equals_request_among_eight_concurrent(
    engine, uncached_engine, smollm_tokenizer, hf_smollm
):
    prompts = [chat_prompt(smollm_tokenizer, q) for q in QUESTIONS]
    alone = [uncached_engine.generate(p, GREEDY) for p in prompts[:2]]
    results: list[dict | None] = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = engine.generate(prompts[i], GREEDY)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        ids = smollm_tokenizer.encode(prompts[i], add_special_tokens=False)
        assert_same_tokens(alone[i], results[i], hf_smollm, ids)
    batched = engine.generate(prompts, GREEDY)  # a list is one batch
    for i in range(2):
        assert_same_tokens(alone[i], batched[i])
    assert engine.get_server_info()["max_running_batch_seen"] > 1
    engine.check_integrity()


def test_second_turn_hits_first_answer_and_equals_cold_run(
    engine, uncached_engine, smollm_tokenizer
):
    first = chat_prompt(smollm_tokenizer, "Tell me one fact about owls.")
    answer = engine.generate(first, GREEDY)
    second = chat_prompt(
        smollm_tokenizer, "Tell me one fact about owls.", answer["text"], "And one about cats?"
    )
    warm = engine.generate(second, GREEDY)
    cold = uncached_engine.generate(second, GREEDY)
    first_len = answer["meta_info"]["prompt_tokens"]
    # The answer's tokens were cached too, not just the first prompt.
    assert warm["meta_info"]["cached_tokens"] > first_len + 1
    assert_same_tokens(warm, cold)


def test_tiny_pool_with_eight_concurrent_long_prompts_finishes_and_matches(
    engine, smollm_tokenizer
):
    prompts = [f"Document {i}: " + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(8)]
    # No two of these ~200-token requests fit the 300-slot pool together: they run one by one,
    # each admission evicting cached tokens; 8 new tokens each are enough to compare
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    expected = engine.generate(prompts, params)
    small = Engine(
        num_threads=NUM_THREADS, max_total_tokens=300, dtype="float32", quantization="none"
    )
    try:
        start_free = small.get_server_info()["pool_free_tokens"]
        got = small.generate(prompts, params)
        for e, g in zip(expected, got):
            assert_same_tokens(e, g)
        small.check_integrity()
        info = small.get_server_info()
        assert info["evicted_tokens"] > 0 or info["preemptions"] > 0
        assert small.flush_cache()
        assert small.get_server_info()["pool_free_tokens"] == start_free
    finally:
        small.shutdown()


def test_max_new_tokens_zero_caches_the_prompt(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "A prompt that is only prefilled, never decoded.")
    out = engine.generate(prompt, {"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    repeat = engine.generate(prompt, {"max_new_tokens": 0})  # fully cached: still one token
    assert repeat["meta_info"]["cached_tokens"] == repeat["meta_info"]["prompt_tokens"] - 1
    again = engine.generate(prompt, GREEDY)
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1


def test_streaming_text_equals_non_streamed(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, QUESTIONS[2])
    full = engine.generate(prompt, GREEDY)
    chunks = list(engine.generate(prompt, GREEDY, stream=True))
    assert len(chunks) > 1
    assert chunks[-1]["text"] == full["text"]
    assert all(full["text"].startswith(c["text"]) for c in chunks)


def test_stop_strings_are_trimmed_and_reported(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "Count from 1 to 10, separated by commas.")
    free = engine.generate(prompt, GREEDY)
    assert "," in free["text"]
    stop = engine.generate(prompt, {**GREEDY, "stop": [","]})
    assert stop["text"] == free["text"].split(",")[0]
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": ","}
    kept = engine.generate(prompt, {**GREEDY, "stop": ","})
    assert kept["text"] == stop["text"]


def test_stop_regex_is_trimmed_and_reported(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "Count from 1 to 10, separated by commas.")
    free = engine.generate(prompt, GREEDY)
    match = re.search(r"[4-6]", free["text"])
    assert match is not None, free["text"]
    out = engine.generate(prompt, {**GREEDY, "stop_regex": [r"[4-6]", r"zz+"]})
    assert out["text"] == free["text"][: match.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"[4-6]"}
    chunks = list(engine.generate(prompt, {**GREEDY, "stop_regex": r"[4-6]"}, stream=True))
    assert all(out["text"].startswith(c["text"]) for c in chunks)


def test_logprobs_match_a_full_forward(engine, uncached_engine, smollm_tokenizer, hf_smollm):
    ids = smollm_tokenizer.encode("The quick brown fox jumps over the lazy dog")
    engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})  # cache it first
    out = engine.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 3},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    entries = meta["input_token_logprobs"]
    if engine.runner.format.int_kind is None:
        with torch.no_grad():
            logprobs = torch.log_softmax(hf_smollm(torch.tensor([ids])).logits[0].float(), -1)
        expected = [None] + [logprobs[pos - 1, ids[pos]].item() for pos in range(1, len(ids))]
        expected_first = logprobs[-1].max().item()
    else:
        # The int modes run the file's 4-bit codes, not transformers' float32 weights: the full
        # forward to match is the uncached engine's, in the same mode.
        full = uncached_engine.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 1},
            return_logprob=True,
            logprob_start_len=0,
        )["meta_info"]
        expected = [entry[0] for entry in full["input_token_logprobs"]]
        expected_first = full["output_token_logprobs"][0][0]
    assert len(entries) == len(ids) and entries[0][0] is None and entries[0][1] == ids[0]
    for pos in range(1, len(ids)):
        assert entries[pos][1] == ids[pos]
        assert abs(entries[pos][0] - expected[pos]) < 1e-3
    assert entries[1][2] == smollm_tokenizer.decode([ids[1]])
    assert len(meta["output_token_logprobs"]) == 3
    assert meta["output_token_logprobs"][0][1] == out["output_ids"][0]
    assert abs(meta["output_token_logprobs"][0][0] - expected_first) < 1e-3
    assert len(meta["output_top_logprobs"][0]) == 2


def test_logit_bias_forces_and_bans_tokens_per_request(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "What is the capital of France?")
    params = {"temperature": 0, "max_new_tokens": 4}
    plain = engine.generate(prompt, params)
    forced_token = smollm_tokenizer.encode(" banana", add_special_tokens=False)[0]
    banned_token = plain["output_ids"][0]
    forced = {**params, "logit_bias": {str(forced_token): 100}}
    banned = {**params, "logit_bias": {banned_token: -100}}
    outs = engine.generate([prompt] * 3, [params, forced, banned])  # one batch, three biases
    assert outs[0]["output_ids"] == plain["output_ids"]
    assert outs[1]["output_ids"] == [forced_token] * 4
    assert banned_token not in outs[2]["output_ids"]


def test_input_logprobs_start_with_none_at_any_logprob_start_len(engine, smollm_tokenizer):
    ids = smollm_tokenizer.encode("The quick brown fox jumps over the lazy dog near the river")

    def entries(start: int) -> list:
        out = engine.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 1},
            return_logprob=True,
            logprob_start_len=start,
            top_logprobs_num=2,
        )
        got = out["meta_info"]["input_token_logprobs"]
        tops = out["meta_info"]["input_top_logprobs"]
        assert len(got) == len(tops) == len(ids) - start and tops[0] is None
        return got

    full = entries(0)
    for start in (0, 5, len(ids) - 1):
        got = entries(start)
        assert got[0][0] is None and [e[1] for e in got] == ids[start:]
        for pos in range(start + 1, len(ids)):
            assert abs(got[pos - start][0] - full[pos][0]) < 1e-4, (start, pos)


def test_sampling_with_a_seed_is_reproducible(engine):
    params = {
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 50,
        "max_new_tokens": 12,
        "sampling_seed": 7,
    }
    a = engine.generate("Once upon a time", params)
    b = engine.generate("Once upon a time", params)
    assert a["output_ids"] == b["output_ids"]
    several = engine.generate("Once upon a time", {**params, "n": 3})
    assert len(several) == 3


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": "hi", "input_ids": [1, 2]}, "input_ids"),
        ({"input_ids": [1, 10**9]}, "vocabulary"),
        ({"input_ids": []}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "context length"),
        ({"prompt": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"stop_token_ids": [-1]}}, "stop_token_ids"),
        ({"prompt": "hi", "sampling_params": {"logit_bias": {"1000000": 1}}}, "logit_bias"),
        ({"prompt": "hi", "sampling_params": {"logit_bias": {"5": -101}}}, "logit_bias"),
    ],
)
def test_bad_input_raises_a_named_error_and_the_engine_keeps_serving(engine, kwargs, field):
    before = engine.get_server_info()["pool_free_tokens"]
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    assert engine.get_server_info()["pool_free_tokens"] == before
    assert engine.generate("Hello", {"temperature": 0, "max_new_tokens": 2})["text"]


def test_bad_model_paths_are_clear_errors(tmp_path):
    from sgl_lite.backend.runner.model_loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine(model_path=str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        Engine(model_path=str(tmp_path))
    with pytest.raises(ValueError, match="unknown engine argument"):
        Engine(max_total_tokenz=5)


def test_abort_frees_the_request(engine):
    chunks = engine.generate(
        "Write a long story about a dragon.",
        {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True},
        stream=True,
        rid="to-abort",
    )
    first = next(chunks)
    engine.abort("to-abort")
    assert first["meta_info"]["finish_reason"] is None
    last = list(chunks)[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    engine.check_integrity()
    assert engine.get_server_info()["num_running_reqs"] == 0
