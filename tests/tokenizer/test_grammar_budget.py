"""The budget guarantee on the grammar backends (llguidance, xgrammar), model-free on SmolLM2's
tokenizer: the closer is deterministic and memoryless (from the state after its first token it
is the rest of the same path), every output under any budget from the minimum up is complete
and valid (the closer's tokens replace the sampled ones where needed, `budget_closed`), a
budget below the closer's length is refused naming the minimum, and a grammar the closer
cannot finish falls back to flagging a cut output."""

from __future__ import annotations

import json

import pytest
import torch

from sgl_lite.backend.constrained import BudgetError, GrammarError
from sgl_lite.backend.constrained.matchers.closer import closing_path
from tests.support.constrained import (
    GRAMMAR_BACKENDS,
    ArithmeticParser,
    compiler,
    splice_jump_forward,
    valid_json,
)
from tests.support.constraints import ARITHMETIC, SQL, SQL_REFERENCE
from tests.support.smollm import smollm2_tokenizer

STRINGS = {"type": "array", "items": {"type": "string"}}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 3},
                    "age": {"type": "integer", "minimum": 1, "maximum": 120},
                },
                "required": ["name", "age"],
            },
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"],
    },
    "ticket": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "tags": STRINGS},
        "required": ["title", "tags"],
    },
    "invoice": {  # an optional free-text field
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "total": {"type": "number"},
            "note": {"type": "string"},
        },
        "required": ["id", "total"],
    },
    "numbers": {"type": "array", "items": {"type": "number"}, "minItems": 2},
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "why": {"type": "string"}},
        "required": ["color", "why"],
    },
}


def budget_decode(grammar, *, seed: int, budget: int | None, constraint=None, bias: float = 0.0):
    """The engine's order, model-free: seeded random logits masked by the guide, argmax, the
    guide's budget substitution, advance, then its forced tokens. Returns (text, ids, guide,
    substitutions); `bias` favours `"` `]` `}` (short outputs, for the unconstrained length)."""
    tokenizer = smollm2_tokenizer()
    gen = torch.Generator().manual_seed(seed)
    guide = grammar.new_guide(max_new_tokens=budget, constraint=constraint)
    closing = torch.zeros(len(tokenizer))
    ends = [tokenizer.convert_tokens_to_ids(c) for c in '"]}'] + [tokenizer.eos_token_id]
    closing[ends] = bias
    out: list[int] = []
    substitutions = 0
    while not guide.is_finished() and (budget is None or len(out) < budget):
        assert len(out) < 400, tokenizer.decode(out)
        logits = torch.randn(len(tokenizer), generator=gen) + closing  # (V,)
        logits.masked_fill_(~guide.allowed_mask(), float("-inf"))
        sampled = int(logits.argmax())
        if sampled == tokenizer.eos_token_id:
            break
        token = guide.budget_substitute(sampled)
        substitutions += token != sampled
        if token == tokenizer.eos_token_id:
            break
        guide.advance(token)
        out.append(token)
        splice_jump_forward(tokenizer, guide, out)
    return tokenizer.decode(out), out, guide, substitutions


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_the_closer_from_the_next_state_is_the_rest_of_its_path(backend: str, name: str):
    grammar = compiler(backend).compile("json_schema", SCHEMAS[name])
    path = grammar.initial_path
    assert path is not None and grammar.min_tokens == len(path) > 0
    assert valid_json(SCHEMAS[name], smollm2_tokenizer().decode(path))
    for seed in range(3):  # from the start and from states a random decode went through
        _, ids, _, _ = budget_decode(grammar, seed=seed, budget=None, bias=3.0)
        guide = grammar.new_guide()
        for token in ids[: len(ids) // (seed + 2)]:
            guide.advance(token)
        here = closing_path(guide._closing_copy(), grammar.ranked, 256)
        assert here is not None
        while here:
            guide.advance(here[0])
            rest = closing_path(guide._closing_copy(), grammar.ranked, 256)
            assert rest == here[1:], (name, seed)
            here = rest
        assert guide.is_accepting()


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_every_budget_from_the_minimum_up_gives_a_valid_output(backend: str, name: str):
    schema = SCHEMAS[name]
    grammar = compiler(backend).compile("json_schema", schema)
    low = grammar.min_tokens
    closed = 0
    for seed in range(3):
        free = len(budget_decode(grammar, seed=seed, budget=None, bias=3.0)[1])
        for budget in sorted({low, low + 1, low + 3, (low + 2 * free) // 2, 2 * free}):
            text, ids, guide, subs = budget_decode(
                grammar, seed=seed, budget=budget, constraint=("json_schema", schema)
            )
            meta = guide.meta_info(text)
            assert len(ids) <= budget and valid_json(schema, text), (name, budget, text)
            assert meta["constraint_violation"] is None and meta["budget_cut"] is False, meta
            assert meta["budget_closed"] is (subs > 0), (meta, subs)
            closed += subs > 0
    assert closed > 0  # the tight budgets did need the closer


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_ebnf_outputs_stay_complete_under_tight_budgets(backend: str) -> None:
    for grammar_text, check in ((ARITHMETIC, lambda t: ArithmeticParser(t).parse()), (SQL, None)):
        grammar = compiler(backend).compile("ebnf", grammar_text)
        for seed in range(3):
            for budget in (grammar.min_tokens, grammar.min_tokens + 2, 12):
                text, ids, guide, _ = budget_decode(grammar, seed=seed, budget=budget)
                assert len(ids) <= budget and guide.is_accepting(), (text, budget)
                assert guide.meta_info(text)["constraint_violation"] is None
                if check is not None:
                    check(text)
                else:
                    assert SQL_REFERENCE.fullmatch(text), text


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_budget_below_the_closer_is_refused_naming_the_minimum(backend: str) -> None:
    grammar = compiler(backend).compile("json_schema", SCHEMAS["ticket"])
    need = grammar.min_tokens
    with pytest.raises(BudgetError, match=f"max_new_tokens={need - 1}.*at least {need}"):
        grammar.new_guide(max_new_tokens=need - 1)
    assert isinstance(BudgetError("x"), GrammarError) and isinstance(BudgetError("x"), ValueError)
    grammar.new_guide(max_new_tokens=need)  # the minimum itself is served


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_grammar_the_closer_cannot_finish_falls_back_to_flagging(backend: str) -> None:
    # the policy's lowest-id letter is `a`: it writes "abab..." and never the closing `c`
    grammar = compiler(backend).compile("regex", "(ab)*c")
    assert grammar.initial_path is None and grammar.min_tokens == 0
    guide = grammar.new_guide(max_new_tokens=2, constraint=("regex", "(ab)*c"))
    a, b = (smollm2_tokenizer().encode(ch, add_special_tokens=False)[0] for ch in "ab")
    assert guide.budget_substitute(a) == a  # no closer: nothing is steered
    guide.advance(a)
    guide.advance(b)
    meta = guide.meta_info("ab")
    assert meta["budget_cut"] is True and "cut after 2 tokens" in meta["constraint_violation"]
    assert meta["budget_closed"] is False


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_witness_is_kept_only_while_it_still_completes_the_output(backend: str) -> None:
    grammar = compiler(backend).compile("json_schema", SCHEMAS["ticket"])
    guide = grammar.new_guide(max_new_tokens=grammar.min_tokens + 20)
    for token in smollm2_tokenizer().encode('{"title": "ab', add_special_tokens=False):
        guide.advance(token)
    here = closing_path(guide._closing_copy(), grammar.ranked, 256)
    assert here is not None and guide._closing_copy().completes(here)
    assert not guide._closing_copy().completes(here[:-1])  # allowed, but not complete
    backslash = smollm2_tokenizer().convert_tokens_to_ids("\\")
    assert not guide._closing_copy().completes([backslash, *here])  # `"` is now escaped text
    # inside the free string, text keeps the witness: no new walk, and no substitution
    text = smollm2_tokenizer().convert_tokens_to_ids("c")
    assert guide.budget_substitute(text) == text  # walks once: the witness here
    guide.advance(text)
    walks = guide.closer.walks
    for _ in range(3):
        assert guide.budget_substitute(text) == text
        guide.advance(text)
    assert guide.closer.walks == walks and not guide.budget_closed


def rule_cost(backend: str, name: str, seeds: int = 5, steps: int = 200) -> tuple[float, float]:
    """Median µs per step of the budget rule (`budget_substitute` + the forced-token guard) in
    a tight-budget model-free decode of `steps` tokens (every step below the closer's cap is
    checked), and the median µs per step of the same decode without a budget (mask, argmax,
    advance, forced tokens)."""
    import statistics
    import time

    tokenizer = smollm2_tokenizer()
    grammar = compiler(backend).compile("json_schema", SCHEMAS[name])
    rule_us, plain_us = [], []
    for seed in range(seeds + 1):  # seed 0 warms up
        for budget in (steps, None):
            gen = torch.Generator().manual_seed(seed)
            guide = grammar.new_guide(max_new_tokens=budget)
            out: list[int] = []
            n, rule, start = 0, 0.0, time.perf_counter()
            while not guide.is_finished() and n < steps:
                logits = torch.randn(len(tokenizer), generator=gen)
                token = int(logits.masked_fill_(~guide.allowed_mask(), -1e9).argmax())
                if token == tokenizer.eos_token_id:
                    break
                t0 = time.perf_counter()
                token = guide.budget_substitute(token)
                rule += time.perf_counter() - t0
                if token == tokenizer.eos_token_id:
                    break
                guide.advance(token)
                out.append(token)
                t0 = time.perf_counter()
                forced = splice_jump_forward(tokenizer, guide, out)
                rule += time.perf_counter() - t0 if budget else 0.0
                n += 1 + forced
            if seed and budget:
                rule_us.append(rule / n * 1e6)
            elif seed:
                plain_us.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(rule_us), statistics.median(plain_us)


if __name__ == "__main__":  # the rule's cost: `python -m tests.tokenizer.test_grammar_budget`
    torch.set_num_threads(1)
    for backend in GRAMMAR_BACKENDS:
        for name in ("ticket", "nested", "enum"):
            rule, plain = rule_cost(backend, name)
            print(f"{backend} {name}: rule {rule:.0f} µs/step, decode without {plain:.0f} µs/step")


# SGLang's own test regex (test_openai_server.py's test_regex): digits are allowed forever
POPULATION = r"""\{\n   "name": "[\w]+",\n   "population": [\d]+\n\}"""


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_number_the_grammar_lets_grow_forever_is_still_closed_by_the_budget(backend: str):
    import regex as re

    grammar = compiler(backend).compile("regex", POPULATION)
    path = grammar.initial_path
    assert path is not None, "the closer wrote digits until its cap"
    assert re.fullmatch(POPULATION, smollm2_tokenizer().decode(path))
    for seed in range(3):
        for budget in (grammar.min_tokens, grammar.min_tokens + 5, 40):
            text, ids, guide, _ = budget_decode(
                grammar, seed=seed, budget=budget, constraint=("regex", POPULATION)
            )
            assert len(ids) <= budget and re.fullmatch(POPULATION, text), (budget, text)
            assert guide.meta_info(text)["constraint_violation"] is None


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_the_closer_looks_for_a_number_ending_once_a_step(backend: str, monkeypatch):
    # where the grammar allows no digit (here a boolean), each of the ten digit spellings used
    # to repeat the same look for a line break ending the number: the walks on large schemas
    # spent most of their time there (bench.constrained_overhead at batch 16)
    from sgl_lite.backend.constrained.matchers import closer

    schema = {
        "type": "object",
        "properties": {f"flag{i}": {"type": "boolean"} for i in range(4)},
        "required": [f"flag{i}" for i in range(4)],
    }
    grammar = compiler(backend).compile("json_schema", schema)
    looks = []
    original = closer._ending_break
    monkeypatch.setattr(closer, "_ending_break", lambda m, r: looks.append(1) or original(m, r))
    path = closing_path(grammar.new_guide()._closing_copy(), grammar.ranked, 256)
    assert path is not None and valid_json(schema, smollm2_tokenizer().decode(path))
    assert 0 < len(looks) <= len(path), (len(looks), len(path))


# JSONSchemaBench's Glaiveai2K/create_user_633f87f7.json: in llguidance's email format the
# local part takes `}` and digits as letters and cannot end before its `@`, so the closer wrote
# `}` (it looked like a closing bracket: no `"` may follow it) until its cap; the request ran
# with no budget guarantee, and greedy SmolLM2 looped in the next free string until cut.
# xgrammar's local part refuses `}` but its domain needs a dot and a two-letter top level: its
# closer writes digit labels up to their length limit (112 tokens), where it found none before.
USER = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email"},
        "password": {"type": "string"},
        "username": {"type": "string"},
    },
    "required": ["username", "email", "password"],
}


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_an_email_field_does_not_lose_the_budget_guarantee(backend: str) -> None:
    grammar = compiler(backend).compile("json_schema", USER)
    path = grammar.initial_path
    assert path is not None, "the closer found no completion through the email's local part"
    assert valid_json(USER, smollm2_tokenizer().decode(path))
    for seed in range(3):
        for budget in (grammar.min_tokens, grammar.min_tokens + 4, grammar.min_tokens + 40):
            text, ids, guide, _ = budget_decode(
                grammar, seed=seed, budget=budget, constraint=("json_schema", USER)
            )
            assert len(ids) <= budget and valid_json(USER, text), (budget, text)
            assert guide.meta_info(text)["constraint_violation"] is None


# The same schema's `format: date`: the closer took the smallest digit first and closed it as
# "0000-01-01", year 0, which no date validator accepts; `1` now ranks before `0`.
DATES = {
    "type": "object",
    "properties": {
        "birthdate": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
    },
    "required": ["birthdate", "at"],
}


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_budget_closed_date_is_a_date_a_validator_accepts(backend: str) -> None:
    from jsonschema import Draft202012Validator

    grammar = compiler(backend).compile("json_schema", DATES)
    path = grammar.initial_path
    assert path is not None
    text = smollm2_tokenizer().decode(path)
    checker = Draft202012Validator.FORMAT_CHECKER
    errors = list(Draft202012Validator(DATES, format_checker=checker).iter_errors(json.loads(text)))
    assert not errors, (text, [e.message for e in errors])
