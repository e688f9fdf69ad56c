"""AutomatonGuide and CompiledGrammar: masks mirror the index, state ids agree, advance and
rollback."""

from __future__ import annotations

import random

import pytest
import torch

from sgl_lite.backend.constrained import (
    AutomatonGuide,
    GrammarError,
    JumpForward,
    apply_jump_forward,
    plan_jump_forward,
)
from tests.support.constrained import shared_compiler
from tests.support.constraints import SCHEMAS
from tests.support.smollm import smollm2_tokenizer

CASES = [
    ("json_schema", SCHEMAS["w3"]),
    ("json_schema", SCHEMAS["nested"]),
    ("regex", r"[a-z]+@x\.(com|org)"),
]


def _random_walk_states(grammar, seed: int, walks: int = 8, length: int = 40):
    rng = random.Random(seed)
    for _ in range(walks):
        state = grammar.initial_state
        for _ in range(length):
            allowed = [
                t for t in grammar.index.get_allowed_tokens(state) if t != grammar.eos_token_id
            ]
            if not allowed:
                break
            token_id = rng.choice(allowed)
            yield state, token_id
            state = grammar.index.get_next_state(state, token_id)


@pytest.mark.parametrize(("kind", "pattern"), CASES)
def test_mask_allows_exactly_what_the_index_allows(kind, pattern) -> None:
    grammar = shared_compiler().compile(kind, pattern)
    special = sorted(grammar.vocab.special_ids)
    for state, _ in _random_walk_states(grammar, seed=1, walks=4, length=25):
        mask = grammar.mask(state)
        assert mask.dtype == torch.bool and mask.shape == (len(smollm2_tokenizer()),)
        expected = set(grammar.index.get_allowed_tokens(state))
        assert set(mask.nonzero().flatten().tolist()) == expected
        assert bool(mask[grammar.eos_token_id]) == grammar.is_accepting(state)
        assert not mask[[s for s in special if s != grammar.eos_token_id]].any()
        assert grammar.mask(state) is mask  # cached per state


@pytest.mark.parametrize(("kind", "pattern"), CASES)
def test_token_and_byte_index_share_state_ids(kind, pattern) -> None:
    grammar = shared_compiler().compile(kind, pattern)
    assert grammar.byte_index.get_initial_state() == grammar.initial_state
    for state, token_id in _random_walk_states(grammar, seed=2):
        via_bytes = state
        for b in grammar.vocab.token_bytes[token_id]:
            via_bytes = grammar.byte_index.get_next_state(via_bytes, b)
        assert via_bytes == grammar.index.get_next_state(state, token_id)


def _ids(text: str) -> list[int]:
    return smollm2_tokenizer().encode(text, add_special_tokens=False)


def test_guide_advances_rolls_back_and_finishes() -> None:
    grammar = shared_compiler().compile("regex", r"ab[0-9]")
    guide = AutomatonGuide(grammar)
    ids = [grammar.vocab.token_bytes.index(b) for b in (b"a", b"b", b"7")]
    start = guide.state
    guide.advance(ids[0])
    guide.advance(ids[1])
    assert guide.num_advanced == 2 and not guide.is_accepting() and not guide.is_finished()
    with pytest.raises(GrammarError, match="not allowed"):
        guide.advance(ids[0])
    with pytest.raises(GrammarError, match="eos is not allowed"):
        guide.advance(grammar.eos_token_id)
    guide.advance(ids[2])
    assert guide.is_accepting() and guide.is_finished()
    assert guide.allowed_mask().nonzero().flatten().tolist() == [grammar.eos_token_id]
    guide.rollback(3)
    assert guide.state == start and guide.num_advanced == 0
    with pytest.raises(ValueError, match="rollback"):
        guide.rollback(1)


def test_accepting_state_can_continue_so_is_not_finished() -> None:
    guide = AutomatonGuide(shared_compiler().compile("regex", r"[0-9]+"))
    guide.advance(_ids("7")[0])
    assert guide.is_accepting() and not guide.is_finished()


def test_jump_forward_retokenizes_across_a_split_utf8_character() -> None:
    tokenizer = smollm2_tokenizer()
    grammar = shared_compiler().compile("regex", r"日本語です!")
    vocab = grammar.vocab
    first = vocab.token_bytes.index("日".encode()[:1])  # the lead byte alone
    guide = AutomatonGuide(grammar)
    guide.advance(first)
    jf = plan_jump_forward(tokenizer, guide, [first])
    assert jf is not None and jf.keep == 0
    assert vocab.decode_bytes(jf.new_ids) == "日本語です!".encode()
    assert jf.forced_text.endswith("本語です!")
    assert apply_jump_forward(guide, jf)
    assert guide.num_advanced == len(jf.new_ids) and guide.is_finished()


def test_jump_forward_is_none_when_nothing_is_forced_and_refuses_disallowed_tokens() -> None:
    tokenizer = smollm2_tokenizer()
    grammar = shared_compiler().compile("regex", r"(yes|no), (maybe|sure)")
    guide = AutomatonGuide(grammar)
    assert plan_jump_forward(tokenizer, guide, []) is None  # y/n is a branch
    out = _ids("yes")
    for t in out:
        guide.advance(t)
    jf = plan_jump_forward(tokenizer, guide, out)
    assert jf is not None
    assert vocab_text(grammar, out[: jf.keep] + jf.new_ids) == "yes, "
    state, n = guide.state, guide.num_advanced
    assert not apply_jump_forward(guide, JumpForward(keep=n, new_ids=_ids(" nope"), forced_text=""))
    assert (guide.state, guide.num_advanced) == (state, n)
    with pytest.raises(ValueError, match="output_ids"):
        plan_jump_forward(tokenizer, guide, out + out)


def vocab_text(grammar, ids: list[int]) -> str:
    return grammar.vocab.decode_bytes(ids).decode()
