"""`/v1/rerank` (SGLang's shape) and `/v2/rerank`, `/rerank` (vLLM's) without a model: the real
Engine and HTTP server over a fake runner that answers "yes" after a prompt whose document
names Paris and "no" otherwise, with the tiny tokenizer's ChatML template. Each score is
checked against the runner's own logits for the exact prompt (P(yes) / (P(yes) + P(no))),
then the order, `top_n`, `return_documents`, the shared prefix computed once, the 4xx answers
and SGLang's `--is-embedding` / `--chunked-prefill-size -1` launch flags.
"""

from __future__ import annotations

import logging

import httpx
import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from sgl_lite.server.openai.rerank import RerankRequest, answer_ids, relevance, rerank_prompts
from sgl_lite.server_args import (
    UNCHUNKED_PREFILL_TOKENS,
    build_parser,
    check_args,
    log_ignored_flags,
)
from sgl_lite.sglang_flags import ignored_flags
from tests.support.fakes import ByteTokenizer, FakeRunner
from tests.support.server import flush, serve
from tests.support.tiny import build_tiny_tokenizer

QUERY = "What is the capital of France?"
DOCS = ["Berlin is a city in Germany.", "Paris is the capital of France.", "Cats sleep a lot."]


@pytest.fixture(scope="module")
def served():
    """(url, engine, runner): the judge says "yes" when the last document line names Paris."""
    tokenizer = build_tiny_tokenizer()
    yes, no = answer_ids(tokenizer)

    def judge(seq: list[int]) -> int:
        text = tokenizer.decode(seq)
        document = text.rsplit("Document:", 1)[-1]
        return yes[0] if "Paris" in document else no[0]

    runner = FakeRunner(num_slots=8192, vocab_size=len(tokenizer), next_token=judge)
    config = EngineConfig(device="cpu", max_total_tokens=8192)
    with (
        Engine(config, runner=runner, tokenizer=tokenizer) as engine,
        serve(create_app(engine, served_model_name="judge")) as base,
    ):
        yield base, engine, runner


def post(served, path: str = "/v1/rerank", **body) -> httpx.Response:
    return httpx.post(f"{served[0]}{path}", json={"query": QUERY, **body}, timeout=60)


def expected_scores(served, documents: list[str], **fields) -> list[float]:
    """Each document's score from the runner's logits for its prompt (another path than the
    engine's logprobs)."""
    _, engine, runner = served
    tokenizer = engine.tokenizer
    yes, no = answer_ids(tokenizer)
    req = RerankRequest(query=QUERY, documents=documents, **fields)
    scores = []
    for text in rerank_prompts(tokenizer, req):
        ids = tokenizer.encode(text, add_special_tokens=False)
        logprobs = torch.log_softmax(runner.logits(ids).float(), dim=-1)
        scores.append(relevance(logprobs[yes].tolist(), logprobs[no].tolist()))
    return scores


def test_scores_are_the_judges_yes_probability_best_first(served):
    response = post(served, documents=DOCS)
    assert response.status_code == 200, response.text
    items = response.json()
    assert [item["index"] for item in items][0] == 1  # the Paris document
    assert sorted(item["index"] for item in items) == [0, 1, 2]
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True)
    expected = expected_scores(served, DOCS)
    for item in items:
        assert item["document"] == DOCS[item["index"]]
        assert item["score"] == pytest.approx(expected[item["index"]], rel=1e-4, abs=1e-6)
        assert set(item) == {"score", "index", "document", "meta_info"}
    assert items[0]["score"] > 0.99 and items[-1]["score"] < 0.01


def test_top_n_and_return_documents(served):
    full = post(served, documents=DOCS).json()
    top = post(served, documents=DOCS, top_n=2, return_documents=False)
    assert top.status_code == 200, top.text
    assert [i["index"] for i in top.json()] == [i["index"] for i in full[:2]]
    assert all("document" not in item for item in top.json())
    more = post(served, documents=DOCS, top_n=10).json()  # past the count: all of them
    assert [i["index"] for i in more] == [i["index"] for i in full]


def test_the_instruction_is_in_every_prompt_under_either_name(served):
    _, engine, runner = served
    for name in ("instruct", "instruction"):
        flush(served[0])
        runner.segments.clear()
        response = post(served, documents=DOCS[:2], **{name: "Prefer capitals."})
        assert response.status_code == 200, response.text
        prompts = [
            engine.tokenizer.decode(seg.token_ids)
            for step in runner.segments
            for seg in step
            if seg.start == 0
        ]
        assert prompts and all("Instruction: Prefer capitals.\nQuery: " in p for p in prompts)
        expected = expected_scores(served, DOCS[:2], instruct="Prefer capitals.")
        got = {item["index"]: item["score"] for item in response.json()}
        assert [got[0], got[1]] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_vllms_shape_on_v2_and_the_bare_route(served):
    sglang = {i["index"]: i["score"] for i in post(served, documents=DOCS).json()}
    for path in ("/v2/rerank", "/rerank"):
        response = post(served, path, documents=DOCS, top_n=0, model="judge")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "judge" and body["id"].startswith("rerank-")
        results = body["results"]
        assert [r["index"] for r in results] == sorted(sglang, key=sglang.get, reverse=True)
        for r in results:
            assert r["document"] == {"text": DOCS[r["index"]]}
            assert r["relevance_score"] == pytest.approx(sglang[r["index"]], rel=1e-6)
        usage = body["usage"]
        assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    one = post(served, "/v2/rerank", documents=DOCS, top_n=1, return_documents=False).json()
    assert len(one["results"]) == 1 and one["results"][0]["document"] is None
    # usage counts every document ranked, not only the top_n returned
    assert one["usage"]["prompt_tokens"] == usage["prompt_tokens"]


def test_the_shared_instruction_and_query_are_computed_once(served):
    _, engine, runner = served
    flush(served[0])
    runner.batches.clear()
    items = post(served, documents=DOCS).json()
    tok = engine.tokenizer
    req = RerankRequest(query=QUERY, documents=DOCS)
    ids = [tok.encode(t, add_special_tokens=False) for t in rerank_prompts(tok, req)]
    shared = next(i for i, column in enumerate(zip(*ids)) if len(set(column)) > 1)
    assert shared > 40  # the judge, the instruction and the query
    cached = sorted(item["meta_info"]["cached_tokens"] for item in items)
    assert cached[0] == 0 and all(c >= shared - 2 for c in cached[1:]), (cached, shared)
    # the runner computed each prompt's tokens once, minus what the cache served
    computed = sum(n for batch in runner.batches for n in batch)
    assert computed == sum(len(p) for p in ids) - sum(cached)


@pytest.mark.parametrize(
    "path, body, status, param, words",
    [
        ("/v1/rerank", {"documents": []}, 400, "documents", "Documents cannot be empty"),
        ("/v1/rerank", {"documents": ["a", " "]}, 400, "documents.1", "non-empty string"),
        ("/v1/rerank", {"query": "  ", "documents": ["a"]}, 400, "query", "Query cannot be"),
        ("/v1/rerank", {"documents": "a"}, 400, "documents", "valid list"),
        ("/v1/rerank", {"documents": ["a", 3]}, 400, "documents.1", "string"),
        ("/v1/rerank", {"query": None, "documents": ["a"]}, 400, "query", "string"),
        ("/v1/rerank", {"documents": ["a"], "top_n": 0}, 400, "top_n", "larger than 0"),
        ("/v2/rerank", {"documents": ["a"], "top_n": -1}, 400, "top_n", "larger than 0"),
        ("/v1/rerank", {"documents": ["a"], "top_n": "2"}, 400, "top_n", "integer"),
        ("/v1/rerank", {"documents": ["a"], "return_documents": "no"}, 400, None, "boolean"),
        ("/v1/rerank", {"documents": ["a"], "temperature": 0}, 400, "temperature", "unknown"),
        (
            "/v1/rerank",
            {"documents": ["a"], "instruct": "x", "instruction": "y"},
            400,
            "instruction",
            "not both",
        ),
        ("/rerank", {"documents": ["a"], "model": "nope"}, 404, "model", "does not exist"),
    ],
)
def test_bad_input_is_a_4xx_with_sglangs_error_body(served, path, body, status, param, words):
    response = post(served, path, **body)
    assert response.status_code == status, response.text
    error = response.json()
    assert words in error["error"]["message"], error
    if param is not None:
        assert error["error"]["param"] == param
    assert error["message"] == error["error"]["message"] and error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    # the engine still serves and nothing leaks
    assert post(served, documents=DOCS[:1]).status_code == 200
    assert flush(served[0])["pool_used_tokens"] == 0
    served[1].check_integrity()


def test_a_document_past_the_context_is_a_400_naming_documents(served):
    long = "Paris " * 3000  # past the fake runner's 2048-token context
    response = post(served, documents=["short", long])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "documents"
    assert flush(served[0])["pool_used_tokens"] == 0
    served[1].check_integrity()


def test_embeddings_are_a_404_that_says_what_to_use(served):
    for path in ("/v1/embeddings", "/encode"):
        response = httpx.post(f"{served[0]}{path}", json={"input": "hi"}, timeout=10)
        assert response.status_code == 404
        message = response.json()["error"]["message"]
        assert "embeddings are not served" in message and "/v1/rerank" in message


def test_a_tokenizer_without_a_chat_template_gets_the_plain_question():
    tokenizer = ByteTokenizer()
    req = RerankRequest(query="q?", documents=["d1", "d2"])
    prompts = rerank_prompts(tokenizer, req)
    assert all(p.endswith("Answer yes or no.\nAnswer:") for p in prompts)
    assert "Query: q?\nDocument: d2\n" in prompts[1]
    assert answer_ids(tokenizer) == ([ord("y"), ord("Y")], [ord("n"), ord("N")])


def test_relevance_keeps_the_ratio_of_tiny_probabilities():
    assert relevance([-1000.0], [-1000.0 - 2.0]) == pytest.approx(1 / (1 + pow(2.718281828, -2)))
    assert relevance([float("-inf")], [float("-inf")]) == 0.5
    assert relevance([-1.0], [float("-inf")]) == 1.0
    assert relevance([-3.0, -3.0], [-2.0]) == pytest.approx(2 / (2 + 2.718281828), rel=1e-6)


def test_sglangs_embedding_launch_flags_are_accepted_and_logged(caplog):
    parser = build_parser()
    args = parser.parse_args(
        ["--is-embedding", "--chunked-prefill-size", "-1", "--disable-radix-cache"]
    )
    check_args(parser, args)
    assert "--is-embedding" in [flag.flag for flag in ignored_flags(args)]
    assert args.chunked_prefill_size == UNCHUNKED_PREFILL_TOKENS
    with caplog.at_level(logging.INFO, logger="sgl_lite.server"):
        log_ignored_flags(args)
    text = caplog.text
    assert "--is-embedding" in text and "/v1/rerank" in text and "no embeddings" in text
    assert "--chunked-prefill-size -1: prompts are not split" in text
    longer = parser.parse_args(["--chunked-prefill-size", "-1", "--context-length", "32768"])
    check_args(parser, longer)
    assert longer.chunked_prefill_size == 32768
    # other values are the engine's to check, as before
    assert parser.parse_args(["--chunked-prefill-size", "512"]).chunked_prefill_size == 512
