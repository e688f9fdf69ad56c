"""GenerateInput: a call's shape is refused when it is built, naming the field; a good one gives
one entry per prompt. The engine's inbox carries typed messages, and a budget the compiled
grammar cannot fit is refused under `max_new_tokens`."""

from __future__ import annotations

import queue

import pytest

from sgl_lite.backend.constrained import BudgetError
from sgl_lite.backend.engine import Engine, GenerateInput
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import DEFAULT_MAX_NEW_TOKENS, SamplingParams
from sgl_lite.server.metrics import grammar_refused
from tests.support.fakes import ByteTokenizer, FakeRunner


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "prompt"),
        ({"prompt": "a", "input_ids": [1]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", ""]}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [[1], []]}, "input_ids"),
        ({"input_ids": [1, True]}, "input_ids"),
        ({"prompt": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"prompt": "a", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "a", "rid": ["x"]}, "rid"),
        ({"prompt": ["a", "b"], "rid": "x"}, "rid"),
        ({"prompt": ["a", "b"], "rid": ["x"]}, "rid"),
        ({"prompt": "a", "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"prompt": "a", "logprob_start_len": -2}, "logprob_start_len"),
        ({"prompt": "a", "return_logprob": True, "token_ids_logprob": ["a"]}, "token_ids_logprob"),
        ({"prompt": ["a", "b"], "custom_logit_processor": ["p"]}, "custom_logit_processor"),
        ({"prompt": "a", "custom_logit_processor": 5}, "custom_logit_processor"),
        ({"prompt": "a", "timeout": 0}, "timeout"),
    ],
)
def test_a_bad_shape_is_refused_when_built_naming_its_field(kwargs, field):
    with pytest.raises(InvalidRequest) as err:
        GenerateInput(**kwargs)
    assert err.value.field == field and str(err.value)


def test_each_prompt_gets_its_params_rid_and_processor():
    one = GenerateInput(prompt="a")
    assert not one.batched and one.prompts == ("a",) and one.rids == (None,)
    assert one.params == (SamplingParams(),)
    assert one.params[0].max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    many = GenerateInput(
        input_ids=[[1, 2], [3]],
        sampling_params=[{"max_new_tokens": 2}, SamplingParams(n=2)],
        rid=["p", "q"],
        custom_logit_processor="proc",
    )
    assert many.batched and many.num_prompts == 2 and many.rids == ("p", "q")
    assert [p.max_new_tokens for p in many.params] == [2, DEFAULT_MAX_NEW_TOKENS]
    assert many.params[1].n == 2 and many.processors == ("proc", "proc")
    # token_ids_logprob is read only with return_logprob, as SGLang does
    assert GenerateInput(prompt="a", token_ids_logprob=["x"]).prompts == ("a",)


def test_as_batch_keeps_the_call_and_makes_it_a_list():
    inp = GenerateInput(prompt="a", sampling_params={"max_new_tokens": 3}, stream=False)
    batch = inp.as_batch(["r"], stream=True)
    assert batch.batched and batch.prompt == ["a"] and batch.rid == ["r"] and batch.stream
    assert batch.params == inp.params
    ids = GenerateInput(input_ids=[1, 2]).as_batch(["s"], stream=False)
    assert ids.input_ids == [[1, 2]] and ids.prompt is None


@pytest.fixture
def engine():
    eng = Engine(runner=FakeRunner(num_slots=1024), tokenizer=ByteTokenizer(), device="cpu")
    yield eng
    eng.shutdown()


def test_submit_takes_a_generate_input(engine):
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    inp = GenerateInput(prompt="hi", sampling_params={"temperature": 0, "max_new_tokens": 3})
    sub = engine.submit(inp, outputs.put)
    assert not sub.batched and len(sub.rids) == 1
    while not (out := outputs.get(timeout=10)).finished:
        pass
    assert out.completion_tokens == 3
    assert engine.generate("hi", {"temperature": 0, "max_new_tokens": 3})["output_ids"]


def test_a_budget_the_compiled_grammar_cannot_fit_is_refused_under_max_new_tokens(
    engine, monkeypatch
):
    budget = BudgetError("max_new_tokens=2 is too small for this constraint: at least 5")
    attach = engine.scheduler.attach_grammars

    def refuse_tight():  # as Scheduler.attach_grammars reports a guide's BudgetError
        tight = [r for r in engine.scheduler.waiting if r.rid == "tight"]
        return [(req, budget) for req in tight] + attach()

    monkeypatch.setattr(engine.scheduler, "attach_grammars", refuse_tight)
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    engine.submit(GenerateInput(prompt="hi", rid="tight"), outputs.put)
    while not (out := outputs.get(timeout=10)).finished:
        pass
    assert out.finish_reason.type == "abort" and "at least 5" in out.finish_reason.message
    error = out.finish_reason.error
    assert isinstance(error, InvalidRequest) and error.field == "max_new_tokens"
    # still the constraint's refusal for the metrics (sglang:num_grammar_aborted_total)
    assert error.__cause__ is budget and grammar_refused(error)
    assert grammar_refused(InvalidRequest("regex", "bad"))
    assert not grammar_refused(InvalidRequest("temperature", "bad"))
    engine.check_integrity()
    assert engine.generate("ok", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
