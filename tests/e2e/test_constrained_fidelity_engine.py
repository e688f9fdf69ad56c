"""Schema fidelity through the engine on SmolLM2: ranges hold under sampling, bounded integers,
bounded recursion validates, unsupported keywords are refused before the loop."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from sgl_lite.common.regex import dtype_to_regex
from tests.support.constraints import COMMENTS, STARS
from tests.support.smollm import chat_prompt


def test_a_1_to_5_rating_never_leaves_its_range_over_30_sampled_outputs(
    engine, smollm_tokenizer
) -> None:
    prompt = chat_prompt(smollm_tokenizer, "Rate this movie from 0 to 100 and explain: Jaws.")
    params = [
        {"temperature": t, "sampling_seed": seed, "max_new_tokens": 40, "json_schema": STARS}
        for t in (1.0, 1.5)
        for seed in range(15)
    ]
    stars = []
    for out in engine.generate([prompt] * len(params), params):
        assert out["meta_info"]["constraint_violation"] is None, out
        value = json.loads(out["text"])
        jsonschema.validate(value, STARS)
        stars.append(value["stars"])
    assert len(stars) == 30 and set(stars) <= {1, 2, 3, 4, 5}
    engine.check_integrity()


def test_dtype_int_never_exceeds_19_digits_even_when_asked_for_more(
    engine, smollm_tokenizer
) -> None:
    prompt = chat_prompt(smollm_tokenizer, "Write the number one googol in full, all its digits.")
    params = [
        {"temperature": t, "sampling_seed": s, "max_new_tokens": 48, "regex": dtype_to_regex(int)}
        for t in (0, 1.5)
        for s in range(3)
    ]
    for out in engine.generate([prompt] * len(params), params):
        assert re.fullmatch(r"[-+]?[0-9]{1,19}", out["text"]), out["text"]


def test_a_recursive_comment_tree_validates_to_the_recursion_bound(engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "A forum thread with nested replies, as JSON.")
    params = [
        {"temperature": t, "sampling_seed": 5, "max_new_tokens": 120, "json_schema": COMMENTS}
        for t in (0, 1.0, 1.5)
    ]
    for out in engine.generate([prompt] * len(params), params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(out["text"]), COMMENTS)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 5},
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    ],
)
def test_auto_enforces_on_a_grammar_backend_what_the_automaton_cannot(engine, schema) -> None:
    # The default backend (`auto`) sends these to llguidance, which enforces them: the output
    # validates, or, cut by the budget, it is flagged and never passed off as valid.
    params = {"temperature": 1.0, "sampling_seed": 3, "max_new_tokens": 24}
    for seed in range(3):
        out = engine.generate("x", {**params, "sampling_seed": seed, "json_schema": schema})
        meta = out["meta_info"]
        try:
            jsonschema.validate(json.loads(out["text"]), schema)
        except (ValueError, jsonschema.ValidationError):  # only a cut output may fail, flagged
            assert meta["finish_reason"]["type"] == "length" and meta["constraint_violation"]
        else:
            assert meta["constraint_violation"] is None, meta
    engine.check_integrity()


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        (  # minItems <= 1 would be served as at most one item (a sound restriction)
            {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2},
            "uniqueItems",
        ),
        ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "oneOf"),
    ],
)
def test_unsupported_keywords_are_refused_before_the_loop(engine, schema, keyword) -> None:
    before = engine.get_server_info()["pool_free_tokens"]
    with pytest.raises(ValueError, match=f"keyword '{keyword}'"):
        engine.generate("x", {"max_new_tokens": 8, "json_schema": json.dumps(schema)})
    assert engine.get_server_info()["pool_free_tokens"] == before
