"""lm-evaluation-harness (from .venv-clients) scores an offline multiple-choice task and a
generate_until task against our server with three of its API models: `local-completions` (echo
logprobs on /v1/completions) finds our tokenizer through /tokenizer_info and /tokenize, and what
it computed agrees with the server's own /generate logprobs, greedy choices and completions;
`sglang-generate` (native /generate) computes the same scores; `local-chat-completions`
generates through chat (tests/support/clients/lm_eval_scenario.py)."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from tests.support.client_venv import run_scenario
from tests.support.server import post


@pytest.fixture(scope="module")
def outcome(url, tmp_path_factory):
    """One lm-eval run of both tasks (their loglikelihood and generation requests)."""
    return run_scenario("lm_eval_scenario.py", url, str(tmp_path_factory.mktemp("lm_eval")))


def references(url: str, pairs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
    """Each (context, continuation)'s log-likelihood and whether each of its tokens is the
    greedy one, from native /generate (one batch, logprobs from the first token): lm-eval's
    split, the context's tokens, then the rest of the whole's tokens."""
    texts = [c for c, _ in pairs] + [c + x for c, x in pairs]
    response = post(url, "/tokenize", {"prompt": texts})
    assert response.status_code == 200, response.text
    ids = response.json()["tokens"]
    contexts, wholes = ids[: len(pairs)], ids[len(pairs) :]
    body = {
        "input_ids": wholes,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 1,
    }
    response = post(url, "/generate", body)
    assert response.status_code == 200, response.text
    out = []
    for context, whole, result in zip(contexts, wholes, response.json()):
        ctxlen, meta = len(context), result["meta_info"]
        assert 0 < ctxlen < len(whole) and whole[:ctxlen] == context
        scored = meta["input_token_logprobs"][ctxlen:]
        tops = meta["input_top_logprobs"][ctxlen:]
        assert [token for _, token, _ in scored] == whole[ctxlen:]
        greedy = all(top[0][1] == token for (_, token, _), top in zip(scored, tops))
        out.append((sum(lp for lp, _, _ in scored), greedy))
    return out


@pytest.mark.timeout(420)
def test_lm_eval_finds_our_tokenizer_remotely(outcome):
    assert outcome["__version__"].startswith("0.4.")
    # "auto" chose the remote backend: /tokenizer_info and /tokenize answered as lm-eval reads
    assert outcome["tokenizer_backend"] == "remote"


@pytest.mark.timeout(420)
def test_loglikelihoods_match_the_servers_own_logprobs(url, outcome):
    items = outcome["local-completions"]["mc"]["items"]
    assert len(items) == 5
    pairs = [(item["context"], x) for item in items for x in item["continuations"]]
    expected = iter(references(url, pairs))
    for item in items:
        assert len(item["loglikelihoods"]) == len(item["continuations"]) == 3
        for continuation, loglik, greedy in zip(
            item["continuations"], item["loglikelihoods"], item["is_greedy"]
        ):
            want, want_greedy = next(expected)
            assert loglik < 0 and math.isclose(loglik, want, abs_tol=1e-3), (
                item["context"],
                continuation,
                loglik,
                want,
            )
            # lm-eval's is_greedy compares each token's logprob with its top entry's: the
            # two numbers must be the same float for a greedy token
            assert greedy == want_greedy, (item["context"], continuation)
    assert any(g for item in items for g in item["is_greedy"]), "no continuation was greedy"


@pytest.mark.timeout(420)
def test_accuracy_is_computed_over_the_items(outcome):
    mc = outcome["local-completions"]["mc"]
    for item in mc["items"]:
        best = max(range(3), key=lambda i: item["loglikelihoods"][i])
        assert item["acc"] == float(best == item["target"])
    accs = [item["acc"] for item in mc["items"]]
    assert math.isclose(mc["acc"], sum(accs) / len(accs))
    # the easy items are scored right: " Paris" is far likelier than " Tokyo" after the context
    assert mc["acc"] >= 0.6, mc


@pytest.mark.timeout(420)
def test_generate_until_returns_the_servers_greedy_completion(url, outcome):
    gen = outcome["local-completions"]["gen"]
    for item in gen["items"]:
        response = httpx.post(
            f"{url}/v1/completions",
            json={
                "model": "default",
                "prompt": item["prompt"],
                "max_tokens": 8,
                "temperature": 0,
                "stop": ["\n", "."],
            },
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert item["response"] == response.json()["choices"][0]["text"]
    first = gen["items"][0]
    assert first["target"] == "Paris" and first["filtered"] == "Paris" and first["exact_match"] == 1
    matches = [item["exact_match"] for item in gen["items"]]
    assert math.isclose(gen["exact_match"], sum(matches) / len(matches))


@pytest.mark.timeout(420)
def test_sglang_generate_scores_and_generates_as_local_completions_does(outcome):
    """Native /generate (`logprob_start_len=0`, `input_token_logprobs`) gives lm-eval the same
    log-likelihoods as /v1/completions' echo. Its `is_greedy` is not compared: lm-eval 0.4.13's
    `SGLANGGENERATEAPI.parse_logprobs` inverts it (`all(token != top)`), a client bug."""
    native, openai = outcome["sglang-generate"], outcome["local-completions"]
    for mine, theirs in zip(native["mc"]["items"], openai["mc"]["items"], strict=True):
        assert mine["continuations"] == theirs["continuations"]
        for a, b in zip(mine["loglikelihoods"], theirs["loglikelihoods"], strict=True):
            assert math.isclose(a, b, abs_tol=1e-3), (mine["context"], a, b)
    assert native["mc"]["acc"] == openai["mc"]["acc"]
    assert [i["response"] for i in native["gen"]["items"]] == [
        i["response"] for i in openai["gen"]["items"]
    ]


@pytest.mark.timeout(420)
def test_local_chat_completions_returns_the_servers_greedy_chat_answer(url, outcome):
    gen = outcome["local-chat-completions"]["gen"]
    assert len(gen["items"]) == 2
    for item in gen["items"]:
        messages = json.loads(item["prompt"][0])  # lm-eval logs the chat it sent as JSON
        assert messages[-1]["role"] == "user"
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "default",
                "messages": messages,
                "max_tokens": 8,
                "temperature": 0,
                "stop": ["\n", "."],
            },
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert item["response"] == response.json()["choices"][0]["message"]["content"]
        assert item["response"].strip()
    matches = [item["exact_match"] for item in gen["items"]]
    assert math.isclose(gen["exact_match"], sum(matches) / len(matches))
