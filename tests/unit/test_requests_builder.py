"""RequestBuilder: every bad argument is an InvalidRequest naming its field; good ones become
requests with the right ids, samples, logprob settings and seeds."""

from __future__ import annotations

import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.engine.intake import RequestBuilder
from sgl_lite.backend.errors import InvalidRequest
from tests.support.fakes import VOCAB, ByteTokenizer


@pytest.fixture
def builder() -> RequestBuilder:
    return RequestBuilder(
        EngineConfig(device="cpu"),
        ByteTokenizer(),
        vocab_size=VOCAB,
        context_length=200,
        pool_size=1024,
    )


def build(builder: RequestBuilder, prompt=None, sampling_params=None, **kwargs):
    """SGLang's generate() arguments (prompt and sampling_params by position) → requests."""
    inp = GenerateInput(prompt=prompt, sampling_params=sampling_params, **kwargs)
    return builder.build(inp), inp.batched


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "prompt"),
        ({"prompt": "a", "input_ids": [1]}, "prompt"),  # as /generate names "text"
        ({"prompt": ["a", ""]}, "prompt"),
        ({"input_ids": [[1], []]}, "input_ids"),
        ({"input_ids": [True]}, "input_ids"),
        ({"prompt": "a", "sampling_params": [{}, {}]}, "sampling_params"),
        ({"prompt": ["a"], "rid": ["x", "y"]}, "rid"),
        ({"prompt": "a", "logprob_start_len": 5}, "logprob_start_len"),
        ({"prompt": "a", "sampling_params": {"max_new_tokens": 200}}, "max_new_tokens"),
        ({"prompt": "a", "sampling_params": {"stop_token_ids": [-1]}}, "stop_token_ids"),
        ({"prompt": "a", "sampling_params": {"stop": [""]}}, "stop"),
        ({"prompt": "a", "sampling_params": {"stop_regex": "x*"}}, "stop_regex"),
        ({"prompt": "a", "sampling_params": {"regex": "a", "json_schema": "{}"}}, "regex"),
        ({"prompt": "a", "sampling_params": {"top_k": 0}}, "top_k"),
        ({"prompt": "a", "sampling_params": {"n": 1.5}}, "n"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {str(VOCAB): 1}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"-1": 1}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"x": 1}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"5": 100.5}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"5": float("nan")}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"5": float("inf")}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"5": "1"}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {"5": True}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": {5: 1, "5": 2}}}, "logit_bias"),
        ({"prompt": "a", "sampling_params": {"logit_bias": [[5, 1]]}}, "logit_bias"),
    ],
)
def test_bad_arguments_name_their_field(builder, kwargs, field):
    with pytest.raises(InvalidRequest) as err:
        build(builder, **kwargs)
    assert err.value.field == field and str(err.value)


def test_n_samples_get_their_own_ids_and_seeds(builder):
    groups, batched = build(
        builder, ["ab", "c"], {"n": 2, "sampling_seed": 4}, rid=["p", "q"], return_logprob=True
    )
    assert batched and [[r.rid for r in g] for g in groups] == [["p-0", "p-1"], ["q-0", "q-1"]]
    first, second = groups[0]
    assert first.input_ids == [97, 98] and first.generator is not None
    assert first.generator.initial_seed() == 4 and second.generator.initial_seed() == 5
    assert first.logprobs is not None and first.logprobs.start_len == 1  # -1: the last token


def test_the_room_for_new_tokens_is_bounded_by_context_and_pool(builder):
    assert builder.max_new_tokens_room(10) == 190  # the context binds
    assert builder.max_new_tokens_room(250) == 0
    small_pool = RequestBuilder(
        EngineConfig(device="cpu"),
        ByteTokenizer(),
        vocab_size=VOCAB,
        context_length=200,
        pool_size=64,
    )
    assert small_pool.max_new_tokens_room(10) == 53  # the pool binds, one slot spare
