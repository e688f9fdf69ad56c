"""What SmolLM2 writes through the server under vLLM's guided decoding fields and under Lark
grammars in `ebnf` (the dialect Guidance's SGLang client sends): every output matches its
constraint, and a grammar that does not compile is a 400 carrying the compiler's message under
the field the client sent. (The field mapping itself: tests/unit/test_server_guided_fields.py.)"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "year": {"type": "integer"}},
    "required": ["city", "year"],
}
# Lark as llguidance reads it; the last is the form Guidance sends (its `%llguidance` header)
LARK = {
    "alternatives": ('start: "yes" | "no"', r"yes|no"),
    "regex-terminal": ('start: "n=" NUM\nNUM: /[0-9]{1,3}/', r"n=[0-9]{1,3}"),
    "guidance-header": (
        '%llguidance {}\n\nstart: answer "."\nanswer: CITY\nCITY: /[A-Z][a-z]{2,9}/',
        r"[A-Z][a-z]{2,9}\.",
    ),
}


def chat(url: str, **fields) -> httpx.Response:
    body = {"messages": QUESTION, "max_tokens": 24, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def completion(url: str, **fields) -> httpx.Response:
    body = {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def finished_text(response: httpx.Response) -> str:
    """The one choice's text, checked to be a complete, constraint-satisfying output."""
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert "constraint_violation" not in choice, choice
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_guided_choice_answers_one_of_the_choices(url):
    choices = ["Paris", "London", "Berlin", "New York"]
    assert finished_text(chat(url, guided_choice=choices)) in choices
    assert finished_text(completion(url, guided_choice=choices)) in choices


def test_guided_json_answers_json_valid_against_the_schema(url):
    for schema in (SCHEMA, json.dumps(SCHEMA)):
        text = finished_text(chat(url, guided_json=schema, max_tokens=48))
        jsonschema.validate(json.loads(text), SCHEMA)


def test_guided_regex_and_guided_grammar_answer_matching_text(url):
    text = finished_text(completion(url, guided_regex=r" [A-Z][a-z]{1,9}\."))
    assert re.fullmatch(r" [A-Z][a-z]{1,9}\.", text), text
    grammar, pattern = LARK["regex-terminal"]
    text = finished_text(completion(url, guided_grammar=grammar))
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("name", LARK)
def test_a_lark_grammar_in_ebnf_is_obeyed(url, name):
    grammar, pattern = LARK[name]
    for response in (chat(url, ebnf=grammar), completion(url, ebnf=grammar)):
        text = finished_text(response)
        assert re.fullmatch(pattern, text), (name, text)


@pytest.mark.parametrize(
    ("field", "grammar", "message"),
    [
        ("ebnf", "start: answer", 'unknown name: "answer"'),
        ("ebnf", "start: /[a-/", "unclosed character class"),
        ("guided_grammar", "start: answer", 'unknown name: "answer"'),
    ],
)
def test_a_grammar_that_does_not_compile_is_a_400_with_the_compilers_message(
    url, field, grammar, message
):
    for response in (chat(url, **{field: grammar}), completion(url, **{field: grammar})):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and message in error["message"], error
