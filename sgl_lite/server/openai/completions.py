"""OpenAI-compatible endpoints: /v1/models (and one model's card), /v1/completions (chat lives
in `chat.py`).

Each endpoint turns its OpenAI body into one native generate call on the shared `EngineBridge`,
then turns the engine's results (or stream chunks) back into OpenAI's response shapes; the
response and stream builders here serve `/v1/chat/completions` too.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.server.bridge import EngineBridge, Submission, sse
from sgl_lite.server.compat import completion_body
from sgl_lite.server.openai.guided import body_constraint
from sgl_lite.server.protocol import (
    COMPLETIONS_MAX_TOKENS,
    ApiError,
    CompletionRequest,
    JsonResponse,
    parse,
    read_json,
)

# Engine field names as OpenAI clients spell them, for the `param` of an error.
_ALIASES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "text": "prompt",
    "input_ids": "prompt",
}


_COMPLETION_FIELDS = set(CompletionRequest.model_fields)


def add_openai_routes(
    app: FastAPI,
    bridge: EngineBridge,
    *,
    served_model_name: str,
    accepted_names: set[str],
    max_body_bytes: int,
) -> None:
    """Adds the /v1 routes to `app`."""
    engine = bridge.engine
    check_model = model_checker(served_model_name, accepted_names)

    def card() -> dict[str, Any]:
        return {
            "id": served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sgl_lite",
            "root": served_model_name,
            "max_model_len": engine.context_length,
        }

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JsonResponse({"object": "list", "data": [card()]})

    # NOTE: `:path`, as served names are often hub ids ("org/name")
    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> JSONResponse:
        check_model(model_id)  # the names a request's `model` may use; the card is the list's
        return JsonResponse(card())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = completion_body(await read_json(request, max_body_bytes), _COMPLETION_FIELDS)
        req = parse(CompletionRequest, body)
        check_model(req.model)
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        prompt = req.prompt
        is_ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
        constraint = body_constraint(req)
        max_tokens = COMPLETIONS_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        params = {**req.sampling_params(max_tokens), **constraint.params}
        want_logprobs = req.logprobs is not None
        with bridge.refusals({**_ALIASES, **constraint.aliases}):
            inp = GenerateInput(
                prompt=None if is_ids else prompt,
                input_ids=prompt if is_ids else None,
                sampling_params=params,
                rid=req.rid,
                return_logprob=want_logprobs,
                logprob_start_len=0 if want_logprobs and req.echo else -1,
                top_logprobs_num=req.logprobs or 0,
                return_text_in_logprobs=True,
                stream=req.stream,
                timeout=req.timeout,
                custom_logit_processor=req.custom_logit_processor,
            )
            sub = await bridge.submit(inp, overload_status=429)
        reply = _Reply("cmpl", "text_completion", served_model_name, req.n)
        echo = (
            [_prompt_text(engine, prompt, i // req.n) for i in range(len(sub.rids))]
            if (req.echo)
            else None
        )
        if req.stream:
            return await _streaming(
                sub,
                bridge,
                lambda c, s: reply.completion_chunk(c, s, echo),
                reply,
                req.stream_options and req.stream_options.include_usage,
            )
        results = await bridge.collect(sub, request)
        return JsonResponse(
            reply.body(
                [
                    {
                        "index": i,
                        "text": (echo[i] if echo else "") + r["text"],
                        "logprobs": _completion_logprobs(r["meta_info"], 0, req.echo)
                        if want_logprobs
                        else None,
                        **_finish(r["meta_info"]),
                    }
                    for i, r in enumerate(results)
                ],
                results,
            )
        )


def model_checker(served_model_name: str, accepted_names: set[str]) -> Any:
    """A check that a request's `model` names this server's model (a 404 if not)."""

    def check_model(model: str | None) -> None:
        if model is not None and model not in accepted_names:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{served_model_name}'",
                param="model",
                type="NotFoundError",
            )

    return check_model


def _prompt_text(engine: Any, prompt: Any, i: int) -> str:
    single = isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
    item = prompt if single else prompt[i]
    return item if isinstance(item, str) else engine.tokenizer.decode(item)


def _finish(meta: dict[str, Any]) -> dict[str, Any]:
    """A choice's finish fields. An output that failed its constraint's final check (a JSON
    Schema, regex or grammar) carries `constraint_violation` (the reason, as native
    `/generate` reports it in `meta_info`) beside its finish reason, so a client never takes it
    for an ordinary success."""
    reason = meta.get("finish_reason")
    if reason is None:
        return {"finish_reason": None}
    fields = {"finish_reason": reason["type"], "matched_stop": reason.get("matched")}
    if meta.get("constraint_violation") is not None:
        fields["constraint_violation"] = meta["constraint_violation"]
    return fields


def _chat_logprobs(meta: dict[str, Any], start: int) -> dict[str, Any]:
    entries = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []

    def item(logprob: float | None, text: str | None) -> dict[str, Any]:
        text = text or ""
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {
                **item(lp, text),
                "top_logprobs": [
                    item(tl, tt) for tl, _, tt in (tops[k] if k < len(tops) and tops[k] else [])
                ],
            }
            for k, (lp, _, text) in enumerate(entries)
            if k >= start
        ]
    }


def _completion_logprobs(
    meta: dict[str, Any], start: int, echo: bool, offset: int = 0
) -> dict[str, Any]:
    entries = list(meta.get("output_token_logprobs") or [])[start:]
    tops = list(meta.get("output_top_logprobs") or [])[start:]
    if echo:
        entries = list(meta.get("input_token_logprobs") or []) + entries
        tops = list(meta.get("input_top_logprobs") or []) + tops
    out: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for k, (lp, _, text) in enumerate(entries):
        text = text or ""
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        top = tops[k] if k < len(tops) else None
        out["top_logprobs"].append({t or "": v for v, _, t in top} if top else None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


class _Reply:
    """Builds one response's bodies and chunks (shared id, model, creation time)."""

    def __init__(self, prefix: str, kind: str, model: str, n: int) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model, self.n = kind, model, n
        self.created = int(time.time())
        self.sent: dict[int, str] = {}  # index -> text streamed so far
        self.logprobs_sent: dict[int, int] = {}

    def usage(self, results: list[dict]) -> dict[str, Any]:
        """OpenAI usage; each prompt counts once however many samples (n) it had."""
        metas = [r["meta_info"] for r in results if r]
        prompt = sum(m["prompt_tokens"] for m in metas[:: self.n])
        completion = sum(m["completion_tokens"] for m in metas)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {
                "cached_tokens": sum(m["cached_tokens"] for m in metas[:: self.n])
            },
        }

    def body(self, choices: list[dict], results: list[dict]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(results),
        }

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": f"{self.kind}.chunk" if self.kind.startswith("chat") else self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }

    def _delta(self, chunk: dict) -> str:
        i, text = chunk["index"], chunk["text"]
        sent = self.sent.get(i, "")
        if len(text) > len(sent):
            self.sent[i] = text
            return text[len(sent) :]
        return ""

    def _new_logprobs(self, chunk: dict) -> int:
        i = chunk["index"]
        start = self.logprobs_sent.get(i, 0)
        self.logprobs_sent[i] = len(chunk["meta_info"].get("output_token_logprobs") or [])
        return start

    def chat_chunk(self, chunk: dict, first: bool) -> dict[str, Any] | None:
        i, meta = chunk["index"], chunk["meta_info"]
        delta = self._delta(chunk)
        start = self._new_logprobs(chunk)
        finish = _finish(meta)
        if not delta and not first and finish["finish_reason"] is None:
            return None
        choice = {
            "index": i,
            "delta": {"role": "assistant", "content": delta} if first else {"content": delta},
            "logprobs": _chat_logprobs(meta, start) if "output_token_logprobs" in meta else None,
            **finish,
        }
        return self.chunk([choice])

    def completion_chunk(
        self, chunk: dict, first: bool, echo: list[str] | None
    ) -> dict[str, Any] | None:
        i, meta = chunk["index"], chunk["meta_info"]
        delta = self._delta(chunk)
        start = self._new_logprobs(chunk)
        finish = _finish(meta)
        if echo and first:
            delta = echo[i] + delta
        if not delta and finish["finish_reason"] is None:
            return None
        logprobs = (
            _completion_logprobs(
                meta, start, echo is not None and first, len(self.sent.get(i, "")) - len(delta)
            )
            if "output_token_logprobs" in meta
            else None
        )
        return self.chunk([{"index": i, "text": delta, "logprobs": logprobs, **finish}])


async def _streaming(
    sub: Submission, bridge: EngineBridge, convert: Any, reply: _Reply, include_usage: bool | None
) -> StreamingResponse:
    chunks = await bridge.open_stream(sub)

    async def events() -> AsyncIterator[str]:
        finals: list[dict] = [{}] * len(sub.rids)
        started: set[int] = set()
        async with contextlib.aclosing(chunks) as stream:
            async for chunk in stream:
                i = chunk["index"]
                if chunk["meta_info"]["finish_reason"] is not None:
                    finals[i] = chunk
                out = convert(chunk, i not in started)
                started.add(i)
                if out is not None:
                    yield sse(out)
        if include_usage:
            yield sse(reply.chunk([], reply.usage(finals)))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
