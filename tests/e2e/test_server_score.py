"""`POST /v1/score` on the session's engine: the scores' shape, their agreement with the engine's
own logprobs for the same prompts, text vs token ids, `item_first`, and 4xx errors that leave
the engine serving."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.support.server import flush, url_fixture

SERVED = "smollm2"
QUERY = "The capital of France is"
ITEMS = [" Paris", " London", " Berlin"]

url = url_fixture(served_model_name=SERVED)  # on the session's engine


def flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def score(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json={"model": SERVED, **body}, timeout=120)


@pytest.fixture(scope="module")
def labels(engine) -> list[int]:
    """The first token of each item: the question 'which city comes next?'."""
    return [engine.tokenizer.encode(item, add_special_tokens=False)[0] for item in ITEMS]


def next_token_logprobs(engine, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """The engine's own logprob of each of `ids` as the token after `prompt_ids`, read from the
    prompt logprobs of `prompt_ids + [id]` (another path than /v1/score's)."""
    values = []
    for token in ids:
        result = engine.generate(
            input_ids=prompt_ids + [token],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=len(prompt_ids) - 1,
        )
        values.append(result["meta_info"]["input_token_logprobs"][-1][0])
    return values


def test_scores_are_the_engines_next_token_probabilities(url, engine, labels):
    response = score(url, query=QUERY, items=ITEMS, label_token_ids=labels)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "scoring" and body["model"] == SERVED
    assert len(body["scores"]) == len(ITEMS)
    assert all(len(row) == len(labels) for row in body["scores"])
    for item, row in zip(ITEMS, body["scores"]):
        ids = engine.tokenizer.encode(QUERY + item)
        expected = [math.exp(lp) for lp in next_token_logprobs(engine, ids, labels)]
        assert row == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert sum(row) < 1  # raw probabilities: the rest of the vocabulary has the remainder
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(len(engine.tokenizer.encode(QUERY + i)) for i in ITEMS)
    assert usage["total_tokens"] == usage["prompt_tokens"]


def test_softmax_over_the_labels_sums_to_one_and_keeps_the_order(url, labels):
    raw = score(url, query=QUERY, items=ITEMS, label_token_ids=labels).json()["scores"]
    soft = score(url, query=QUERY, items=ITEMS, label_token_ids=labels, apply_softmax=True)
    assert soft.status_code == 200, soft.text
    for raw_row, soft_row in zip(raw, soft.json()["scores"]):
        assert sum(soft_row) == pytest.approx(1.0, abs=1e-6)
        assert soft_row == pytest.approx([p / sum(raw_row) for p in raw_row], rel=1e-4)
    # an empty item scores the query alone: the model knows its capitals
    first = score(url, query=QUERY, items=[""], label_token_ids=labels, apply_softmax=True)
    row = first.json()["scores"][0]
    assert row.index(max(row)) == 0, row


def test_token_ids_score_as_the_same_text_does(url, engine, labels):
    tok = engine.tokenizer
    query_ids = tok.encode(QUERY)
    item_ids = [tok.encode(item, add_special_tokens=False) for item in ITEMS]
    # the precondition of the comparison: the texts tokenize as the id lists concatenated
    assert all(tok.encode(QUERY + t) == query_ids + i for t, i in zip(ITEMS, item_ids))
    text = score(url, query=QUERY, items=ITEMS, label_token_ids=labels, apply_softmax=True)
    ids = score(url, query=query_ids, items=item_ids, label_token_ids=labels, apply_softmax=True)
    assert ids.status_code == 200, ids.text
    assert flat(ids.json()["scores"]) == pytest.approx(flat(text.json()["scores"]), rel=1e-5)


def test_item_first_puts_the_item_before_the_query(url, engine, labels):
    query, items = " is a city in", ["Paris", "Tokyo"]
    body = {"query": query, "items": items, "label_token_ids": labels}
    after = score(url, **body).json()["scores"]
    before = score(url, **body, item_first=True)
    assert before.status_code == 200, before.text
    for item, row in zip(items, before.json()["scores"]):
        ids = engine.tokenizer.encode(item + query)
        expected = [math.exp(lp) for lp in next_token_logprobs(engine, ids, labels)]
        assert row == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert flat(before.json()["scores"]) != pytest.approx(flat(after), rel=1e-3)
    # one item given as a plain string is one item
    single = score(url, query=QUERY, items=" Paris", label_token_ids=labels)
    listed = score(url, query=QUERY, items=[" Paris"], label_token_ids=labels).json()["scores"]
    assert len(single.json()["scores"]) == 1
    assert flat(single.json()["scores"]) == pytest.approx(flat(listed), rel=1e-5)


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"items": ["a"], "label_token_ids": [999999]}, "label_token_ids", "out of vocabulary"),
        ({"items": ["a"], "label_token_ids": [-1]}, "label_token_ids", "out of vocabulary"),
        ({"items": [], "label_token_ids": [1]}, "items", "at least one item"),
        ({"items": ["a"], "label_token_ids": []}, "label_token_ids", "at least one token"),
        ({"items": [[1, 2]], "label_token_ids": [1]}, "items", "both text or both token ids"),
        ({"query": [1, 2], "items": ["a"], "label_token_ids": [1]}, "items", "both text"),
        ({"items": ["a"]}, "label_token_ids", "required"),
        ({"label_token_ids": [1]}, "items", "required"),
        ({"items": ["a"], "label_token_ids": ["x"]}, "label_token_ids.0", "integer"),
        ({"query": [1, 2], "items": [[99999999]], "label_token_ids": [1]}, "items", "vocabulary"),
    ],
)
def test_bad_input_is_a_4xx_with_a_json_body(url, labels, body, param, words):
    response = score(url, **({"query": QUERY} | body))
    assert response.status_code == 400, response.text
    error = response.json()
    # our error body, and SGLang's fields beside it (its score tests read `type` and `message`)
    assert error["error"]["param"] == param and words in error["error"]["message"]
    assert error["type"] == "BadRequestError" and error["message"] == error["error"]["message"]
    # the engine still serves
    after = score(url, query=QUERY, items=ITEMS[:1], label_token_ids=labels)
    assert after.status_code == 200 and len(after.json()["scores"][0]) == len(labels)


def test_unknown_model_is_a_404_and_nothing_leaks(url, engine, labels):
    response = score(url, query=QUERY, items=ITEMS, label_token_ids=labels, model="nope")
    assert response.status_code == 404 and response.json()["type"] == "NotFoundError"
    assert flush(url)["pool_used_tokens"] == 0
    engine.check_integrity()


def test_the_shared_query_is_computed_once(url, engine):
    query = "A long shared context about rivers, mountains and capitals of Europe. " * 3 + QUERY
    items = [" Paris", " London", " Berlin", " Rome"]
    n = len(engine.tokenizer.encode(query + items[0]))
    flush(url)  # nothing cached: only the items' shared prefix can be served
    body = score(url, query=query, items=items, label_token_ids=[1, 2]).json()
    # every item but the first is served the query from the radix cache (all of its prompt but
    # the last two tokens, where the scores are read); the first computes it
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(items) * n
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(items) - 1) * (n - 3)
