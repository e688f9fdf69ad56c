"""lm-eval's `local-completions` pattern on the embedded model, over HTTP: one context, several
continuations, each `POST /v1/completions` with `echo`, `logprobs=1`, `max_tokens=1`. With the
radix cache the context is computed once (its logprobs come from the tree), and every score
equals a full recompute's within the engine's logprob tolerance."""

from __future__ import annotations

from tests.support.server import post, server_info, url_fixture

SERVED = "smollm2"
url = url_fixture(served_model_name=SERVED)  # on the session's float32 engine

CONTEXT = (
    "Question: which of these animals is a mammal that lives in the sea and breathes air "
    "through a blowhole on the top of its head, and is often seen leaping out of the water "
    "beside boats in warm coastal waters? Think about it carefully before you answer. Answer:"
)
CHOICES = (" a dolphin", " a shark", " an octopus")
LOGPROB_TOL = 1e-3  # tests/e2e/test_engine.py: logprobs against a full forward


def _echo(url: str, ids: list[int], top: int) -> dict:
    body = {
        "model": SERVED,
        "prompt": ids,
        "echo": True,
        "logprobs": top,
        "max_tokens": 1,
        "temperature": 0,
    }
    response = post(url, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]


def _computed(url: str) -> int:
    info = server_info(url)
    return info["prompt_tokens_submitted"] - info["cache_hit_tokens"]


def test_echo_scores_of_shared_context_continuations_come_from_the_cache(url):
    tokens = post(url, "/tokenize", {"prompt": [CONTEXT + c for c in CHOICES]}).json()["tokens"]
    context_len = len(post(url, "/tokenize", {"prompt": CONTEXT}).json()["tokens"])
    before = _computed(url)
    cached = [_echo(url, ids, 1) for ids in tokens]
    computed = _computed(url) - before
    # the first computes its prompt; the others only what follows the shared context
    assert computed <= len(tokens[0]) + sum(len(ids) - context_len + 2 for ids in tokens[1:])
    # six top entries are more than the cache keeps: these recompute every prompt
    before = _computed(url)
    full = [_echo(url, ids, 6) for ids in tokens]
    assert _computed(url) - before == sum(map(len, tokens))
    for got, want in zip(cached, full, strict=True):
        assert got["tokens"] == want["tokens"] and got["token_logprobs"][0] is None
        pairs = zip(got["token_logprobs"][1:-1], want["token_logprobs"][1:-1], strict=True)
        assert max(abs(a - b) for a, b in pairs) < LOGPROB_TOL
        # lm-eval's is_greedy: the top entry of each prompt position
        tops = zip(got["top_logprobs"][1:-1], want["top_logprobs"][1:-1], strict=True)
        assert all(next(iter(a)) == next(iter(b)) for a, b in tops)
