"""Model-free decode loops: whatever random logits say, the guided output matches its grammar."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from sgl_lite.common.regex import dtype_to_regex
from tests.support.constrained import decode_without_model, shared_compiler
from tests.support.constraints import SCHEMAS, W3_SCHEMA

REGEXES = {
    "int": dtype_to_regex(int),
    "float": dtype_to_regex(float),
    "bool": dtype_to_regex(bool),
    "str": dtype_to_regex(str),
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "email": r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)",
    "date": r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "ipv4": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    "unicode_choice": r"(héllo|wörld|日本語) [a-c]{1,5}",
}


@pytest.mark.parametrize("jump_forward", [False, True], ids=["plain", "jump_forward"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_guided_output_validates_against_schema(name: str, jump_forward: bool) -> None:
    schema = SCHEMAS[name]
    grammar = shared_compiler().compile("json_schema", schema)
    for seed in range(3):
        out = decode_without_model(grammar, seed=seed, jump_forward=jump_forward)
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("jump_forward", [False, True], ids=["plain", "jump_forward"])
@pytest.mark.parametrize("name", list(REGEXES))
def test_guided_output_fully_matches_regex(name: str, jump_forward: bool) -> None:
    regex = REGEXES[name]
    grammar = shared_compiler().compile("regex", regex)
    for seed in range(3):
        out = decode_without_model(grammar, seed=seed, jump_forward=jump_forward)
        assert re.fullmatch(regex, out.text), out.text


def test_jump_forward_samples_fewer_steps_than_it_emits_tokens_on_w3() -> None:
    grammar = shared_compiler().compile("json_schema", W3_SCHEMA)
    out = decode_without_model(grammar, seed=0, jump_forward=True)
    assert out.sampling_steps < len(out.ids)
    plain = decode_without_model(grammar, seed=0, jump_forward=False)
    assert plain.sampling_steps == len(plain.ids) or plain.sampling_steps == len(plain.ids) + 1


def test_forced_bytes_stop_at_branches_and_cross_multibyte_characters() -> None:
    grammar = shared_compiler().compile("regex", r"日本(語|人)!")
    start = grammar.initial_state
    forced = grammar.forced_bytes(start)
    # 語 and 人 share no lead byte, so the walk stops after 日本
    assert forced == "日本".encode()
    assert grammar.forced_bytes(start) is grammar.forced[start]
    accepting = shared_compiler().compile("regex", r"ab(c)?")
    assert accepting.forced_bytes(accepting.initial_state) == b"ab"
