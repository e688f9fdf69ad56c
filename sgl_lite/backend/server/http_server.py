"""The HTTP server: a FastAPI app around one in-process Engine, with SGLang's native endpoints.

`create_app(engine)` builds the app; `launch_server` runs it under uvicorn. This module owns the
wire (JSON bodies, SSE, status codes, auth, body limits) and the bridge from asyncio to the
engine's blocking calls; it never touches tensors, slots or the scheduler. Every generation goes
through `EngineBridge.stream`, so a request whose client goes away is aborted and its slots freed.
The OpenAI endpoints live in `openai_api.py`; both share the bridge and the error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sgl_lite.backend.requests_builder import new_rid
from sgl_lite.backend.server.metrics import CONTENT_TYPE, ServerMetrics
from sgl_lite.backend.server.protocol import (
    AbortRequest,
    ApiError,
    GenerateRequest,
    JsonResponse,
    field_in,
    parse,
    read_json,
    validation_error,
)

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
_WORKER_THREADS = 512  # NOTE: each in-flight request parks one thread on the engine's channel


def abort_status(result: dict[str, Any]) -> int | None:
    """The HTTP status an aborted result stands for; None when it is an ordinary result."""
    reason = result["meta_info"].get("finish_reason") or {}
    if reason.get("type") != "abort":
        return None
    if "status_code" in reason:
        return int(reason["status_code"])
    message = reason.get("message") or ""
    if message == "aborted by request":  # the client's own abort: an ordinary result
        return None
    if message.startswith("engine"):  # "engine error: …", "engine shut down"
        return 500
    return 400  # the request's grammar failed to compile or timed out


# --- the engine bridge -------------------------------------------------------------------------
@dataclass(eq=False)
class Submission:
    """One accepted generate call: engine request ids in output order and the engine's stream."""

    single: bool  # one prompt with n == 1: the native answer is a dict, not a list
    client_rids: list[str]
    rids: list[str]  # prompt-major, then the n samples
    stops: list[tuple[str, ...]]  # each output's stop strings
    chunks: Iterator[dict]
    started: float


class EngineBridge:
    """Runs engine calls off the event loop and streams their chunks back into it."""

    def __init__(self, engine: Any, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.executor = ThreadPoolExecutor(_WORKER_THREADS, thread_name_prefix="sgl_lite-http")
        self.running: dict[str, list[str]] = {}  # client rid -> engine rids

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on a worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def submit(
        self,
        *,
        text: Any = None,
        input_ids: Any = None,
        sampling_params: Any = None,
        rid: Any = None,
        aliases: dict[str, str] | None = None,
        **options: Any,
    ) -> Submission:
        """Validates and queues a generate call; a 400 ApiError names the bad field."""
        if (text is None) == (input_ids is None):
            raise ApiError(400, "give exactly one of text and input_ids", param="text")
        given = text if text is not None else input_ids
        single = isinstance(text, str) or (
            input_ids is not None and bool(input_ids) and not isinstance(input_ids[0], list)
        )
        prompts = [given] if single else given
        if isinstance(rid, list) != (not single) and rid is not None:
            raise ApiError(
                400, "rid must be a string for one prompt and a list for a list", param="rid"
            )
        client_rids = (
            ([rid] if single else rid) if rid is not None else [new_rid() for _ in prompts]
        )
        clash = [r for r in client_rids if r in self.running]
        if clash or len(set(client_rids)) != len(client_rids):
            raise ApiError(400, f"rid {(clash or client_rids)[0]!r} is already in use", param="rid")
        for r in client_rids:
            self.running[r] = []
        # NOTE: the engine always sees a list, so every chunk carries its output "index"
        try:
            chunks = await self.call(
                self.engine.generate,
                **({"prompt": prompts} if text is not None else {"input_ids": prompts}),
                sampling_params=sampling_params,
                rid=list(client_rids),
                stream=True,
                **options,
            )
        except ValueError as exc:
            self._release(client_rids)
            raise ApiError(400, str(exc), param=field_in(str(exc), aliases)) from None
        except BaseException:
            self._release(client_rids)
            raise
        params = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params] * len(prompts)
        )
        rids, stops = [], []
        for r, p in zip(client_rids, params):
            n = int((p or {}).get("n") or 1)
            self.running[r] = [f"{r}-{i}" for i in range(n)] if n > 1 else [r]
            rids += self.running[r]
            stop = (p or {}).get("stop") or ()
            stops += [(stop,) if isinstance(stop, str) else tuple(stop)] * n
        return Submission(
            single and len(rids) == 1, client_rids, rids, stops, chunks, time.perf_counter()
        )

    async def stream(self, sub: Submission) -> AsyncIterator[dict]:
        """The engine's chunks (cumulative, each with "index"); leaving early aborts the rest."""
        pending = set(range(len(sub.rids)))
        first_token_seen: set[int] = set()
        try:
            while pending:
                chunk = await self.call(next, sub.chunks, None)
                if chunk is None:
                    break
                i, meta = chunk.setdefault("index", 0), chunk["meta_info"]
                if meta["completion_tokens"] and i not in first_token_seen:
                    first_token_seen.add(i)
                    self.metrics.observe_first_token(time.perf_counter() - sub.started)
                if meta["finish_reason"] is not None:
                    pending.discard(i)
                    self.metrics.observe_finished(chunk)
                elif sub.stops[i]:
                    chunk["text"] = chunk["text"][: stop_safe_len(chunk["text"], sub.stops[i])]
                yield chunk
        finally:
            for i in pending:
                self.engine.abort(sub.rids[i])
            self._release(sub.client_rids)

    async def collect(self, sub: Submission, request: Request | None = None) -> list[dict]:
        """The final results in output order; aborts them if the client disconnects first."""
        results: list[dict] = [{}] * len(sub.rids)
        watcher = asyncio.create_task(self._abort_on_disconnect(request, sub)) if request else None
        try:
            async with contextlib.aclosing(self.stream(sub)) as chunks:
                async for chunk in chunks:
                    if chunk["meta_info"]["finish_reason"] is not None:
                        results[chunk["index"]] = chunk
        finally:
            if watcher is not None:
                watcher.cancel()
        for result in results:
            if not result:
                raise ApiError(500, "the engine's stream ended before every result finished")
            if (status := abort_status(result)) is not None:
                raise ApiError(status, result["meta_info"]["finish_reason"].get("message", ""))
        return results

    async def _abort_on_disconnect(self, request: Request, sub: Submission) -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(0.5)
        for rid in sub.rids:
            self.engine.abort(rid)

    def abort(self, client_rid: str) -> bool:
        """Aborts a running request (all of its n samples) by the id its client gave."""
        rids = self.running.get(client_rid) or [client_rid]
        for rid in rids:
            self.engine.abort(rid)
        return client_rid in self.running

    def _release(self, client_rids: list[str]) -> None:
        for r in client_rids:
            self.running.pop(r, None)


def stop_safe_len(text: str, stops: tuple[str, ...]) -> int:
    """How much of a partial output can be shown: not a tail that may grow into a stop string.

    NOTE: the final text has the stop string trimmed; holding back any tail that is a prefix of a
    stop string keeps streamed text a prefix of it.
    """
    for k in range(min(len(text), max(map(len, stops)) - 1), 0, -1):
        if any(stop.startswith(text[-k:]) for stop in stops):
            return len(text) - k
    return len(text)


async def first_chunk_or_error(chunks: AsyncIterator[dict]) -> dict | None:
    """The stream's first chunk, raising its ApiError if the request failed before any output."""
    first = await anext(chunks, None)
    if first is not None and (status := abort_status(first)) is not None:
        await chunks.aclose()
        raise ApiError(status, first["meta_info"]["finish_reason"].get("message", ""))
    return first


def sse(payload: Any) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


_LOGPROB_KEYS = (
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
)


# --- the app -------------------------------------------------------------------------------------
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
) -> FastAPI:
    """A FastAPI app serving `engine` (SGLang's native API, OpenAI's /v1, /metrics)."""
    from sgl_lite.backend.server.openai_api import add_openai_routes

    app = FastAPI(
        title="sgl_lite",
        default_response_class=JsonResponse,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    metrics = ServerMetrics(engine)
    bridge = EngineBridge(engine, metrics)
    config = engine.config
    model_path = (
        config.model_path
        if config.model_path not in (None, "default")
        else str(engine.model_folder)
    )
    name = served_model_name or config.served_model_name or config.model_path or "default"
    app.state.engine, app.state.bridge, app.state.metrics = engine, bridge, metrics
    app.state.served_model_name = name

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

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
            sub = await bridge.submit(
                text="ping", sampling_params={"max_new_tokens": 1, "temperature": 0}
            )
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
                "served_model_name": name,
                "version": _version(),
                "max_body_bytes": max_body_bytes,
                "api_key_required": bool(api_key),
            }
        )

    @app.api_route("/flush_cache", methods=["GET", "POST"])
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
        req = parse(GenerateRequest, await read_json(request, max_body_bytes))
        sub = await bridge.submit(
            text=req.text,
            input_ids=req.input_ids,
            sampling_params=req.sampling_params,
            rid=req.rid,
            aliases={"prompt": "text"},
            return_logprob=req.return_logprob,
            logprob_start_len=req.logprob_start_len,
            top_logprobs_num=req.top_logprobs_num,
            return_text_in_logprobs=req.return_text_in_logprobs,
        )
        if not req.stream:
            results = await bridge.collect(sub, request)
            if sub.single:
                results[0].pop("index", None)
                return JsonResponse(results[0])
            return JsonResponse(results)
        chunks = bridge.stream(sub)
        first = await first_chunk_or_error(chunks)
        return StreamingResponse(_native_events(sub, first, chunks), media_type="text/event-stream")

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(await bridge.call(metrics.render), media_type=CONTENT_TYPE)

    add_openai_routes(
        app,
        bridge,
        served_model_name=name,
        accepted_names={"default", name, config.model_path or "default", str(engine.model_folder)},
        max_body_bytes=max_body_bytes,
    )
    routes = {getattr(r, "path", "") for r in app.routes}
    app.add_middleware(
        _Gate, api_key=api_key, max_body_bytes=max_body_bytes, metrics=metrics, routes=routes
    )
    return app


async def _native_events(
    sub: Submission, first: dict | None, chunks: AsyncIterator[dict]
) -> AsyncIterator[str]:
    """SGLang's SSE stream: cumulative text, logprob lists sliced to the entries that are new."""
    sent: dict[tuple[int, str], int] = {}
    async with contextlib.aclosing(chunks):
        pending = [first] if first is not None else []
        while True:
            chunk = pending.pop() if pending else await anext(chunks, None)
            if chunk is None:
                break
            meta = chunk["meta_info"]
            for key in _LOGPROB_KEYS:
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
