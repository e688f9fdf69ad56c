"""vLLM's legacy guided decoding fields on /v1/completions and /v1/chat/completions, against a
scripted engine that records the sampling params it is given: each field arrives as the SGLang
constraint it aliases, errors name the client's field, two constraints are a 400 naming both,
`guided_decoding_backend` is a no-op and `guided_whitespace_pattern` is refused by name.
(What the model then writes under each: tests/e2e/test_server_guided.py.)"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.support.fakes import ScriptedEngine

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ROUTES = {
    "/v1/completions": {"prompt": "x", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
}


def post(url: str, route: str, **fields) -> httpx.Response:
    return httpx.post(f"{url}{route}", json={**ROUTES[route], **fields}, timeout=30)


def engine_params(engine: ScriptedEngine, url: str, route: str, **fields) -> dict:
    """The sampling params the engine received for a request with `fields`."""
    before = len(engine.submitted)
    response = post(url, route, **fields)
    assert response.status_code == 200, response.text
    assert len(engine.submitted) == before + 1
    return engine.submitted[-1]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"guided_json": SCHEMA}, {"json_schema": json.dumps(SCHEMA)}),
        ({"guided_json": json.dumps(SCHEMA)}, {"json_schema": json.dumps(SCHEMA)}),
        ({"guided_regex": "[0-9]{3}"}, {"regex": "[0-9]{3}"}),
        ({"guided_grammar": 'start: "yes" | "no"'}, {"ebnf": 'start: "yes" | "no"'}),
    ],
    ids=["json-object", "json-text", "regex", "grammar"],
)
def test_a_guided_field_reaches_the_engine_as_the_sglang_constraint(
    engine, url, route, fields, expected
):
    params = engine_params(engine, url, route, **fields)
    constraint = {k: params[k] for k in ("regex", "json_schema", "ebnf") if k in params}
    assert constraint == expected
    assert engine_params(engine, url, route, **expected) == params  # as SGLang's own field


@pytest.mark.parametrize("route", ROUTES)
def test_guided_choice_is_a_regex_matching_exactly_one_choice(engine, url, route):
    choices = ["yes", "no", "a.b", "C++ (17)", "x|y", "[tag]", "back\\slash", "New York"]
    params = engine_params(engine, url, route, guided_choice=choices)
    assert set(params) & {"json_schema", "ebnf"} == set()
    pattern = re.compile(params["regex"])
    assert all(pattern.fullmatch(c) for c in choices)
    for other in ("", "ye", "yesno", "aXb", "C++ 17", "x", "tag", "New  York", "yes|no"):
        assert pattern.fullmatch(other) is None, other


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "fields",
    [
        {"guided_json": SCHEMA, "json_schema": SCHEMA},
        {"guided_regex": "a", "regex": "a"},
        {"guided_choice": ["a"], "guided_regex": "a"},
        {"guided_grammar": 'start: "a"', "ebnf": 'start: "a"'},
        {"guided_json": SCHEMA, "guided_grammar": 'start: "a"'},
    ],
    ids=lambda fields: "+".join(fields),
)
def test_two_constraints_are_a_400_naming_both(engine, url, route, fields):
    before = len(engine.submitted)
    response = post(url, route, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert all(re.search(rf"\b{name}\b", error["message"]) for name in fields), error
    assert error["param"] in fields
    assert len(engine.submitted) == before  # refused before the engine saw it


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_json": SCHEMA, "response_format": {"type": "json_object"}},
        {
            "guided_json": SCHEMA,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        },
        {"guided_choice": ["a", "b"], "tool_choice": "required", "tools": []},
    ],
    ids=["json_object", "json_schema", "tool_choice"],
)
def test_a_guided_field_beside_chat_response_format_or_forced_tool_is_a_400(url, fields):
    if "tools" in fields:
        fields["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    response = post(url, "/v1/chat/completions", **fields)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    for name in fields.keys() - {"tools"}:
        assert re.search(rf"\b{name}\b", message), message


@pytest.mark.parametrize("route", ROUTES)
def test_an_engine_refusal_names_the_guided_field_the_client_sent(url, route):
    # the scripted engine refuses the regex "bad" at submission, naming its own `regex` param
    response = post(url, route, guided_regex="bad")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "guided_regex" and "not a valid regular expression" in error["message"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", 1]}, "guided_choice.1"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"guided_json": ["not", "a", "schema"]}, "guided_json"),
    ],
)
def test_a_malformed_guided_field_is_a_400_naming_it(url, route, fields, param):
    response = post(url, route, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "unknown field" not in error["message"], error


@pytest.mark.parametrize("route", ROUTES)
def test_the_backend_hint_is_a_no_op_and_a_whitespace_pattern_is_refused(engine, url, route):
    plain = engine_params(engine, url, route, guided_regex="[a-z]+")
    hinted = engine_params(
        engine, url, route, guided_regex="[a-z]+", guided_decoding_backend="xgrammar"
    )
    assert hinted == plain
    unset = engine_params(engine, url, route, guided_json=SCHEMA, guided_whitespace_pattern=None)
    assert unset["json_schema"] == json.dumps(SCHEMA)
    before = len(engine.submitted)
    response = post(url, route, guided_json=SCHEMA, guided_whitespace_pattern=r"[ \n]*")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "guided_whitespace_pattern"
    assert "--constrained-json-whitespace-pattern" in error["message"]
    assert len(engine.submitted) == before
