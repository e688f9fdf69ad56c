"""The OpenAPI contract: /openapi.json and /docs are served (behind the API key, unlike
/health), and schemathesis fuzzes every operation of the spec against a live server on loopback:
no 5xx, and every answer (status, content type, body) is one the spec declares.

Generation is kept short: each generated body's token budgets are capped at one token, and
the engine's --request-timeout bounds whatever slips through. The server's own bound on a body
without a budget (at most 1024 tokens on chat and Responses) is still up to a minute of CPU
decode a body, and schemathesis sends hundreds of them: uncapped, one operation ran past
pytest's 300 s timeout.
"""

from __future__ import annotations

from collections import Counter

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from sgl_lite.server import create_app
from tests.support.server import engine_fixture, flush, serve

MAX_TOKENS = 1  # the contract is about shapes: one token answers as a long output would
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
STATUSES: Counter[int] = Counter()  # what the fuzzing saw, to check it reached both sides


engine = engine_fixture(request_timeout=5)  # schemathesis' long generations end in 5 s


def _published_spec() -> dict:
    """The spec as the app builds it (it does not depend on the model: a fake engine will do)."""
    from sgl_lite.backend.engine import Engine
    from tests.support.fakes import ByteTokenizer, FakeRunner

    fake = Engine(runner=FakeRunner(num_slots=64), tokenizer=ByteTokenizer(), device="cpu")
    try:
        return create_app(fake).openapi()
    finally:
        fake.shutdown()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cap(params: object, key: str) -> None:
    """Lowers a too-large budget and fills a missing one; a wrong value (negative examples) is
    left as generated, so the server still has to refuse it."""
    if isinstance(params, dict):
        value = params.get(key)
        missing = value is None and key != "max_completion_tokens"
        if missing or (_is_int(value) and value > MAX_TOKENS):
            params[key] = MAX_TOKENS


def cap_generation(path: str, body: object) -> None:
    """Small token budgets and sample counts, whatever the generator picked."""
    if not isinstance(body, dict):
        return
    if path == "/generate":
        if body.get("sampling_params") is None:  # null means the defaults: cap those too
            body["sampling_params"] = {}
        params = body["sampling_params"]
        for p in params if isinstance(params, list) else [params]:
            _cap(p, "max_new_tokens")
    elif path in ("/v1/completions", "/v1/chat/completions"):
        _cap(body, "max_tokens")
        _cap(body, "max_completion_tokens")
        if _is_int(body.get("n")) and 2 < body["n"] <= 64:  # over 64: a negative example
            body["n"] = 2
    elif path == "/v1/responses":
        _cap(body, "max_output_tokens")
    elif path in ("/v1/rerank", "/v2/rerank", "/rerank"):
        docs = body.get("documents")
        if isinstance(docs, list):  # one prefill per document: a few are enough
            del docs[3:]


contract = schemathesis.openapi.from_dict(_published_spec())


@contract.parametrize()
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_every_operation_keeps_the_contract(case, url):
    cap_generation(case.operation.path, case.body)
    response = case.call_and_validate(base_url=url, checks=CHECKS, timeout=60)
    STATUSES[response.status_code] += 1


def test_nothing_leaked_after_the_fuzzing(engine, url):
    assert STATUSES[200] >= 10 and STATUSES[400] >= 10, STATUSES  # accepted and refused cases
    info = flush(url)
    engine.check_integrity()
    assert info["pool_used_tokens"] == 0


def test_spec_declares_the_request_bodies_the_handlers_validate(url):
    spec = httpx.get(f"{url}/openapi.json").json()
    assert spec == contract.raw_schema  # the live server publishes the spec fuzzed here
    body = spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]
    assert set(body["schema"]["properties"]) >= {"text", "input_ids", "sampling_params", "timeout"}
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert "messages" in chat["requestBody"]["content"]["application/json"]["schema"]["required"]
    assert {"400", "429"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    docs = httpx.get(f"{url}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_spec_and_docs_need_the_api_key_but_health_does_not(engine):
    with serve(create_app(engine, api_key="sekrit")) as base:
        assert httpx.get(f"{base}/openapi.json").status_code == 401
        assert httpx.get(f"{base}/docs").status_code == 401
        assert httpx.get(f"{base}/health").status_code == 200
        auth = {"Authorization": "Bearer sekrit"}
        assert httpx.get(f"{base}/openapi.json", headers=auth).status_code == 200
