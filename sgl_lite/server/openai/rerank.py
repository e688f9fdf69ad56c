"""`POST /v1/rerank` (SGLang's shape) and `/v2/rerank`, `/rerank` (vLLM's): documents ranked by
how relevant the generation model judges each one to the query.

A generation model reranks the way decoder-only rerankers do (Qwen3-Reranker, which SGLang
serves on the same route): each document becomes one chat prompt that asks whether it answers
the query, and its score is the model's probability of answering "yes" rather than "no",
`P(yes) / (P(yes) + P(no))`, each side summed over its spellings' first tokens ("yes"/"Yes",
"no"/"No"), read from the full-vocabulary softmax at the answer's first position. That is one
prefill per document with a single greedy token whose `token_ids_logprob` the engine reports,
as `/v1/score` runs (score.py); the prompts put the instruction and the query before the
document and go in one submission, so the scheduler's in-batch prefix deferral and the radix
cache compute the shared part once.

SGLang answers a list sorted by score, best first: `{score, document, index, meta_info}`
(`document` left out with `return_documents: false`, at most `top_n` items, `top_n` >= 1).
vLLM (and Jina / Cohere clients) get `{id, model, usage, results: [{index, document: {text},
relevance_score}]}`, where `top_n: 0` means all. Errors are the one error body with SGLang's
fields beside it (score.py's `sglang_error`).
"""

from __future__ import annotations

import math
import uuid
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from pydantic import BaseModel, StrictBool, StrictInt, StrictStr

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.common.tokenizer import ChatTokenizer, Tokenizer
from sgl_lite.server.bridge import EngineBridge
from sgl_lite.server.compat import refuse_unknown
from sgl_lite.server.openai.completions import model_checker
from sgl_lite.server.openai.score import label_logprobs, sglang_error
from sgl_lite.server.protocol import ApiError, JsonResponse, _Wire, parse, read_json

JUDGE = (
    "You judge search results. Given a query and a document, answer whether the document "
    'answers the query. Answer with one word: "yes" or "no".'
)
YES, NO = ("yes", "Yes"), ("no", "No")
_ALIASES = {"input_ids": "documents", "text": "documents"}


class RerankRequest(_Wire):
    """SGLang's V1RerankReqInput (text only) and vLLM's RerankRequest: the same fields, with
    `instruct` (SGLang) or `instruction` (vLLM) as the reranker's task."""

    model: StrictStr | None = None
    query: StrictStr
    documents: list[StrictStr]
    instruct: StrictStr | None = None
    instruction: StrictStr | None = None
    top_n: StrictInt | None = None
    return_documents: StrictBool = True


_FIELDS = set(RerankRequest.model_fields)


class RerankItem(BaseModel):
    """One item of SGLang's answer (a list of them, best first); `document` only with
    `return_documents`."""

    score: float
    index: int
    document: str | None = None
    meta_info: dict[str, Any] | None = None


class RerankResult(BaseModel):
    """One result of vLLM's answer; `document` is null without `return_documents`."""

    index: int
    document: dict[str, str] | None
    relevance_score: float


class RerankResults(BaseModel):
    """vLLM's (and Jina's / Cohere's) answer: results best first, and the prompts' tokens."""

    id: str
    model: str
    usage: dict[str, int]
    results: list[RerankResult]


class Ranked(NamedTuple):
    """One document's result: its place in the request, its score, its prompt's token counts."""

    doc: int  # the document's index in the request
    score: float
    prompt_tokens: int
    cached_tokens: int


def add_rerank_routes(
    app: FastAPI,
    bridge: EngineBridge,
    *,
    served_model_name: str,
    accepted_names: set[str],
    max_body_bytes: int,
) -> None:
    """Adds `POST /v1/rerank` (SGLang) and `POST /v2/rerank`, `POST /rerank` (vLLM) to `app`."""
    check_model = model_checker(served_model_name, accepted_names)
    engine = bridge.engine

    async def rank(request: Request, *, zero_means_all: bool) -> tuple[RerankRequest, list[Ranked]]:
        data = await read_json(request, max_body_bytes)
        refuse_unknown(data, _FIELDS)
        req = parse(RerankRequest, data)
        check_model(req.model)
        check_request(req, zero_means_all=zero_means_all)
        yes, no = answer_ids(engine.tokenizer)
        prompts = [
            engine.tokenizer.encode(text, add_special_tokens=False)
            for text in rerank_prompts(engine.tokenizer, req)
        ]
        with bridge.refusals(_ALIASES):
            inp = GenerateInput(
                input_ids=prompts,
                # one greedy token: its position's logprobs are the scores
                sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                return_logprob=True,
                token_ids_logprob=[*yes, *no],
            )
            sub = await bridge.submit(inp, overload_status=429)
        results = await bridge.collect(sub, request)
        ranked = []
        for i, r in enumerate(results):
            meta = r["meta_info"]
            lps = label_logprobs(meta)
            score = relevance(lps[: len(yes)], lps[len(yes) :])
            ranked.append(Ranked(i, score, meta["prompt_tokens"], meta["cached_tokens"]))
        ranked.sort(key=lambda x: x.score, reverse=True)  # stable: ties keep the given order
        return req, ranked  # every document: usage counts them all, whatever top_n keeps

    @app.post("/v1/rerank")
    async def rerank_sglang(request: Request) -> JsonResponse:
        try:
            req, ranked = await rank(request, zero_means_all=False)
        except ApiError as exc:
            return sglang_error(exc)
        items = []
        for r in ranked[: req.top_n or None]:
            item: dict[str, Any] = {"score": r.score, "index": r.doc}
            if req.return_documents:
                item["document"] = req.documents[r.doc]
            item["meta_info"] = {"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens}
            items.append(item)
        return JsonResponse(items)

    @app.post("/v2/rerank")
    @app.post("/rerank")
    async def rerank_vllm(request: Request) -> JsonResponse:
        try:
            req, ranked = await rank(request, zero_means_all=True)
        except ApiError as exc:
            return sglang_error(exc)
        prompt_tokens = sum(r.prompt_tokens for r in ranked)
        results = [
            {
                "index": r.doc,
                "document": {"text": req.documents[r.doc]} if req.return_documents else None,
                "relevance_score": r.score,
            }
            for r in ranked[: req.top_n or None]
        ]
        body = {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": served_model_name,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": results,
        }
        return JsonResponse(body)


def check_request(req: RerankRequest, *, zero_means_all: bool) -> None:
    """400s for what cannot be ranked, in SGLang's words first."""
    if not req.query.strip():
        raise ApiError(400, "Query cannot be empty or whitespace only", param="query")
    if not req.documents:
        raise ApiError(400, "Documents cannot be empty: give at least one", param="documents")
    for i, doc in enumerate(req.documents):
        if not doc.strip():
            raise ApiError(
                400,
                f"Each document must be a non-empty string (documents[{i}] is empty or "
                "whitespace only)",
                param=f"documents.{i}",
            )
    if req.instruct is not None and req.instruction is not None:
        raise ApiError(400, "give instruct or instruction, not both", param="instruction")
    if req.top_n is not None and req.top_n < (0 if zero_means_all else 1):
        floor = "0 (0: all)" if zero_means_all else "0"
        raise ApiError(
            400,
            f"Value error, parameter top_n should be larger than {floor}, got {req.top_n}",
            param="top_n",
        )


def rerank_prompts(tokenizer: ChatTokenizer, req: RerankRequest) -> list[str]:
    """Each document's prompt: the chat template around the judge's question, the answer's
    turn opened; the instruction (if given) and the query come first, so every prompt shares
    them. (On the embedded 135M model this wording ranked best of three tried.)"""
    instruct = req.instruct or req.instruction
    task = f"Instruction: {instruct}\n" if instruct else ""
    prompts = []
    for doc in req.documents:
        question = (
            f"{task}Query: {req.query}\nDocument: {doc}\n"
            "Does the document answer the query? Answer yes or no."
        )
        messages = [{"role": "system", "content": JUDGE}, {"role": "user", "content": question}]
        if getattr(tokenizer, "chat_template", None):
            prompts.append(
                tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            )
        else:  # a base model's tokenizer: the same question as plain text
            prompts.append(f"{JUDGE}\n\n{question}\nAnswer:")
    return prompts


def answer_ids(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The first token of each spelling of "yes" and of "no" (a 501 where they share one)."""
    yes = _first_tokens(tokenizer, YES)
    no = _first_tokens(tokenizer, NO)
    if set(yes) & set(no) or not yes or not no:
        raise ApiError(
            501,
            "reranking needs distinct first tokens for 'yes' and 'no'; this tokenizer "
            f"gives {yes} and {no}",
        )
    return yes, no


def _first_tokens(tokenizer: Tokenizer, words: tuple[str, ...]) -> list[int]:
    ids: list[int] = []
    for word in words:
        tokens = tokenizer.encode(word, add_special_tokens=False)
        if tokens and tokens[0] not in ids:
            ids.append(tokens[0])
    return ids


def relevance(yes_logprobs: list[float], no_logprobs: list[float]) -> float:
    """P(yes) / (P(yes) + P(no)) from each side's full-vocabulary logprobs, in log space (the
    sigmoid of the log-odds) so tiny probabilities keep their ratio; 0.5 when both are 0."""
    yes, no = _logsumexp(yes_logprobs), _logsumexp(no_logprobs)
    if yes == no == -math.inf:
        return 0.5
    if no == -math.inf:
        return 1.0
    odds = yes - no
    return 1.0 / (1.0 + math.exp(-odds)) if odds >= 0 else math.exp(odds) / (1.0 + math.exp(odds))


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))
