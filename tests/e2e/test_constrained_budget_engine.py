"""Budget-aware constrained decoding through the engine on SmolLM2: for 8 schemas and 4 regexes,
greedy and sampled (T=1.0, 1.5), with max_new_tokens from the shortest valid output up to past
the unbudgeted length, every output is complete and valid; a budget below it is refused."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from sgl_lite.backend.constrained import GrammarCompiler
from tests.support.constraints import BUDGET_SCHEMAS
from tests.support.smollm import chat_prompt

BUDGET_REGEXES = {
    "sentence": r"[A-Z][a-z ,]+\.",
    "phone": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "word_list": r"[a-z]+(, [a-z]+)*",
    "quoted": r'"[^"\n]*"',
}
# One request per temperature: a second T=1.5 seed ran the same budget path on the same schemas.
SAMPLING = [
    {"temperature": 0},
    {"temperature": 1.0, "sampling_seed": 11},
    {"temperature": 1.5, "sampling_seed": 12},
]
UNBUDGETED_CAP = 64


def _constraints() -> list[tuple[str, str, str]]:
    return [("json_schema", n, json.dumps(s)) for n, s in BUDGET_SCHEMAS.items()] + [
        ("regex", n, r) for n, r in BUDGET_REGEXES.items()
    ]


def _valid(kind: str, pattern: str, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(pattern, text) is not None
    jsonschema.validate(json.loads(text), json.loads(pattern))
    return True


@pytest.fixture(scope="module")
def min_tokens(smollm_tokenizer) -> dict[str, int]:
    # the engine's default routing: schemas on llguidance's closer, regexes on the automaton
    compiler = GrammarCompiler(smollm_tokenizer, backend="auto")
    return {name: compiler.compile(kind, p).min_tokens for kind, name, p in _constraints()}


def test_every_budget_from_the_minimum_up_gives_complete_valid_output(
    engine, smollm_tokenizer, min_tokens
) -> None:
    prompt = chat_prompt(smollm_tokenizer, "Describe a customer order. Answer in the format asked.")
    constraints = _constraints()
    # The unbudgeted length: greedy with a generous cap (free strings often run into it).
    probe = [{"temperature": 0, "max_new_tokens": UNBUDGETED_CAP, k: p} for k, _, p in constraints]
    lengths = [r["meta_info"]["completion_tokens"] for r in engine.generate([prompt] * 12, probe)]
    params, cases = [], []
    for (kind, name, pattern), length in zip(constraints, lengths):
        low = min_tokens[name]
        # Tight, nearly tight, and loose: past the unbudgeted length (low / 2 + length). Twice
        # the length ran the loose path again on the longest outputs, the costliest column.
        budgets = sorted({low, low + 2, (low + 2 * length) // 2})
        for budget in budgets:
            for sampling in SAMPLING:
                params.append({**sampling, "max_new_tokens": budget, kind: pattern})
                cases.append((kind, name, pattern, budget))
    results = engine.generate([prompt] * len(params), params)
    closed = 0
    for (kind, name, pattern, budget), p, out in zip(cases, params, results):
        meta = out["meta_info"]
        where = (name, budget, p.get("temperature"), p.get("sampling_seed"), out["text"])
        assert meta["finish_reason"]["type"] == "stop", where
        assert meta["completion_tokens"] <= budget, where
        assert meta["constraint_violation"] is None, where
        assert _valid(kind, pattern, out["text"].removesuffix(smollm_tokenizer.eos_token)), where
        closed += meta["budget_closed"]
    assert closed > len(results) // 4  # the tight budgets really had to close outputs
    engine.check_integrity()


def test_a_budget_below_the_shortest_valid_output_is_refused_with_the_minimum(
    engine, min_tokens
) -> None:
    schema = json.dumps(BUDGET_SCHEMAS["ticket"])
    need = min_tokens["ticket"]
    before = engine.get_server_info()["pool_free_tokens"]
    out = engine.generate("Ticket:", {"max_new_tokens": need - 1, "json_schema": schema})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"  # an InvalidRequest underneath: a 400 over HTTP
    assert f"at least {need}" in reason["message"] and "max_new_tokens" in reason["message"]
    assert engine.get_server_info()["pool_free_tokens"] == before
    ok = engine.generate("Ticket:", {"max_new_tokens": need, "json_schema": schema})
    jsonschema.validate(json.loads(ok["text"]), BUDGET_SCHEMAS["ticket"])


def test_budgeted_greedy_output_is_the_same_with_and_without_the_prefix_cache(
    engine, smollm_tokenizer, min_tokens
) -> None:
    prompt = chat_prompt(smollm_tokenizer, "A support ticket about a broken login page, as JSON.")
    params = {
        "temperature": 0,
        "max_new_tokens": min_tokens["ticket"] + 10,
        "json_schema": json.dumps(BUDGET_SCHEMAS["ticket"]),
    }
    first = engine.generate(prompt, params)  # prompt now cached
    again = engine.generate(prompt, params)
    batched = engine.generate([prompt, prompt + " "], [params, params])[0]
    assert again["meta_info"]["cached_tokens"] > 0
    assert first["output_ids"] == again["output_ids"] == batched["output_ids"]
    assert first["meta_info"]["budget_closed"]
