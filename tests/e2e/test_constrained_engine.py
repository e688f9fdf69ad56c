"""Constrained decoding through the engine on SmolLM2: every output matches its regex or
validates against its schema, greedy and sampled, with jump-forward on and off."""

from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import pytest

from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.smollm import chat_prompt

PRODUCT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "price": {"type": "number"},
        "category": {"enum": ["kitchen", "garden", "toys", "books"]},
    },
    "required": ["name", "price", "category"],
}

SCHEMAS = {
    "product": PRODUCT,
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "admin": {"type": "boolean"}},
                "required": ["id", "admin"],
            }
        },
        "required": ["user"],
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}
        },
        "required": ["tags"],
    },
    "optional": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
        "required": ["a"],
    },
    "ref": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"}},
        "required": ["p"],
    },
    "anyof": {
        "type": "object",
        # Integers carry at most 19 digits by default (numbers.py), so sampling cannot run on.
        "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}},
        "required": ["v"],
    },
    "null": {"type": "object", "properties": {"n": {"type": "null"}}, "required": ["n"]},
    "enum_top": {"enum": ["red", "green", "blue"]},
    "numbers": {
        "type": "object",
        "properties": {"i": {"type": "integer"}, "f": {"type": "number"}},
        "required": ["i", "f"],
    },
    "bools": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "done": {"type": "boolean"}},
        "required": ["ok", "done"],
    },
}

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no)",
    r"[A-Z][a-z]{2,8}",
    r"-?[0-9]+\.[0-9]{2}",
    r"(cat|dog|bird)s?, (red|blue)",
]


@pytest.fixture(scope="module")
def no_jump_engine():
    # float32 like the shared `engine`, whose greedy output it must equal
    eng = Engine(
        num_threads=NUM_THREADS,
        max_total_tokens=8192,
        disable_jump_forward=True,
        dtype="float32",
        quantization="none",
    )
    yield eng
    eng.shutdown()


def prompts(tokenizer, n: int) -> list[str]:
    return [
        chat_prompt(tokenizer, f"Reply in JSON about item {i}: a small wooden toy.")
        for i in range(n)
    ]


@pytest.mark.parametrize("jump", [True, False], ids=["jump_forward", "no_jump_forward"])
def test_every_schema_output_validates_greedy_and_sampled(
    engine, no_jump_engine, smollm_tokenizer, jump
):
    eng = engine if jump else no_jump_engine
    names = sorted(SCHEMAS)
    base = prompts(smollm_tokenizer, 1)[0]
    greedy = [
        {"temperature": 0, "max_new_tokens": 96, "json_schema": json.dumps(SCHEMAS[n])}
        for n in names
    ]
    sampled = [
        {
            "temperature": 1.0,
            "max_new_tokens": 96,
            "sampling_seed": seed,
            "json_schema": json.dumps(SCHEMAS[n]),
        }
        for n in names
        for seed in (1, 2)
    ]
    params = greedy + sampled
    results = eng.generate([base] * len(params), params)
    special = set(smollm_tokenizer.all_special_ids)
    for p, out in zip(params, results):
        schema = json.loads(p["json_schema"])
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), schema)
        assert not special & set(out["output_ids"][:-1])
    eng.check_integrity()


def test_every_regex_output_fully_matches(engine, no_jump_engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, "Answer with the requested format only.")
    params = [
        {"temperature": t, "max_new_tokens": 32, "regex": r, "sampling_seed": 3}
        for r in REGEXES
        for t in (0, 1.0)
    ]
    for eng in (engine, no_jump_engine):
        for p, out in zip(params, eng.generate([prompt] * len(params), params)):
            assert re.fullmatch(p["regex"], out["text"]), (p["regex"], out["text"])
        eng.check_integrity()


def test_jump_forward_runs_fewer_passes_than_tokens_and_agrees(
    engine, no_jump_engine, smollm_tokenizer
):
    prompt = chat_prompt(smollm_tokenizer, "A red kettle costs 25 dollars. Give it as JSON.")
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(PRODUCT)}

    def passes(eng):
        before = eng.get_server_info()["forward_passes"]
        out = eng.generate(prompt, params)
        return out, eng.get_server_info()["forward_passes"] - before

    jumped, jump_passes = passes(engine)
    plain, plain_passes = passes(no_jump_engine)
    jsonschema.validate(json.loads(jumped["text"]), PRODUCT)
    assert jumped["meta_info"]["forced_tokens"] > 0
    assert jump_passes < jumped["meta_info"]["completion_tokens"]
    assert jump_passes < plain_passes
    assert json.loads(jumped["text"]) == json.loads(plain["text"])


def test_slow_compile_times_out_while_other_requests_finish():
    # ~4 s to build here (a long bounded repetition); the build outlives its timeout on its
    # thread, so it is kept short enough not to load the rest of the suite. The automaton
    # backend is pinned ("auto" gives a regex to it too, by its routing table).
    slow_regex = "[a-z ]{0,500}"
    eng = Engine(
        num_threads=NUM_THREADS,
        max_total_tokens=4096,
        grammar_compile_timeout=0.5,
        grammar_backend="outlines",
    )
    try:
        box: dict = {}

        def constrained():
            box["slow"] = eng.generate("x", {"regex": slow_regex, "max_new_tokens": 8})

        thread = threading.Thread(target=constrained)
        start = time.perf_counter()
        thread.start()
        plain = eng.generate("Hello there", {"temperature": 0, "max_new_tokens": 8})
        thread.join(timeout=30)
        reason = box["slow"]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "timed out" in reason["message"]
        assert time.perf_counter() - start < 20
        assert plain["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        eng.check_integrity()
    finally:
        eng.shutdown()


@pytest.mark.parametrize(
    "params, message",
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"json_schema": "{not json"}, "JSON"),
        ({"json_schema": json.dumps({"type": "object", "properties": 5})}, "schema"),
        ({"regex": "a+", "json_schema": "{}"}, "mutually exclusive"),
    ],
)
def test_bad_constraints_are_named_errors_and_the_next_request_succeeds(engine, params, message):
    before = engine.get_server_info()["pool_free_tokens"]
    with pytest.raises(ValueError, match=message):
        engine.generate("hi", {"max_new_tokens": 4, **params})
    assert engine.get_server_info()["pool_free_tokens"] == before
    out = engine.generate("hi", {"max_new_tokens": 4, "regex": "(yes|no)", "temperature": 0})
    assert out["text"] in ("yes", "no")
