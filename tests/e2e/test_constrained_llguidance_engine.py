"""The llguidance and auto grammar backends through the engine on SmolLM2: outputs validate,
the final check runs, and the automaton stays the default where it is exact."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.constraints import COMMENTS, STARS
from tests.support.smollm import chat_prompt

MULTIPLE = {
    "type": "object",
    "properties": {"boxes": {"type": "integer", "minimum": 0, "maximum": 90, "multipleOf": 6}},
    "required": ["boxes"],
}


@pytest.fixture(scope="module")
def auto_engine(engine):
    return engine  # the session's: "auto" is the default grammar_backend


def test_auto_backend_serves_schemas_the_automaton_refuses(auto_engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "How many eggs fit in the boxes? Answer as JSON.")
    params = [
        {"temperature": t, "sampling_seed": s, "max_new_tokens": 40, "json_schema": MULTIPLE}
        for t in (0, 1.0)
        for s in range(3)
    ]
    for out in auto_engine.generate([prompt] * len(params), params):
        meta = out["meta_info"]
        assert meta["constraint_violation"] is None and meta["budget_closed"] is False, out
        value = json.loads(out["text"])
        jsonschema.validate(value, MULTIPLE)
        assert value["boxes"] % 6 == 0
    auto_engine.check_integrity()


def test_auto_backend_keeps_the_automaton_and_its_budget_where_exact(auto_engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "Rate the movie Jaws with a comment, as JSON.")
    params = {"temperature": 1.5, "sampling_seed": 3, "max_new_tokens": 14, "json_schema": STARS}
    out = auto_engine.generate(prompt, params)
    assert out["meta_info"]["completion_tokens"] <= 14
    assert 1 <= json.loads(out["text"])["stars"] <= 5


def test_llguidance_recursion_is_real_and_validated(smollm_tokenizer) -> None:
    eng = Engine(num_threads=NUM_THREADS, max_total_tokens=4096, grammar_backend="llguidance")
    try:
        prompt = chat_prompt(smollm_tokenizer, "A forum thread with nested replies, as JSON.")
        params = [
            {"temperature": t, "sampling_seed": 2, "max_new_tokens": 160, "json_schema": COMMENTS}
            for t in (0, 1.0)
        ]
        for out in eng.generate([prompt] * len(params), params):
            # the closer's budget guarantee: complete and valid even where the length ran out
            assert out["meta_info"]["constraint_violation"] is None, out
            assert out["meta_info"]["budget_cut"] is False, out
            text = out["text"].removesuffix(smollm_tokenizer.eos_token)
            jsonschema.validate(json.loads(text), COMMENTS)
        eng.check_integrity()
    finally:
        eng.shutdown()
