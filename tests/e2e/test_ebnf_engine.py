"""SGLang's `ebnf` sampling param end to end on SmolLM2: through the Engine (default backend,
where the grammar goes to llguidance, and xgrammar), the DSL's `gen(ebnf=...)`, the native
/generate (sgl_lite's RuntimeEndpoint) and OpenAI's extra body. Every output parses with a
reference parser written here; a bad grammar or two constraints at once is a named 400."""

from __future__ import annotations

import re

import pytest
import requests

import sgl_lite as sgl
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.server import create_app
from tests.support import NUM_THREADS
from tests.support.server import serve
from tests.support.smollm import chat_prompt

ARITHMETIC = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
"""
SQL = r"""
root ::= "SELECT " cols " FROM " name where?
cols ::= "*" | name (", " name){0,3}
where ::= " WHERE " name " " op " " value
op ::= "=" | "<" | ">"
value ::= [0-9]{1,4} | "'" [a-z]{1,8} "'"
name ::= [a-z_]{1,12}
"""
ASK = {
    "arithmetic": (ARITHMETIC, "Write an arithmetic expression that equals 12."),
    "sql": (SQL, "Write a SQL query listing the names of users older than 30."),
}


class Arithmetic:
    """A reference recursive-descent parser: evaluates the expression (so it really parses)."""

    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def parse(self) -> float:
        value = self.expr()
        assert self.i == len(self.text), f"trailing text at {self.i}: {self.text!r}"
        return value

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> float:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.factor()
            value = value * right if op == "*" else (value / right if right else float("inf"))
        return value

    def factor(self) -> float:
        if self.peek() == "(":
            self.take()
            value = self.expr()
            assert self.take() == ")", f"unclosed parenthesis: {self.text!r}"
            return value
        digits = re.compile(r"[0-9]{1,3}").match(self.text, self.i)
        assert digits, f"expected a number at {self.i}: {self.text!r}"
        self.i = digits.end()
        return float(digits.group())

    def peek(self) -> str:
        return self.text[self.i : self.i + 1]

    def take(self) -> str:
        ch = self.peek()
        self.i += 1
        return ch


def parse_sql(text: str) -> dict:
    """A reference parser for the SELECT subset: tokens, then the clauses in order."""
    tokens = re.findall(r"'[a-z]*'|[A-Za-z_]+|[0-9]+|[*,=<>]|\S", text)
    assert " ".join(tokens).replace(" ,", ",") == text, f"unexpected spacing: {text!r}"
    pos = 0

    def take(expect: str | None = None) -> str:
        nonlocal pos
        assert pos < len(tokens), f"ends early: {text!r}"
        tok = tokens[pos]
        pos += 1
        assert expect is None or tok == expect, f"expected {expect!r}, got {tok!r}: {text!r}"
        return tok

    def name() -> str:
        tok = take()
        assert re.fullmatch(r"[a-z_]{1,12}", tok), f"not a name: {tok!r} in {text!r}"
        return tok

    take("SELECT")
    cols = ["*"] if tokens[pos] == "*" else [name()]
    if cols == ["*"]:
        take("*")
    while pos < len(tokens) and tokens[pos] == ",":
        take(",")
        cols.append(name())
    assert len(cols) <= 4
    take("FROM")
    query = {"cols": cols, "table": name()}
    if pos < len(tokens):
        take("WHERE")
        column, op, value = name(), take(), take()
        assert op in ("=", "<", ">") and re.fullmatch(r"[0-9]{1,4}|'[a-z]{1,8}'", value), text
        query["where"] = (column, op, value)
    assert pos == len(tokens), f"trailing tokens: {text!r}"
    return query


def check(kind: str, text: str) -> None:
    """Raises AssertionError unless `text` parses as the `kind` grammar's language."""
    if kind == "arithmetic":
        Arithmetic(text).parse()
    else:
        parse_sql(text)


def test_the_reference_parsers_refuse_what_the_grammars_refuse() -> None:
    assert Arithmetic("2*(3+4)").parse() == 14
    for bad in ("2*", "(1", "1234", "1 + 2"):
        with pytest.raises(AssertionError):
            Arithmetic(bad).parse()
    assert parse_sql("SELECT a, b FROM t WHERE x = 'k'")["where"] == ("x", "=", "'k'")
    for bad in ("SELECT FROM t", "SELECT a FROM t WHERE", "SELECT a,b FROM t", "select a FROM t"):
        with pytest.raises(AssertionError):
            parse_sql(bad)


@pytest.fixture(scope="module")
def xg_engine():
    # float32 dense like the shared `engine`: the two are compared token for token below, and
    # the sampled cases were written against those numerics
    eng = Engine(
        num_threads=NUM_THREADS,
        max_total_tokens=4096,
        grammar_backend="xgrammar",
        dtype="float32",
        quantization="none",
    )
    yield eng
    eng.shutdown()


def _params(grammar: str) -> list[dict]:
    greedy = {"temperature": 0, "max_new_tokens": 48, "ebnf": grammar}
    sampled = [
        {"temperature": t, "sampling_seed": s, "max_new_tokens": 48, "ebnf": grammar}
        for t in (1.0, 1.5)
        for s in range(3)
    ]
    return [greedy, *sampled]


@pytest.mark.parametrize("kind", list(ASK))
@pytest.mark.parametrize("which", ["default", "xgrammar"])
def test_ebnf_outputs_parse_greedy_and_sampled(request, smollm_tokenizer, kind, which) -> None:
    eng = request.getfixturevalue("engine" if which == "default" else "xg_engine")
    grammar, question = ASK[kind]
    params = _params(grammar)
    outs = eng.generate([chat_prompt(smollm_tokenizer, question)] * len(params), params)
    for out in outs:
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "stop", out
        assert meta["constraint_violation"] is None and meta["budget_cut"] is False, out
        check(kind, out["text"])
    assert len({o["text"] for o in outs}) > 1  # sampling explored, not one forced string
    eng.check_integrity()


def test_default_and_xgrammar_agree_on_greedy_output(engine, xg_engine, smollm_tokenizer):
    prompt = chat_prompt(smollm_tokenizer, ASK["sql"][1])
    params = {"temperature": 0, "max_new_tokens": 48, "ebnf": SQL}
    assert engine.generate(prompt, params)["text"] == xg_engine.generate(prompt, params)["text"]


@pytest.mark.parametrize("which", ["default", "xgrammar"])
def test_bad_grammar_and_two_constraints_are_named_errors(request, which) -> None:
    eng = request.getfixturevalue("engine" if which == "default" else "xg_engine")
    with pytest.raises(InvalidRequest, match="ebnf") as bad:
        eng.generate("x", {"max_new_tokens": 4, "ebnf": "root ::= ("})
    assert isinstance(bad.value, ValueError) and bad.value.field == "ebnf"
    with pytest.raises(InvalidRequest, match="regex and ebnf are mutually exclusive") as both:
        eng.generate("x", {"max_new_tokens": 4, "regex": "a", "ebnf": 'root ::= "a"'})
    assert both.value.field == "regex"
    with pytest.raises(InvalidRequest, match="json_schema and ebnf"):
        eng.generate("x", {"max_new_tokens": 4, "json_schema": "{}", "ebnf": 'root ::= "a"'})
    assert eng.generate("x", {"max_new_tokens": 2, "ebnf": 'root ::= "ok"'})["text"] == "ok"
    eng.check_integrity()


@sgl.function
def query_and_formula(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("sql", max_tokens=48, ebnf=SQL))
    s += sgl.user("Now an arithmetic expression that equals 12.")
    s += sgl.assistant(sgl.gen("math", max_tokens=48, ebnf=ARITHMETIC))


QUESTIONS = [
    "Write a SQL query listing the names of users older than 30.",
    "Write a SQL query counting the orders of one customer.",
    "Write a SQL query for all products cheaper than 5.",
]


def test_dsl_gen_ebnf_through_the_engine(engine) -> None:
    rt = sgl.Runtime(engine=engine)
    for temperature in (0, 1.0):
        states = query_and_formula.run_batch(
            [{"question": q} for q in QUESTIONS], backend=rt, temperature=temperature
        )
        for state in states:
            assert state.error() is None, state.error()
            for var, kind in (("sql", "sql"), ("math", "arithmetic")):
                meta = state.get_meta_info(var)
                if meta.get("budget_cut"):  # unseeded sampling ran out of tokens: flagged,
                    assert temperature > 0 and meta["constraint_violation"], meta  # never valid
                    continue
                check(kind, state[var])
    engine.check_integrity()


def test_gen_refuses_ebnf_beside_another_constraint_or_empty() -> None:
    with pytest.raises(ValueError, match="at most one of dtype, regex, json_schema, ebnf"):
        sgl.gen("x", regex="a", ebnf=SQL)
    with pytest.raises(ValueError, match="ebnf"):
        sgl.gen("x", ebnf="  ")


def test_ebnf_over_the_wire_native_and_openai(engine) -> None:
    with serve(create_app(engine)) as url:
        state = query_and_formula.run(
            question=QUESTIONS[0], backend=sgl.RuntimeEndpoint(url), temperature=0
        )
        assert state.error() is None, state.error()
        check("sql", state["sql"])
        check("arithmetic", state["math"])
        bad = requests.post(
            f"{url}/generate",
            json={"text": "x", "sampling_params": {"max_new_tokens": 4, "ebnf": "root ::= ("}},
            timeout=60,
        )
        assert bad.status_code == 400 and "ebnf" in bad.json()["error"]["param"], bad.text
        reply = requests.post(
            f"{url}/v1/completions",
            json={"model": "default", "prompt": "SQL:", "max_tokens": 48, "ebnf": SQL},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        check("sql", reply.json()["choices"][0]["text"])
        both = requests.post(
            f"{url}/v1/completions",
            json={"model": "default", "prompt": "x", "regex": "a", "ebnf": SQL},
            timeout=60,
        )
        assert both.status_code == 400 and "regex" in both.json()["error"]["param"], both.text
    engine.check_integrity()
