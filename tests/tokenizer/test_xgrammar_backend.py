"""The grammar backends (llguidance, xgrammar), model-free on SmolLM2's tokenizer: the fidelity
matrix on each (enforced, refused, or a miss caught by the final validation, never passed off),
special tokens kept out of the mask, the slow-compile schema in milliseconds, a small budget
refused or closed, xgrammar's oneOf-as-anyOf reported, and routing under
`grammar_backend="xgrammar"`."""

from __future__ import annotations

import time

import pytest

from sgl_lite.backend.constrained import BudgetError, GrammarCompiler, GrammarError
from tests.support.constrained import (
    GRAMMAR_BACKENDS,
    ArithmeticParser,
    backend_decode,
    compiler,
    splice_jump_forward,
    valid_json,
)
from tests.support.constraints import ARITHMETIC, ENFORCED, SQL, SQL_REFERENCE
from tests.support.smollm import smollm2_tokenizer

# What xgrammar 0.2 reads loosely (probed on its matcher): `allOf` parts past the first are
# not all enforced, `not` is dropped, `oneOf` is read as `anyOf` (it reads the schema as
# submitted). Outputs on these may be invalid; the final validation must then say so.
XGRAMMAR_APPROXIMATES = {"all_of", "negated_presence", "negated_presence_in_a_discriminated_one_of"}


@pytest.mark.parametrize("name", list(ENFORCED))
@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_fidelity_matrix_enforced_refused_or_reported(backend: str, name: str) -> None:
    schema = ENFORCED[name]
    try:
        grammar = compiler(backend).compile("json_schema", schema)
    except GrammarError as exc:
        assert backend in str(exc)  # refused with the backend's reason, never dropped
        return
    assert grammar.backend == backend
    for seed in range(3):
        text, guide = backend_decode(grammar, seed=seed, constraint=("json_schema", schema))
        meta = guide.meta_info(text)
        valid = valid_json(schema, text)
        # the one guarantee every backend gives: invalid output is never passed off as valid
        assert (meta["constraint_violation"] is None) == valid, (name, text, meta)
        if not (backend == "xgrammar" and name in XGRAMMAR_APPROXIMATES):
            assert valid, (backend, name, text, meta)


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_ebnf_outputs_parse_on_each_grammar_backend(backend: str) -> None:
    for seed in range(4):
        text, guide = backend_decode(compiler(backend).compile("ebnf", ARITHMETIC), seed=seed)
        ArithmeticParser(text).parse()
        assert guide.meta_info(text)["constraint_violation"] is None
        text, _ = backend_decode(compiler(backend).compile("ebnf", SQL), seed=seed)
        assert SQL_REFERENCE.fullmatch(text), text


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_special_tokens_stay_out_and_eos_only_where_complete(backend: str) -> None:
    tokenizer = smollm2_tokenizer()
    special = sorted(set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder))
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    guide = compiler(backend).compile("json_schema", schema).new_guide()
    for token in tokenizer.encode('{"s": "ab', add_special_tokens=False):
        guide.advance(token)
    mask = guide.allowed_mask()  # inside a free string: everything textual is allowed
    assert mask.sum() > 10_000
    assert not mask[special].any(), [t for t in special if mask[t]]
    for token in tokenizer.encode('"}', add_special_tokens=False):
        guide.advance(token)
    assert guide.is_accepting() and guide.is_finished()
    assert guide.allowed_mask()[tokenizer.eos_token_id]


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_the_slow_compile_schema_compiles_in_under_a_second(backend: str) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5000}}}
    compiler(backend).compile("regex", "warm-up")  # the tokenizer tables, once per backend
    start = time.perf_counter()
    grammar = compiler(backend).compile("json_schema", schema)
    assert time.perf_counter() - start < 1.0
    text, guide = backend_decode(grammar, seed=0)
    assert valid_json(schema, text) and guide.meta_info(text)["constraint_violation"] is None


@pytest.mark.parametrize("backend", GRAMMAR_BACKENDS)
def test_a_small_budget_is_refused_or_closed_never_cut(backend: str) -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    grammar = compiler(backend).compile("json_schema", schema)
    with pytest.raises(BudgetError, match=f"at least {grammar.min_tokens}"):
        grammar.new_guide(max_new_tokens=4)  # '{"note": ""}' takes more than 4 tokens
    guide = grammar.new_guide(max_new_tokens=grammar.min_tokens + 2)
    out: list[int] = []
    while not guide.is_finished() and guide.tokens_left > 0:
        mask = guide.allowed_mask()
        token = guide.budget_substitute(int(mask.nonzero()[-1, 0]))  # the highest-id token
        guide.advance(token)
        out.append(token)
        splice_jump_forward(smollm2_tokenizer(), guide, out)
    text = smollm2_tokenizer().decode(out)
    meta = guide.meta_info(text)
    assert len(out) <= grammar.min_tokens + 2 and valid_json(schema, text), text
    assert meta["budget_closed"] is True and meta["budget_cut"] is False, meta


def test_xgrammar_reads_one_of_as_any_of_and_the_validation_catches_it() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    grammar = compiler("xgrammar").compile("json_schema", schema)
    guide = grammar.new_guide(constraint=("json_schema", schema))
    for token in smollm2_tokenizer().encode("7", add_special_tokens=False):
        guide.advance(token)  # 7 is an integer and a number: valid under both branches
    assert guide.is_accepting()
    meta = guide.meta_info("7")
    assert meta["constraint_violation"] is not None and meta["budget_cut"] is False


def test_xgrammar_backend_routes_every_kind_and_names_bad_input() -> None:
    xg = compiler("xgrammar")
    assert xg.plan("regex", "[a-z]+")[0] == "xgrammar"
    assert xg.plan("json_schema", ENFORCED["int_range"])[0] == "xgrammar"
    assert xg.plan("ebnf", ARITHMETIC)[0] == "xgrammar"
    with pytest.raises(GrammarError, match="ebnf grammar does not parse"):
        xg.validate("ebnf", "root ::= (")
    with pytest.raises(GrammarError, match="json_schema is not valid JSON"):
        xg.validate("json_schema", "{nope")
    with pytest.raises(GrammarError, match="regex"):
        xg.validate("regex", "(unclosed")
    with pytest.raises(ValueError, match="xgrammar"):
        GrammarCompiler(smollm2_tokenizer(), backend="xgrammar2")
    text, _ = backend_decode(xg.compile("regex", r"[0-9]{3}-[a-z]{2}"), seed=0)
    assert len(text) == 6 and text[3] == "-"
