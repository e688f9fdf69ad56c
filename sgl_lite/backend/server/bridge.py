"""EngineBridge: from asyncio to the engine's blocking calls, shared by both protocols.

Every generation of the HTTP server goes through `EngineBridge.stream`, so a request whose
client goes away is aborted and its slots freed. Also the small wire helpers both route modules
use (SSE framing, holding back a tail that may become a stop string, abort → HTTP status).
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from sgl_lite.backend.requests_builder import new_rid
from sgl_lite.backend.server.metrics import ServerMetrics
from sgl_lite.backend.server.protocol import (
    ApiError,
    field_in,
)

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


async def with_first(first: dict | None, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """The chunk `first_chunk_or_error` already took, then the rest; closes `chunks` at the end
    or when the consumer goes away (which aborts what is left)."""
    async with contextlib.aclosing(chunks):
        if first is not None:
            yield first
        async for chunk in chunks:
            yield chunk


def sse(payload: Any) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


LOGPROB_KEYS = (
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
)


# --- the app -------------------------------------------------------------------------------------
