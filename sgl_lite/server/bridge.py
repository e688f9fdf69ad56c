"""EngineBridge: from asyncio to the engine, shared by both protocols.

Every generation of the HTTP server is one `GenerateInput`, built by its route inside
`EngineBridge.refusals` (an engine refusal becomes a 400 in the route's spelling) and queued by
`EngineBridge.submit`; its results come back through `stream`. The engine's loop thread feeds
each submission's `AsyncChannel` (an asyncio.Queue, through `call_soon_threadsafe`), so a
waiting request costs no thread. A stream the client leaves is closed by Starlette, and closing
it aborts what is left; a plain request aborts when the client's disconnect message arrives.
The text that arrives is final (the engine's detokenizer holds back what may still become a
stop string), so nothing is held back here.

Also the small wire helpers both route modules use (SSE framing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.engine.intake import new_rid
from sgl_lite.backend.engine.results import AsyncChannel, ResultCollector
from sgl_lite.backend.engine.results import Submission as EngineSubmission
from sgl_lite.backend.errors import InvalidRequest, QueueFull
from sgl_lite.backend.types import FinishReason
from sgl_lite.server.metrics import ServerMetrics
from sgl_lite.server.protocol import ApiError, error_for, failure_of


@dataclass(eq=False)
class Submission:
    """One accepted generate call: its engine submission and the channel its outputs use."""

    engine: EngineSubmission
    client_rids: list[str]
    channel: AsyncChannel
    collector: ResultCollector
    batched: bool  # the client sent a list
    started: float = field(default_factory=time.perf_counter)  # arrival, before tokenizing

    @property
    def single(self) -> bool:
        """One prompt with n == 1: the native answer is a dict, not a list."""
        return not self.batched and len(self.engine.rids) == 1

    @property
    def rids(self) -> tuple[str, ...]:
        """Engine request ids in output order (prompt-major, then the n samples)."""
        return self.engine.rids


class EngineBridge:
    """Submits generate calls and streams their results back into the event loop."""

    def __init__(self, engine: Any, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.running: dict[str, tuple[str, ...]] = {}  # client rid -> engine rids

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` off the event loop (short blocking engine calls)."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    @contextlib.contextmanager
    def refusals(self, aliases: dict[str, str] | None = None) -> Iterator[None]:
        """Turns an `InvalidRequest` raised inside (building a `GenerateInput`, submitting it)
        into the 400 `ApiError` naming the field in the client's spelling (`aliases`: engine
        name -> the route's), counted in the metrics."""
        try:
            yield
        except InvalidRequest as exc:
            self.metrics.observe_invalid(exc)
            raise error_for(exc, aliases) from None

    async def submit(self, inp: GenerateInput, *, overload_status: int = 503) -> Submission:
        """Queues a generate call (run it inside `refusals`: an InvalidRequest is raised as
        is); a full queue answers `overload_status` (503 native, 429 OpenAI) with Retry-After,
        a client rid already running a 400."""
        client_rids = [r if r is not None else new_rid() for r in inp.rids]
        clash = [r for r in client_rids if r in self.running]
        if clash or len(set(client_rids)) != len(client_rids):
            raise ApiError(400, f"rid {(clash or client_rids)[0]!r} is already in use", param="rid")
        for r in client_rids:
            self.running[r] = ()
        channel = AsyncChannel()
        started = time.perf_counter()
        # NOTE: the engine always sees a list, so every result carries its output "index"; every
        # step is streamed to the channel, whatever the client asked of the answer
        try:
            sub = await self.call(
                self.engine.submit, inp.as_batch(client_rids, stream=True), channel.put
            )
        except QueueFull as exc:
            self._release(client_rids)
            self.metrics.observe_rejected()
            headers = {"Retry-After": str(exc.retry_after)}
            raise ApiError(overload_status, str(exc), headers=headers) from None
        except BaseException:
            self._release(client_rids)
            raise
        for r, group in zip(client_rids, sub.groups):
            self.running[r] = group
        collector = ResultCollector(sub, self.engine.abort)
        return Submission(sub, client_rids, channel, collector, inp.batched, started)

    async def stream(self, sub: Submission) -> AsyncGenerator[dict, None]:
        """Each output's result so far (cumulative, with "index"); leaving early aborts the
        rest."""
        tracker = self.metrics.track(sub.started, len(sub.rids))
        try:
            while not sub.collector.done:
                i, chunk = sub.collector.add(await sub.channel.get())
                chunk["index"] = i
                tracker.output(i, chunk["meta_info"], sub.collector.reasons[i])
                yield chunk
        finally:
            sub.collector.abort_unfinished()
            self._release(sub.client_rids)

    async def open_stream(self, sub: Submission) -> AsyncGenerator[dict, None]:
        """`stream`, after its first result: raises that result's ApiError if the request
        failed before any output (so the client gets a status, not an SSE error)."""
        chunks = self.stream(sub)
        first = await anext(chunks, None)
        if first is not None and (error := self._failure(sub, first)) is not None:
            await chunks.aclose()
            raise error
        return _with_first(first, chunks)

    async def collect(self, sub: Submission, request: Request | None = None) -> list[dict]:
        """The final results in output order; aborts them if the client disconnects first."""
        results: list[dict] = [{}] * len(sub.rids)
        watcher = asyncio.create_task(_abort_on_disconnect(request, sub)) if request else None
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
            if (error := self._failure(sub, result)) is not None:
                raise error
        return results

    @staticmethod
    def _failure(sub: Submission, chunk: dict) -> ApiError | None:
        reason: FinishReason | None = sub.collector.reasons[chunk["index"]]
        return failure_of(reason)

    def abort(self, client_rid: str) -> bool:
        """Aborts a running request (all of its n samples) by the id its client gave."""
        for rid in self.running.get(client_rid) or (client_rid,):
            self.engine.abort(rid)
        return client_rid in self.running

    def _release(self, client_rids: list[str]) -> None:
        for r in client_rids:
            self.running.pop(r, None)


async def _abort_on_disconnect(request: Request, sub: Submission) -> None:
    """Waits (no polling) for the client's disconnect message, then aborts the submission.

    NOTE: the body has been read in full, so the next ASGI message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    sub.collector.abort_unfinished()


async def _with_first(
    first: dict | None, chunks: AsyncGenerator[dict, None]
) -> AsyncGenerator[dict, None]:
    """The chunk `open_stream` already took, then the rest; closes `chunks` at the end or when
    the consumer goes away (which aborts what is left)."""
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
