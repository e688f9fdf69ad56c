"""The llguidance backend, model-free: EBNF grammars produce strings a reference parser accepts,
recursive schemas validate past the automaton's bound, the fidelity matrix holds (enforced or
refused), long maxLength compiles fast, and "auto" routes each constraint to the right backend."""

from __future__ import annotations

import functools
import json
import time

import jsonschema
import pytest
import torch

from sgl_lite.backend.constrained import (
    GrammarCompiler,
    GrammarError,
    apply_jump_forward,
    plan_jump_forward,
)
from tests.support.constrained import ArithmeticParser, grammar_bias
from tests.support.constraints import ARITHMETIC, COMMENT_TREE, ENFORCED, SQL, SQL_REFERENCE
from tests.support.smollm import smollm2_tokenizer


@functools.cache
def llg_compiler() -> GrammarCompiler:
    return GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0, backend="llguidance")


def decode(grammar, *, seed: int, max_steps: int = 300, jump_forward: bool = True) -> str:
    """Random logits masked by the guide, argmax, until eos or the grammar stops."""
    tokenizer = smollm2_tokenizer()
    gen = torch.Generator().manual_seed(seed)
    guide = grammar.new_guide()
    out: list[int] = []
    for _ in range(max_steps):
        if guide.is_finished():
            break
        logits = torch.randn(len(tokenizer), generator=gen) + grammar_bias()  # (V,)
        logits.masked_fill_(~guide.allowed_mask(), float("-inf"))
        token = int(logits.argmax())
        if token == tokenizer.eos_token_id:
            assert guide.is_accepting()
            break
        guide.advance(token)
        out.append(token)
        if jump_forward:
            plan = plan_jump_forward(tokenizer, guide, out)
            if plan is not None and apply_jump_forward(guide, plan):
                out[plan.keep :] = plan.new_ids
    else:
        raise AssertionError(f"no end after {max_steps} steps: {tokenizer.decode(out)!r}")
    assert guide.is_accepting()
    return tokenizer.decode(out)


@pytest.mark.parametrize("seed", range(6))
def test_arithmetic_ebnf_output_parses_with_a_reference_parser(seed: int) -> None:
    text = decode(llg_compiler().compile("ebnf", ARITHMETIC), seed=seed)
    ArithmeticParser(text).parse()


@pytest.mark.parametrize("seed", range(6))
def test_sql_select_ebnf_output_parses(seed: int) -> None:
    text = decode(llg_compiler().compile("ebnf", SQL), seed=seed)
    assert SQL_REFERENCE.fullmatch(text), text


def test_bad_ebnf_is_a_named_error_and_ebnf_under_outlines_goes_to_llguidance() -> None:
    with pytest.raises(GrammarError, match="ebnf"):
        llg_compiler().validate("ebnf", "root ::= (")
    # the automaton cannot express a context-free grammar: the grammar backend takes it
    assert GrammarCompiler(smollm2_tokenizer()).plan("ebnf", ARITHMETIC)[0] == "llguidance"


def test_recursive_schema_validates_deeper_than_the_automaton_bound() -> None:
    deep = json.loads(json.dumps(COMMENT_TREE))
    deep["$defs"]["comment"]["properties"]["replies"]["maxItems"] = 1
    grammar = llg_compiler().compile("json_schema", deep)
    assert grammar.backend == "llguidance"
    nested = {"author": "a", "replies": []}
    for _ in range(5):  # past MAX_REF_DEPTH: the grammar recurses for real
        nested = {"author": "a", "replies": [nested]}
    guide = grammar.new_guide()
    for token in smollm2_tokenizer().encode(json.dumps(nested), add_special_tokens=False):
        guide.advance(token)
    assert guide.is_accepting()
    for seed in range(3):
        jsonschema.validate(json.loads(decode(grammar, seed=seed)), deep)


@pytest.mark.parametrize("name", list(ENFORCED))
def test_fidelity_matrix_on_llguidance_enforced_or_refused(name: str) -> None:
    schema = ENFORCED[name]
    try:
        grammar = llg_compiler().compile("json_schema", schema)
    except GrammarError as exc:
        assert "llguidance" in str(exc)  # refused with llguidance's reason, never dropped
        return
    for seed in range(3):
        guide = grammar.new_guide(constraint=("json_schema", schema))
        text = decode(grammar, seed=seed, max_steps=1500)
        assert guide.validate(text) is None, (name, text)


def test_a_long_max_length_compiles_in_under_a_second() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5000}}}
    llg_compiler().compile("regex", "warm-up")
    start = time.perf_counter()
    llg_compiler().compile("json_schema", schema)
    assert time.perf_counter() - start < 1.0


def test_auto_gives_regexes_to_the_automaton_and_schemas_to_llguidance() -> None:
    auto = GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0, backend="auto")
    assert auto.plan("json_schema", ENFORCED["int_range"])[0] == "llguidance"
    assert auto.plan("regex", "[a-z]+")[0] == "outlines"
    assert auto.plan("json_schema", {"type": "integer", "multipleOf": 3})[0] == "llguidance"
    assert auto.plan("ebnf", ARITHMETIC)[0] == "llguidance"
    with pytest.raises(GrammarError, match="llguidance.*automaton refuses it too.*keyword 'not'"):
        auto.validate("json_schema", {"not": {"type": "string"}})
    text = decode(auto.compile("json_schema", {"type": "integer", "multipleOf": 3}), seed=1)
    assert int(text) % 3 == 0


# JSONSchemaBench's Glaiveai2K/calculate_area, cut down: the oneOf's branches give `shape` a
# const without requiring it and mark absent names `not: {}`. schema_normalize makes it an
# anyOf with `shape` required; closing the object and its branches apart (each to its own
# names) left no name both allow, and llguidance refused it as unsatisfiable.
SHAPES = {
    "type": "object",
    "properties": {"radius": {"type": "number"}, "width": {"type": "number"}},
    "oneOf": [
        {"properties": {"shape": {"const": "circle"}, "width": {"not": {}}}},
        {"properties": {"shape": {"const": "square"}, "radius": {"not": {}}}},
    ],
}


def test_a_oneof_told_apart_by_an_unrequired_const_compiles_and_validates() -> None:
    grammar = llg_compiler().compile("json_schema", SHAPES)
    assert grammar.backend == "llguidance"
    for seed in range(4):
        guide = grammar.new_guide(constraint=("json_schema", SHAPES))
        text = decode(grammar, seed=seed)
        assert guide.validate(text) is None, text
        assert json.loads(text)["shape"] in ("circle", "square")
