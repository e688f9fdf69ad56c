"""The HTTP server: a FastAPI app around one in-process Engine, with SGLang's native endpoints.

`create_app(engine)` builds the app; `launch_server` runs it under uvicorn. This module owns the
wire (JSON bodies, SSE, status codes, auth, body limits) and the bridge from asyncio to the
engine's blocking calls (`bridge.py`); it never touches tensors, slots or the scheduler. The
OpenAI endpoints live in `openai/completions.py` and `openai/chat.py` (SGLang's /v1/score in
`openai/score.py`, /v1/rerank in `openai/rerank.py`), /tokenize, /detokenize and
/tokenizer_info in `tokenizer_api.py`; all share the bridge and the error body. `compat.py`
decides which foreign request fields are honoured.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.server.bridge import LOGPROB_KEYS, EngineBridge, Submission, sse
from sgl_lite.server.compat import generate_body, sglang05_meta
from sgl_lite.server.metrics import CONTENT_TYPE, ServerMetrics
from sgl_lite.server.openai.chat import add_chat_routes
from sgl_lite.server.openai.completions import add_openai_routes
from sgl_lite.server.openai.rerank import add_rerank_routes
from sgl_lite.server.openai.responses import DEFAULT_STORE_SIZE, add_responses_routes
from sgl_lite.server.openai.score import add_score_routes
from sgl_lite.server.openapi import install_openapi
from sgl_lite.server.protocol import (
    DEFAULT_MAX_TOKENS,
    AbortRequest,
    ApiError,
    GenerateRequest,
    JsonResponse,
    error_for,
    parse,
    read_json,
    validation_error,
)
from sgl_lite.server.tokenizer_api import add_tokenizer_routes

DEFAULT_MAX_BODY_BYTES = 32 * 2**20


class _Gate:
    """ASGI middleware: API-key check (all but /health), Content-Length limit, HTTP counts."""

    def __init__(
        self,
        app: Any,
        *,
        api_key: str | None,
        max_body_bytes: int,
        metrics: ServerMetrics,
        routes: set[str],
    ) -> None:
        self.app, self.api_key, self.limit = app, api_key, max_body_bytes
        self.metrics, self.routes = metrics, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in self.routes else "other"
        headers = dict(scope["headers"])
        error = None
        if self.api_key and path != "/health":
            auth = headers.get(b"authorization", b"").decode("latin-1")
            if not secrets.compare_digest(auth.encode(), f"Bearer {self.api_key}".encode()):
                error = ApiError(
                    401, "missing or invalid API key: send 'Authorization: Bearer <key>'"
                )
        length = headers.get(b"content-length", b"")
        if error is None and length.isdigit() and int(length) > self.limit:
            error = ApiError(
                413, f"request body of {int(length)} bytes exceeds the {self.limit}-byte limit"
            )
        if error is not None:
            self.metrics.observe_http(route, error.status)
            return await error.response()(scope, receive, send)

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.metrics.observe_http(route, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(
    engine: Any,
    *,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_stored_responses: int = DEFAULT_STORE_SIZE,
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
) -> FastAPI:
    """A FastAPI app serving `engine` (SGLang's native API, OpenAI's /v1, /metrics).

    `default_max_tokens` bounds a chat or Responses body that names no budget (None: the whole
    room the context leaves, SGLang's and vLLM's default)."""

    app = FastAPI(
        title="sgl_lite",
        default_response_class=JsonResponse,
        version=_version(),
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    config = engine.config
    model_path = (
        config.model_path
        if config.model_path not in (None, "default")
        else str(engine.model_folder)
    )
    name = served_model_name or config.served_model_name or config.model_path or "default"
    metrics = ServerMetrics(engine, model_name=name)
    bridge = EngineBridge(engine, metrics)
    app.state.engine, app.state.bridge, app.state.metrics = engine, bridge, metrics
    app.state.served_model_name = name

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(InvalidRequest)
    async def _refused(request: Request, exc: InvalidRequest) -> JSONResponse:
        # NOTE: routes build their GenerateInput inside `bridge.refusals`, which answers in the
        # route's spelling; this only keeps a refusal from anywhere else a 400
        return error_for(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return ApiError(500, f"{type(exc).__name__}: {exc}").response()

    # --- native endpoints --------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        try:
            with bridge.refusals():
                ping = GenerateInput(
                    prompt="ping", sampling_params={"max_new_tokens": 1, "temperature": 0}
                )
                sub = await bridge.submit(ping)
            await asyncio.wait_for(bridge.collect(sub), timeout=60)
        except (ApiError, asyncio.TimeoutError) as exc:
            raise ApiError(503, f"the engine did not generate: {exc}") from None
        return JsonResponse({"status": "ok"})

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> JSONResponse:
        return JsonResponse(
            {
                "model_path": model_path,
                "tokenizer_path": str(engine.model_folder),
                "is_generation": True,
                "served_model_name": name,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> JSONResponse:
        info = await bridge.call(engine.get_server_info)
        return JsonResponse(
            {
                **info,
                # SGLang's per-scheduler states (one scheduler here); its bench_serving reads
                # the speculative accept length from the first, None without speculation.
                "internal_states": [
                    {
                        "avg_spec_accept_length": None,
                        "num_running_reqs": info["num_running_reqs"],
                        "num_waiting_reqs": info["num_waiting_reqs"],
                        "cache_hit_rate": info["cache_hit_rate"],
                    }
                ],
                "served_model_name": name,
                "version": _version(),
                "max_body_bytes": max_body_bytes,
                "api_key_required": bool(api_key),
            }
        )

    @app.get("/flush_cache")
    @app.post("/flush_cache")
    async def flush_cache() -> JSONResponse:
        if await bridge.call(engine.flush_cache):
            return JsonResponse({"success": True, "message": "Cache flushed."})
        raise ApiError(400, "cache not flushed: requests are running or waiting; retry when idle")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> JSONResponse:
        req = parse(AbortRequest, await read_json(request, max_body_bytes))
        return JsonResponse({"success": True, "running": bridge.abort(req.rid)})

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        req = parse(GenerateRequest, generate_body(await read_json(request, max_body_bytes)))
        with bridge.refusals({"prompt": "text"}):
            sub = await bridge.submit(req.to_input())
        if not req.stream:
            results = [sglang05_meta(r) for r in await bridge.collect(sub, request)]
            if sub.single:
                results[0].pop("index", None)
                return JsonResponse(results[0])
            return JsonResponse(results)
        chunks = await bridge.open_stream(sub)
        return StreamingResponse(_native_events(sub, chunks), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    @app.post("/encode")
    async def embeddings() -> JSONResponse:
        # SGLang serves these for --is-embedding models; the 404 says what to use instead
        raise ApiError(
            404,
            "embeddings are not served: sgl_lite runs generation models (--is-embedding "
            "included); rank documents with POST /v1/rerank, score next tokens with POST "
            "/v1/score, get token ids from POST /tokenize",
        )

    @app.get("/cache_tree")
    async def cache_tree(snippet_chars: int = 60) -> JSONResponse:
        if not 1 <= snippet_chars <= 10_000:
            raise ApiError(400, "snippet_chars must be in [1, 10000]", param="snippet_chars")
        return JsonResponse(await bridge.call(engine.cache_tree, snippet_chars))

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(await bridge.call(metrics.render), media_type=CONTENT_TYPE)

    accepted_names = {"default", name, config.model_path or "default", str(engine.model_folder)}
    for add_routes in (add_openai_routes, add_score_routes, add_rerank_routes):
        add_routes(
            app,
            bridge,
            served_model_name=name,
            accepted_names=accepted_names,
            max_body_bytes=max_body_bytes,
        )
    add_chat_routes(
        app,
        bridge,
        served_model_name=name,
        accepted_names=accepted_names,
        max_body_bytes=max_body_bytes,
        default_max_tokens=default_max_tokens,
    )
    add_responses_routes(
        app,
        bridge,
        served_model_name=name,
        accepted_names=accepted_names,
        max_body_bytes=max_body_bytes,
        store_size=max_stored_responses,
        default_max_tokens=default_max_tokens,
    )
    add_tokenizer_routes(app, bridge, max_body_bytes=max_body_bytes)
    install_openapi(app)
    routes = {getattr(r, "path", "") for r in app.routes}
    app.add_middleware(
        _Gate, api_key=api_key, max_body_bytes=max_body_bytes, metrics=metrics, routes=routes
    )
    return app


async def _native_events(sub: Submission, chunks: AsyncGenerator[dict, None]) -> AsyncIterator[str]:
    """SGLang's SSE stream: cumulative text, logprob lists sliced to the entries that are new."""
    sent: dict[tuple[int, str], int] = {}
    async with contextlib.aclosing(chunks) as stream:
        async for chunk in stream:
            meta = sglang05_meta(chunk)["meta_info"]
            for key in LOGPROB_KEYS:
                if key in meta:
                    entries = list(meta[key])
                    start = sent.get((chunk["index"], key), 0)
                    meta[key] = entries[start:]
                    sent[(chunk["index"], key)] = len(entries)
            if sub.single:
                chunk.pop("index", None)
            yield sse(chunk)
    yield "data: [DONE]\n\n"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sgl_lite")
    except Exception:
        return "0.0.0"
