"""`/v1/rerank` and `/v2/rerank` on the session's engine (the embedded SmolLM2): SGLang's answer
shape on its own fixtures, scores equal to the engine's yes/no probabilities read another way,
the order, `top_n` / `return_documents`, the shared prompt computed once, and 4xx errors that
leave the engine serving. How well a 135M model judges relevance is not asserted."""

from __future__ import annotations

import math

import httpx
import pytest

from sgl_lite.server.openai.rerank import RerankRequest, answer_ids, relevance, rerank_prompts
from tests.support.server import flush, url_fixture

SERVED = "cross-encoder/ms-marco-MiniLM-L6-v2"  # the name SGLang's rerank tests serve under
# SGLang's rerank fixtures (sglang.test.runners.TEST_RERANK_QUERY_DOCS), as its tests send them
QUERY_DOCS = [
    ("How many people live in Berlin?", ["Berlin is well known for its museums."]),
    (
        "What is the capital of France?",
        ["Paris is the capital of France.", "Berlin is in Germany."],
    ),
]

url = url_fixture(served_model_name=SERVED)  # on the session's engine


def rerank(url: str, path: str = "/v1/rerank", **body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def engine_scores(engine, query: str, documents: list[str]) -> list[float]:
    """Each document's P(yes) / (P(yes) + P(no)) from the prompt logprobs of its prompt plus
    each answer token (another path than the route's `token_ids_logprob`)."""
    tok = engine.tokenizer
    yes, no = answer_ids(tok)
    req = RerankRequest(query=query, documents=documents)
    scores = []
    for text in rerank_prompts(tok, req):
        ids = tok.encode(text, add_special_tokens=False)
        logprobs = []
        for token in yes + no:
            result = engine.generate(
                input_ids=ids + [token],
                sampling_params={"max_new_tokens": 0},
                return_logprob=True,
                logprob_start_len=len(ids) - 1,
            )
            logprobs.append(result["meta_info"]["input_token_logprobs"][-1][0])
        scores.append(relevance(logprobs[: len(yes)], logprobs[len(yes) :]))
    return scores


@pytest.mark.parametrize("query, documents", QUERY_DOCS)
def test_sglangs_rerank_fixtures_get_its_answer_shape(url, engine, query, documents):
    response = rerank(url, query=query, documents=documents)
    assert response.status_code == 200, response.text
    items = response.json()
    assert isinstance(items, list) and len(items) == len(documents)
    assert sorted(item["index"] for item in items) == list(range(len(documents)))
    expected = engine_scores(engine, query, documents)
    for item in items:
        assert isinstance(item["score"], float) and 0.0 < item["score"] < 1.0
        assert item["document"] == documents[item["index"]]
        assert item["score"] == pytest.approx(expected[item["index"]], rel=1e-4, abs=1e-6)
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True)  # best first


def test_top_n_return_documents_and_vllms_shape_agree(url):
    query, documents = "What is a panda?", ["hi", "The giant panda is a bear.", "Rain falls."]
    full = rerank(url, query=query, documents=documents, model=SERVED).json()
    top = rerank(url, query=query, documents=documents, top_n=1, return_documents=False).json()
    assert len(top) == 1 and "document" not in top[0]
    assert top[0]["index"] == full[0]["index"]
    # The same scores: a later request is served partly from the cache, so its pass shapes
    # differ and float32 sums may differ in their last bits (identity is for greedy tokens).
    assert top[0]["score"] == pytest.approx(full[0]["score"], rel=1e-4, abs=1e-6)
    v2 = rerank(url, "/v2/rerank", query=query, documents=documents)
    assert v2.status_code == 200, v2.text
    results = v2.json()["results"]
    assert [r["index"] for r in results] == [item["index"] for item in full]
    assert [r["relevance_score"] for r in results] == pytest.approx(
        [item["score"] for item in full], rel=1e-4, abs=1e-6
    )
    assert v2.json()["usage"]["prompt_tokens"] == sum(
        item["meta_info"]["prompt_tokens"] for item in full
    )


def test_the_documents_share_the_prompt_before_them(url, engine):
    query = "Which river flows through the capital of the United Kingdom? " * 3
    documents = ["The Thames flows through London.", "The Seine flows through Paris."] * 2
    flush(url)  # nothing cached: only the documents' shared prefix can be served
    items = rerank(url, query=query, documents=documents).json()
    tok = engine.tokenizer
    ids = [
        tok.encode(t, add_special_tokens=False)
        for t in rerank_prompts(tok, RerankRequest(query=query, documents=documents))
    ]
    shared = next(i for i, column in enumerate(zip(*ids)) if len(set(column)) > 1)
    cached = sorted(item["meta_info"]["cached_tokens"] for item in items)
    assert cached[0] == 0 and all(c >= shared - 2 for c in cached[1:]), (cached, shared)
    # the same document twice scores the same, served from the cache or not: to the fast
    # mode's rounding, since the copy served from the cache recomputes its last two tokens
    # (their logprobs are asked for) in a pass of a few rows, on other kernels than the first
    # copy's prefill (a wrong prefix would move the score by far more)
    by_doc: dict[int, float] = {item["index"]: item["score"] for item in items}
    assert math.isclose(by_doc[0], by_doc[2], rel_tol=1e-3)
    assert math.isclose(by_doc[1], by_doc[3], rel_tol=1e-3)


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"query": "q", "documents": []}, "documents", "Documents cannot be empty"),
        ({"query": "q", "documents": [""]}, "documents.0", "non-empty string"),
        ({"query": "", "documents": ["a"]}, "query", "Query cannot be empty"),
        ({"query": "q", "documents": "a"}, "documents", "valid list"),
        ({"query": "q", "documents": [["a"]]}, "documents.0", "string"),
        ({"query": 7, "documents": ["a"]}, "query", "string"),
        ({"documents": ["a"]}, "query", "required"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n", "larger than 0"),
    ],
)
def test_bad_input_is_a_400_and_the_engine_keeps_serving(url, engine, body, param, words):
    response = rerank(url, **body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "BadRequestError" and words in error["message"]
    assert error["error"]["param"] == param
    assert rerank(url, query="q", documents=["a"]).status_code == 200
    assert flush(url)["pool_used_tokens"] == 0
    engine.check_integrity()


def test_an_unknown_model_is_a_404(url):
    response = rerank(url, query="q", documents=["a"], model="BAAI/bge-reranker-v2-m3")
    assert response.status_code == 404 and response.json()["type"] == "NotFoundError"
