"""The OpenAPI contract: each route's request and response models, published at /openapi.json.

The routes read their bodies themselves (`protocol.read_json`, then `compat`'s field policy,
then the pydantic model), because refusing an unknown or unsupported field by name is part of
the contract and a JSON decoder error must be a 400, not a framework 422. So the request bodies
are declared here from the same pydantic models the handlers validate with, and the spec says
what every answer may be: the success body, a stream, or the one error body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, TypeAdapter

from sgl_lite.server.openai.rerank import RerankItem, RerankRequest, RerankResults
from sgl_lite.server.openai.responses_protocol import ResponsesRequest
from sgl_lite.server.openai.score import ScoreRequest, ScoreResponse
from sgl_lite.server.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from sgl_lite.server.tokenizer_api import DetokenizeRequest, TokenizeRequest


class _Out(BaseModel):
    # NOTE: answers may carry more than is declared (SGLang adds meta_info keys over time)
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorBody(_Out):
    """Every error: `{"error": {message, type, param, code}}`."""

    error: ErrorDetail


class GenerateResult(_Out):
    """One native result."""

    text: str
    output_ids: list[int] | None = None
    meta_info: dict[str, Any]


class Choice(_Out):
    index: int
    finish_reason: str | None = None


class OpenAIResponse(_Out):
    """A completion or chat completion."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: dict[str, Any] | None = None


class ResponseObject(_Out):
    """A response of `/v1/responses` (made, or stored and read back)."""

    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class DeletedResponse(_Out):
    """`DELETE /v1/responses/{response_id}`."""

    id: str
    object: str
    deleted: bool


class ModelCard(_Out):
    """One model: an entry of `GET /v1/models`, and `GET /v1/models/{model_id}`."""

    id: str
    object: str
    created: int
    owned_by: str
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Out):
    """`GET /v1/models`."""

    object: str
    data: list[ModelCard]


class Success(_Out):
    """`{"success": true, ...}` answers (flush, abort)."""

    success: bool


class Status(_Out):
    """`{"status": "ok"}`."""

    status: str


class Info(_Out):
    """Model or server information (an open set of keys)."""


class Tokens(_Out):
    """/tokenize's answer."""


class Text(_Out):
    """/detokenize's answer."""

    text: str | list[str]


class TokenizerInfo(_Out):
    """/tokenizer_info's answer (vLLM's: the tokenizer's settings, named ones declared)."""

    tokenizer_class: str
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None
    max_model_len: int


# path -> (request body model or None, 200 body type, whether stream=true answers SSE)
_GENERATE = GenerateResult | list[GenerateResult]
ROUTES: dict[str, tuple[type[BaseModel] | None, Any, bool]] = {
    "/generate": (GenerateRequest, _GENERATE, True),
    "/abort_request": (AbortRequest, Success, False),
    "/v1/completions": (CompletionRequest, OpenAIResponse, True),
    "/v1/chat/completions": (ChatCompletionRequest, OpenAIResponse, True),
    "/v1/models": (None, ModelList, False),
    "/v1/responses": (ResponsesRequest, ResponseObject, True),
    "/v1/score": (ScoreRequest, ScoreResponse, False),
    "/v1/rerank": (RerankRequest, list[RerankItem], False),
    "/v2/rerank": (RerankRequest, RerankResults, False),
    "/rerank": (RerankRequest, RerankResults, False),
    # "METHOD path" where a path's operations answer differently
    "GET /v1/responses/{response_id}": (None, ResponseObject, False),
    "DELETE /v1/responses/{response_id}": (None, DeletedResponse, False),
    "/v1/models/{model_id}": (None, ModelCard, False),
    "/flush_cache": (None, Success, False),
    "/health_generate": (None, Status, False),
    "/get_model_info": (None, Info, False),
    "/model_info": (None, Info, False),
    "/get_server_info": (None, Info, False),
    "/server_info": (None, Info, False),
    "/tokenize": (TokenizeRequest, Tokens, False),
    "/v1/tokenize": (TokenizeRequest, Tokens, False),
    "/detokenize": (DetokenizeRequest, Text, False),
    "/v1/detokenize": (DetokenizeRequest, Text, False),
    "/tokenizer_info": (None, TokenizerInfo, False),
    "/v1/tokenizer_info": (None, TokenizerInfo, False),
}
_ERRORS = {
    "400": "bad request: the field at fault is named in error.param",
    "401": "missing or wrong API key",
    "404": "unknown route, model or stored response",
    "413": "body too large",
    "429": "OpenAI routes: the queue is full; retry after Retry-After seconds",
    "503": "native routes: the queue is full, or the engine could not generate",
}
# stream=true: each server-sent event's `data` is one chunk as JSON, the last one "[DONE]"
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {"data": {"type": "string"}},
    "required": ["data"],
}
_TEXT_ROUTES = {"/metrics": "text/plain", "/health": None}


def install_openapi(
    app: FastAPI, extra_routes: dict[str, tuple[Any, Any, bool]] | None = None
) -> None:
    """Makes `app.openapi()` build the contract (once) from ROUTES and `extra_routes`."""
    routes = {**ROUTES, **(extra_routes or {})}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for path, operations in spec.get("paths", {}).items():
                for method, op in operations.items():
                    route = routes.get(f"{method.upper()} {path}", routes.get(path))
                    _describe(op, path, route, components)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _schema(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    schema = TypeAdapter(tp).json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    return schema


def _describe(
    op: dict[str, Any], path: str, route: tuple[Any, Any, bool] | None, components: dict
) -> None:
    error = {"application/json": {"schema": _schema(ErrorBody, components)}}
    responses: dict[str, Any] = {
        code: {"description": why, "content": error} for code, why in _ERRORS.items()
    }
    if path in _TEXT_ROUTES:
        kind = _TEXT_ROUTES[path]
        text = {kind: {"schema": {"type": "string"}}} if kind else None
        responses["200"] = {"description": "OK", **({"content": text} if text else {})}
    elif route is not None:
        body, answer, streams = route
        content: dict[str, Any] = {"application/json": {"schema": _schema(answer, components)}}
        if streams:
            content["text/event-stream"] = {"schema": _SSE_EVENT}
        responses["200"] = {"description": "OK", "content": content}
        if body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _schema(body, components)}},
            }
    else:
        responses["200"] = {"description": "OK", "content": {"application/json": {"schema": {}}}}
    op["responses"] = responses
