"""Budget-aware masks, model-free: on a tiny hand-made vocabulary the distance table and the
mask rule agree with brute force; on SmolLM2's vocabulary every budgeted decode ends valid."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
import torch
from outlines_core import Index

from sgl_lite.backend.constrained import (
    AutomatonGuide,
    BudgetError,
    CompiledGrammar,
    plan_jump_forward,
)
from sgl_lite.backend.constrained.automaton import budget as budget_module
from sgl_lite.backend.constrained.vocab import build_token_vocabulary, byte_vocabulary
from tests.support.constrained import decode_without_model, shared_compiler
from tests.support.constraints import SCHEMAS
from tests.support.smollm import smollm2_tokenizer

# id 0 is eos; every other id is the literal text of its token (not byte-level).
TINY_TOKENS = ["</s>", '{"k": "', "a", "b", "ab", '"}', '"', "}", "x", "ba"]
TINY_REGEXES = [
    r'\{"k": "[ab]*"\}',
    r"(ab|a)(ab|b)*x",
    r"a{2,6}",
    r"(x|ab){1,3}b?",
]
MAX_DEPTH = 5


def tiny_grammar(regex: str) -> CompiledGrammar:
    vocab = build_token_vocabulary(
        {t: i for i, t in enumerate(TINY_TOKENS)},
        eos_token_id=0,
        special_ids=set(),
        byte_level=False,
    )
    return CompiledGrammar(
        regex, Index(regex, vocab.index_vocab), Index(regex, byte_vocabulary()), vocab
    )


def brute_distance(regex: str, prefix: str, limit: int = MAX_DEPTH) -> int | None:
    """Fewest tokens (of TINY_TOKENS) that complete `prefix` into a full match, by enumeration."""
    import re

    pattern = re.compile(regex)
    for k in range(limit + 1):
        for tail in itertools.product(TINY_TOKENS[1:], repeat=k):
            if pattern.fullmatch(prefix + "".join(tail)):
                return k
    return None


def reachable_prefixes(grammar: CompiledGrammar, depth: int = 3) -> list[tuple[str, int]]:
    """(text, state) for every token sequence of up to `depth` tokens the grammar allows."""
    out = [("", grammar.initial_state)]
    frontier = out[:]
    for _ in range(depth):
        nxt = []
        for text, state in frontier:
            for t in range(1, len(TINY_TOKENS)):
                s = grammar.next_state(state, t)
                if s is not None:
                    nxt.append((text + TINY_TOKENS[t], s))
        out += nxt
        frontier = nxt
    return out


@pytest.mark.parametrize("regex", TINY_REGEXES)
def test_distance_table_is_the_fewest_tokens_to_a_full_match(regex: str) -> None:
    grammar = tiny_grammar(regex)
    assert grammar.budget.exact
    for text, state in reachable_prefixes(grammar):
        want = brute_distance(regex, text)
        got = grammar.budget.dist(state)
        assert (got if got < budget_module.UNREACHABLE else None) == want, (regex, text)
    assert grammar.min_tokens == brute_distance(regex, "")


@pytest.mark.parametrize("regex", TINY_REGEXES)
def test_mask_allows_a_token_only_if_a_full_match_fits_after_it(regex: str) -> None:
    grammar = tiny_grammar(regex)
    for text, state in reachable_prefixes(grammar, depth=2):
        for left in range(0, MAX_DEPTH):
            mask = grammar.mask(state, left)
            for t in range(1, len(TINY_TOKENS)):
                after = brute_distance(regex, text + TINY_TOKENS[t], limit=max(left - 1, 0))
                fits = left >= 1 and grammar.next_state(state, t) is not None and after is not None
                assert bool(mask[t]) == fits, (regex, text, left, TINY_TOKENS[t])
            assert bool(mask[0]) == grammar.is_accepting(state)
            # The rule never strands a request: within budget, something is always allowed.
            if grammar.fits(state, left):
                assert mask.any()


@pytest.mark.parametrize("regex", TINY_REGEXES)
def test_byte_bound_is_a_consistent_upper_bound(regex: str, monkeypatch) -> None:
    monkeypatch.setattr(budget_module, "EXACT_MAX_WIDE_STATES", -1)
    monkeypatch.setattr(budget_module, "WIDE_FANOUT", 2)
    grammar = tiny_grammar(regex)
    assert not grammar.budget.exact
    for text, state in reachable_prefixes(grammar):
        true = brute_distance(regex, text)
        bound = grammar.budget.dist(state)
        assert true is None or bound >= true
        if bound < budget_module.UNREACHABLE and not grammar.is_accepting(state):
            # Consistency: some token keeps the bound one lower (so the mask rule is safe).
            assert grammar.budget.can_continue(state, bound - 1), (regex, text)


def test_budget_below_the_shortest_output_is_refused_naming_the_minimum() -> None:
    grammar = tiny_grammar(TINY_REGEXES[0])
    assert grammar.min_tokens == 2
    with pytest.raises(BudgetError, match=r"max_new_tokens=1 .* 2 tokens"):
        AutomatonGuide(grammar, max_new_tokens=1)
    guide = AutomatonGuide(grammar, max_new_tokens=2)
    guide.advance(1)  # '{"k": "' leaves one token: only '"}' fits
    assert guide.allowed_mask().nonzero().flatten().tolist() == [5]
    assert guide.budget_closed
    guide.advance(5)
    assert guide.is_finished() and guide.is_accepting()


def test_is_finished_when_the_budget_leaves_only_eos() -> None:
    grammar = tiny_grammar(r"a{2,6}")
    guide = AutomatonGuide(grammar, max_new_tokens=3)
    for _ in range(2):
        assert not guide.is_finished()
        guide.advance(2)
    assert not guide.is_finished()  # one token left, "a" still fits
    guide.advance(2)
    assert guide.is_finished() and guide.is_accepting() and guide.budget_closed
    assert AutomatonGuide(grammar).is_finished() is False


def _schema_budget_cases() -> list[tuple[str, int]]:
    return [
        (name, extra)
        for name in ("w3", "nested", "optional_fields", "array_of_objects")
        for extra in (0, 3, 12)
    ]


@pytest.mark.parametrize(("name", "extra"), _schema_budget_cases())
@pytest.mark.parametrize("jump_forward", [False, True], ids=["plain", "jump_forward"])
def test_budgeted_decodes_on_smollm2_always_end_valid(name: str, extra: int, jump_forward) -> None:
    schema = SCHEMAS[name]
    grammar = shared_compiler().compile("json_schema", schema)
    budget = grammar.min_tokens + extra
    for seed in range(3):
        out = decode_without_model(
            grammar, seed=seed, jump_forward=jump_forward, max_new_tokens=budget, bias=False
        )
        assert len(out.ids) <= budget
        jsonschema.validate(json.loads(out.text), schema)


def test_jump_forward_is_not_taken_when_it_would_overrun_the_budget() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "long_key_name_number_two": {"type": "integer"}},
        "required": ["a", "long_key_name_number_two"],
    }
    grammar = shared_compiler().compile("json_schema", schema)
    tokenizer = smollm2_tokenizer()
    ids = tokenizer.encode('{"a": "x"', add_special_tokens=False)

    def guide_after(max_new_tokens: int | None) -> AutomatonGuide:
        guide = AutomatonGuide(grammar, max_new_tokens=max_new_tokens)
        for token in ids:
            guide.advance(token)
        return guide

    plan = plan_jump_forward(tokenizer, guide_after(None), ids)
    assert plan is not None and "long_key_name_number_two" in plan.forced_text
    after = _walk(grammar, guide_after(None).state_at(plan.keep), plan.new_ids)
    needed = plan.keep + len(plan.new_ids) + grammar.budget.dist(after)
    assert plan_jump_forward(tokenizer, guide_after(needed), ids) == plan
    assert plan_jump_forward(tokenizer, guide_after(needed - 1), ids) is None


def _walk(grammar: CompiledGrammar, state: int, ids: list[int]) -> int:
    for t in ids:
        state = grammar.next_state(state, t)
    return state


def test_smollm2_byte_level_vocab_lacks_some_single_bytes_so_the_bound_filters_them() -> None:
    vocab = shared_compiler().vocab
    singles = {b[0] for b in vocab.token_bytes if b is not None and len(b) == 1}
    assert ord('"') in singles and ord("}") in singles
    assert 0xC0 not in singles  # never valid UTF-8, so byte-level BPE has no token for it
    assert torch.tensor(sorted(singles)).numel() < 256


def test_hybrid_bound_on_a_real_schema_is_close_to_exact_and_decodes_valid(monkeypatch) -> None:
    from sgl_lite.backend.constrained import GrammarCompiler

    schema = SCHEMAS["nested"]  # a free string inside an array: wide states
    exact = shared_compiler().compile("json_schema", schema)
    assert exact.budget.exact
    monkeypatch.setattr(budget_module, "EXACT_MAX_WIDE_STATES", -1)
    bound = GrammarCompiler(smollm2_tokenizer(), timeout_s=60.0).compile("json_schema", schema)
    assert not bound.budget.exact
    states = list(exact.index.get_transitions())
    assert all(bound.budget.dist(s) >= exact.budget.dist(s) for s in states)
    # Keys and separators are counted in real tokens, so the bound is far below one per byte.
    assert bound.min_tokens <= exact.min_tokens + 2
    assert max(bound.budget.dist(s) - exact.budget.dist(s) for s in states) <= 3
    for seed in range(3):
        out = decode_without_model(
            bound, seed=seed, jump_forward=True, max_new_tokens=bound.min_tokens + 8, bias=False
        )
        assert len(out.ids) <= bound.min_tokens + 8
        jsonschema.validate(json.loads(out.text), schema)
