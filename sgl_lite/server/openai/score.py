"""`POST /v1/score`: SGLang's decoder-only scoring, the next-token probabilities of chosen ids.

For each item the prompt is `query + item` (`item + query` with `item_first`), text or token
ids, and its score is the probability of each of `label_token_ids` as the token after that
prompt: the full-vocabulary softmax's value, or with `apply_softmax` a softmax over only the
label ids' logits (so each item's scores sum to 1). Each item is one prefill with a single
greedy output token whose `token_ids_logprob` the engine reports (scheduler/logprobs.py); the
items go in one submission, so the scheduler's in-batch prefix deferral and the radix cache
compute the shared query once.

Errors answer the one error body, `{"error": {...}}`, with SGLang's own error fields beside it
(`object`, `message`, `type`, `param`, `code` at the top level), which SGLang's score clients
read.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.server.bridge import EngineBridge
from sgl_lite.server.openai.completions import model_checker
from sgl_lite.server.protocol import ApiError, JsonResponse, _Wire, parse, read_json

# Engine field names as a score request spells them, for the `param` of an error.
_ALIASES = {"token_ids_logprob": "label_token_ids", "text": "items", "input_ids": "items"}


class ScoreRequest(_Wire):
    """`POST /v1/score` (SGLang's ScoringRequest): text or token ids, never a mix."""

    model: StrictStr | None = None
    query: StrictStr | list[StrictInt]
    items: StrictStr | list[StrictStr] | list[list[StrictInt]]
    label_token_ids: list[StrictInt]
    apply_softmax: StrictBool = False
    item_first: StrictBool = False


class ScoreResponse(BaseModel):
    """The answer: one list of `len(label_token_ids)` probabilities per item, in label order."""

    scores: list[list[float]]
    model: str
    usage: dict[str, Any] | None = None
    object: Literal["scoring"] = "scoring"


def add_score_routes(
    app: FastAPI,
    bridge: EngineBridge,
    *,
    served_model_name: str,
    accepted_names: set[str],
    max_body_bytes: int,
) -> None:
    """Adds `POST /v1/score` to `app`."""
    check_model = model_checker(served_model_name, accepted_names)

    @app.post("/v1/score")
    async def score(request: Request) -> JsonResponse:
        try:
            req = parse(ScoreRequest, await read_json(request, max_body_bytes))
            check_model(req.model)
            prompts = score_prompts(req)
            is_text = isinstance(prompts[0], str)
            with bridge.refusals(_ALIASES):
                inp = GenerateInput(
                    prompt=prompts if is_text else None,  # type: ignore[arg-type]
                    input_ids=None if is_text else prompts,  # type: ignore[arg-type]
                    # one greedy token: its position's logprobs are the scores; nothing is
                    # sampled from a distribution, so no seed or temperature matters
                    sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                    return_logprob=True,
                    token_ids_logprob=list(req.label_token_ids),
                )
                sub = await bridge.submit(inp, overload_status=429)
            results = await bridge.collect(sub, request)
            scores = [label_scores(r["meta_info"], req.apply_softmax) for r in results]
        except ApiError as exc:
            return sglang_error(exc)
        prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
        body = ScoreResponse(
            scores=scores,
            model=served_model_name,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 0,  # the one token each item generates is not an answer
                "total_tokens": prompt_tokens,
                "prompt_tokens_details": {
                    "cached_tokens": sum(r["meta_info"]["cached_tokens"] for r in results)
                },
            },
        )
        return JsonResponse(body.model_dump())


def score_prompts(req: ScoreRequest) -> list[str] | list[list[int]]:
    """The prompt of each item (a 400 for no items, no labels or a mix of text and ids)."""
    items = [req.items] if isinstance(req.items, str) else req.items
    if not items:
        raise ApiError(400, "items must hold at least one item", param="items")
    if not req.label_token_ids:
        raise ApiError(
            400, "label_token_ids must hold at least one token id", param="label_token_ids"
        )
    text_query = isinstance(req.query, str)
    if text_query != isinstance(items[0], str):
        raise ApiError(
            400,
            "query and items must be both text or both token ids "
            f"(query is {'text' if text_query else 'token ids'}, items are "
            f"{'text' if isinstance(items[0], str) else 'token ids'})",
            param="items",
        )
    if text_query:
        query, texts = str(req.query), [str(item) for item in items]
        return [item + query if req.item_first else query + item for item in texts]
    query_ids = [int(t) for t in req.query]
    lists = [[int(t) for t in item] for item in items if isinstance(item, list)]
    return [ids + query_ids if req.item_first else query_ids + ids for ids in lists]


def label_logprobs(meta: dict[str, Any]) -> list[float]:
    """The full-vocabulary logprob of each chosen id at an item's first output position, from
    its result's `output_token_ids_logprobs`; a 503 when the engine aborted the item before
    its token (its --request-timeout)."""
    entries = meta.get("output_token_ids_logprobs") or [None]
    if entries[0] is None:
        reason = meta.get("finish_reason") or {}
        raise ApiError(503, f"the item was not scored: {reason.get('message', 'aborted')}")
    return [entry[0] for entry in entries[0]]


def label_scores(meta: dict[str, Any], apply_softmax: bool) -> list[float]:
    """One item's scores (`label_logprobs` as probabilities, or softmaxed over the labels)."""
    logprobs = label_logprobs(meta)
    if not apply_softmax:
        return [math.exp(lp) for lp in logprobs]
    # softmax over the labels alone: their logits differ from their logprobs by one constant
    top = max(logprobs)
    if top == -math.inf:  # every label is impossible: no distribution over them to give
        return [1.0 / len(logprobs)] * len(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def sglang_error(exc: ApiError) -> JsonResponse:
    """`exc`'s error body with SGLang's ErrorResponse fields at the top level as well."""
    body = {
        "object": "error",
        "message": exc.message,
        "type": exc.type,
        "param": exc.param,
        "code": exc.status,
        "error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.status},
    }
    return JsonResponse(body, status_code=exc.status, headers=exc.headers)
