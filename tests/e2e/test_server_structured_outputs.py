"""vLLM 0.12's `structured_outputs` object on /v1/completions and /v1/chat/completions (what
Outlines' `from_vllm` sends): each constraint key is obeyed as its SGLang field is, and a key
we do not implement, an unknown key or a second constraint is a 400 naming it."""

from __future__ import annotations

import json
import re

import httpx
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


def chat(url: str, **fields) -> httpx.Response:
    body = {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
        **fields,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def completion(url: str, **fields) -> httpx.Response:
    body = {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "constraint_violation" not in choice, choice
    return choice["message"]["content"] if "message" in choice else choice["text"]


def error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize("route", [chat, completion], ids=["chat", "completions"])
def test_each_key_constrains_the_output_like_its_sglang_field(url, route):
    assert text(route(url, structured_outputs={"choice": ["Paris", "Lyon"]})) in ("Paris", "Lyon")
    regex = r"[A-Z][a-z]{2,8}"
    got = text(route(url, structured_outputs={"regex": regex}))
    assert re.fullmatch(regex, got)
    assert got == text(route(url, regex=regex))  # the same constraint: the same greedy text
    value = json.loads(text(route(url, structured_outputs={"json": SCHEMA})))
    assert set(value) == {"city"} and len(value["city"]) <= 12
    # the schema as JSON text too, as vLLM takes it
    assert json.loads(text(route(url, structured_outputs={"json": json.dumps(SCHEMA)}))) == value
    grammar = 'start: "n=" NUM\nNUM: /[0-9]{1,3}/'
    assert re.fullmatch(r"n=[0-9]{1,3}", text(route(url, structured_outputs={"grammar": grammar})))


def test_json_object_is_any_json_object_and_the_options_that_change_nothing_pass(url):
    options = {"disable_fallback": True, "disable_any_whitespace": False, "json_object": True}
    got = text(chat(url, structured_outputs=options, max_tokens=32))
    assert isinstance(json.loads(got), dict)
    # nothing but options: no constraint, as if the object were absent
    plain, unset = (
        chat(url, max_tokens=4),
        chat(url, structured_outputs={"json_object": False}, max_tokens=4),
    )
    assert unset.status_code == plain.status_code == 200, unset.text
    assert unset.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


@pytest.mark.parametrize(
    "key,value",
    [
        ("structural_tag", "{}"),
        ("whitespace_pattern", r"[ ]?"),
        ("disable_any_whitespace", True),
        ("disable_additional_properties", True),
    ],
)
def test_a_key_we_do_not_implement_is_a_400_naming_it(url, key, value):
    err = error(chat(url, structured_outputs={"json": SCHEMA, key: value}))
    assert err["param"] == f"structured_outputs.{key}" and "not supported" in err["message"]


def test_an_unknown_key_or_a_wrong_type_is_a_400_naming_it(url):
    for key in ("jsn", "json_"):  # json_ is only our attribute's name
        err = error(completion(url, structured_outputs={key: SCHEMA}))
        assert err["param"] == f"structured_outputs.{key}"
    err = error(completion(url, structured_outputs={"choice": "Paris"}))
    assert err["param"] == "structured_outputs.choice"


def test_two_constraints_are_a_400_naming_both(url):
    err = error(chat(url, structured_outputs={"regex": "a", "choice": ["b"]}))
    assert (
        "structured_outputs.regex" in err["message"]
        and "structured_outputs.choice" in err["message"]
    )
    err = error(completion(url, guided_regex="a", structured_outputs={"regex": "a"}))
    assert "guided_regex" in err["message"] and "structured_outputs.regex" in err["message"]
    fmt = {"type": "json_object"}
    err = error(chat(url, response_format=fmt, structured_outputs={"json": SCHEMA}))
    assert "response_format" in err["message"] and "structured_outputs.json" in err["message"]


def test_a_grammar_that_does_not_compile_is_a_400_naming_the_key(url):
    err = error(completion(url, structured_outputs={"grammar": "start: ("}))
    assert err["param"] == "structured_outputs.grammar", err
