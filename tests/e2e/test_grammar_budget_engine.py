"""The budget guarantee on the grammar backends through the engine on SmolLM2: with
`grammar_backend` llguidance and xgrammar, greedy and sampled, from the closer's minimum up to
twice the unbudgeted length, every output is complete and valid within max_new_tokens (the
closer's tokens replace sampled ones where needed, `budget_closed`); a budget below the
minimum is refused naming it; budgeted greedy output is the same with the prefix cache."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sgl_lite.backend.constrained import GrammarCompiler
from sgl_lite.backend.engine import Engine
from tests.support import NUM_THREADS
from tests.support.constraints import BUDGET_SCHEMAS
from tests.support.smollm import chat_prompt

SCHEMAS = {name: BUDGET_SCHEMAS[name] for name in ("ticket", "invoice", "names")}
SAMPLING = [{"temperature": 0}, {"temperature": 1.0, "sampling_seed": 5}]


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def backend_engine(request):
    eng = Engine(num_threads=NUM_THREADS, max_total_tokens=8192, grammar_backend=request.param)
    yield request.param, eng
    eng.shutdown()


def _min_tokens(tokenizer, backend: str) -> dict[str, int]:
    compiler = GrammarCompiler(tokenizer, backend=backend)
    return {name: compiler.compile("json_schema", s).min_tokens for name, s in SCHEMAS.items()}


def test_every_budget_from_the_minimum_up_is_complete_and_valid(backend_engine, smollm_tokenizer):
    backend, engine = backend_engine
    low = _min_tokens(smollm_tokenizer, backend)
    prompt = chat_prompt(smollm_tokenizer, "Describe a customer order. Answer in the format asked.")
    probe = [{"temperature": 0, "max_new_tokens": 64, "json_schema": s} for s in SCHEMAS.values()]
    lengths = [o["meta_info"]["completion_tokens"] for o in engine.generate([prompt] * 3, probe)]
    params, cases = [], []
    for (name, schema), length in zip(SCHEMAS.items(), lengths):
        for budget in sorted({low[name], low[name] + 2, 2 * length}):
            for sampling in SAMPLING:
                params.append({**sampling, "max_new_tokens": budget, "json_schema": schema})
                cases.append((name, budget))
    closed = 0
    for (name, budget), out in zip(cases, engine.generate([prompt] * len(params), params)):
        meta = out["meta_info"]
        where = (backend, name, budget, out["text"], meta)
        assert meta["completion_tokens"] <= budget, where
        assert meta["constraint_violation"] is None and meta["budget_cut"] is False, where
        text = out["text"].removesuffix(smollm_tokenizer.eos_token)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        closed += meta["budget_closed"]
    assert closed >= 3  # the tight budgets did need the closer
    engine.check_integrity()


def test_a_budget_below_the_minimum_is_refused_naming_it(backend_engine, smollm_tokenizer):
    backend, engine = backend_engine
    need = _min_tokens(smollm_tokenizer, backend)["ticket"]
    schema = json.dumps(SCHEMAS["ticket"])
    before = engine.get_server_info()["pool_free_tokens"]
    out = engine.generate("Ticket:", {"max_new_tokens": need - 1, "json_schema": schema})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort", out  # an InvalidRequest underneath: a 400 over HTTP
    assert f"at least {need}" in reason["message"] and "max_new_tokens" in reason["message"]
    assert engine.get_server_info()["pool_free_tokens"] == before
    ok = engine.generate("Ticket:", {"max_new_tokens": need, "json_schema": schema})
    jsonschema.validate(json.loads(ok["text"]), SCHEMAS["ticket"])


def test_budget_closed_greedy_output_is_the_same_with_the_prefix_cache(
    backend_engine, smollm_tokenizer
):
    backend, engine = backend_engine
    need = _min_tokens(smollm_tokenizer, backend)["ticket"]
    prompt = chat_prompt(smollm_tokenizer, "A support ticket about a broken login page, as JSON.")
    params = {"temperature": 0, "max_new_tokens": need + 4, "json_schema": SCHEMAS["ticket"]}
    first = engine.generate(prompt, params)  # prompt now cached
    again = engine.generate(prompt, params)
    batched = engine.generate([prompt, prompt + " "], [params, params])[0]
    assert again["meta_info"]["cached_tokens"] > 0
    assert first["output_ids"] == again["output_ids"]  # the fast mode's repeat guarantee
    # NOTE: alone and batched agree token for token only in the deterministic mode; in the fast
    # mode a batch's passes (one row's jump-forward chunk beside the other's decode) may run
    # other kernels, so the batched output is held to what the budget promises, not to identity
    # (seen on an AMX Xeon with one thread: the two part at a near-tie, token 5).
    for out in (first, batched):
        assert out["meta_info"]["budget_closed"], out
        assert len(out["output_ids"]) <= params["max_new_tokens"]
        jsonschema.validate(json.loads(out["text"]), SCHEMAS["ticket"])


def test_logprobs_record_the_tokens_the_closer_emitted(backend_engine, smollm_tokenizer):
    backend, engine = backend_engine
    need = _min_tokens(smollm_tokenizer, backend)["ticket"]
    prompt = chat_prompt(smollm_tokenizer, "A support ticket about a broken login page, as JSON.")
    params = {"temperature": 1.0, "sampling_seed": 3, "max_new_tokens": need + 2}
    params["json_schema"] = SCHEMAS["ticket"]
    out = engine.generate(prompt, params, return_logprob=True, top_logprobs_num=3)
    meta = out["meta_info"]
    assert meta["budget_closed"], meta
    recorded = iter(out["output_ids"])
    for logprob, token, _ in meta["output_token_logprobs"]:  # in order, forced tokens skipped
        assert token in recorded and logprob <= 0.0, (token, logprob)
    jsonschema.validate(json.loads(out["text"]), SCHEMAS["ticket"])
