"""Typed results of the engine loop, and the one place they become SGLang's result dicts.

The loop thread publishes a `ReqOutput` per request and step: an immutable delta (new final
text, new token ids, new logprob entries) plus the counters as they stand. Consumers on other
threads fold the deltas with a `ResultBuilder` into SGLang's native dict
(`{"text", "output_ids", "meta_info"}`); nothing the loop hands out is mutated afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sgl_lite.backend.types import FinishReason, LogprobEntry, ReqOutput, TopEntries


@dataclass(frozen=True)
class Submission:
    """Accepted requests: engine ids in output order, grouped by prompt (n samples each)."""

    rids: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    batched: bool  # the caller passed a list

    @property
    def single(self) -> bool:
        """One prompt, one sample: the native answer is a dict rather than a list."""
        return not self.batched and len(self.rids) == 1


class ResultBuilder:
    """Folds one request's outputs into SGLang's native result dict (a fresh dict each time)."""

    def __init__(self) -> None:
        self.text = ""
        self.output_ids: list[int] = []
        self.logprobs: dict[str, list[Any]] | None = None
        self.last: ReqOutput | None = None

    def add(self, out: ReqOutput) -> None:
        """Applies `out` to the result so far."""
        self.text += out.text
        del self.output_ids[out.ids_start :]
        self.output_ids.extend(out.output_ids)
        if out.logprobs is not None:
            lp = out.logprobs
            if self.logprobs is None:
                self.logprobs = {"input_token_logprobs": [], "output_token_logprobs": []}
                if lp.input_top is not None:
                    self.logprobs |= {"input_top_logprobs": [], "output_top_logprobs": []}
            self._extend("input_token_logprobs", lp.input_tokens)
            self._extend("output_token_logprobs", lp.output_tokens)
            if lp.input_top is not None and lp.output_top is not None:
                self.logprobs["input_top_logprobs"].extend(map(_tops, lp.input_top))
                self.logprobs["output_top_logprobs"].extend(map(_tops, lp.output_top))
            if lp.output_token_ids is not None:
                self.logprobs.setdefault("output_token_ids_logprobs", []).extend(
                    map(_tops, lp.output_token_ids)
                )
        self.last = out

    def _extend(self, key: str, entries: tuple[LogprobEntry, ...]) -> None:
        assert self.logprobs is not None
        self.logprobs[key].extend(list(e) for e in entries)

    def result(self) -> dict[str, Any]:
        """`{"text", "output_ids", "meta_info"}` as SGLang returns it."""
        out = self.last
        assert out is not None, "no output yet"
        meta: dict[str, Any] = {
            "id": out.rid,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "finish_reason": None if out.finish_reason is None else out.finish_reason.to_dict(),
            "e2e_latency": out.e2e_latency,
            "forced_tokens": out.forced_tokens,
        }
        if out.constraint is not None:
            meta |= out.constraint
        if self.logprobs is not None:
            meta |= {k: list(v) for k, v in self.logprobs.items()}
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def _tops(entries: TopEntries) -> list[list[Any]] | None:
    return None if entries is None else [list(e) for e in entries]


class ResultCollector:
    """One submission's results, folded from its outputs in any order of arrival; a caller
    that stops listening early aborts what is left through `abort`."""

    def __init__(self, submission: Submission, abort: Callable[[str], None]) -> None:
        self.submission = submission
        self.abort = abort
        self.index = {rid: i for i, rid in enumerate(submission.rids)}
        self.builders = [ResultBuilder() for _ in submission.rids]
        self.reasons: list[FinishReason | None] = [None] * len(submission.rids)
        self.pending = len(submission.rids)

    def add(self, out: ReqOutput) -> tuple[int, dict[str, Any]]:
        """Folds `out` in; returns (its index in the submission, its result so far)."""
        i = self.index[out.rid]
        self.builders[i].add(out)
        if out.finish_reason is not None and self.reasons[i] is None:
            self.reasons[i] = out.finish_reason
            self.pending -= 1
        return i, self.builders[i].result()

    @property
    def done(self) -> bool:
        """Whether every request has finished."""
        return self.pending == 0

    def abort_unfinished(self) -> None:
        """Aborts the requests still running (the caller went away)."""
        for rid, reason in zip(self.submission.rids, self.reasons):
            if reason is None:
                self.abort(rid)

    def results(self) -> Any:
        """The final results: a dict for one prompt given alone, else a list in order."""
        results = [b.result() for b in self.builders]
        return results if self.submission.batched or len(results) > 1 else results[0]

    # --- the ways to wait (sync and asyncio), all the same fold -------------------------------
    def wait(self, get: Callable[[], ReqOutput]) -> Any:
        """Blocks on `get` until every request finished; the final results."""
        try:
            while not self.done:
                self.add(get())
        finally:
            self.abort_unfinished()
        return self.results()

    def iterate(self, get: Callable[[], ReqOutput]) -> Iterator[dict[str, Any]]:
        """Each output's result so far (with "index" for a list input), until all finished."""
        try:
            while not self.done:
                yield self._chunk(*self.add(get()))
        finally:
            self.abort_unfinished()

    async def await_all(self, channel: AsyncChannel) -> Any:
        """`wait` for asyncio code."""
        try:
            while not self.done:
                self.add(await channel.get())
        finally:
            self.abort_unfinished()
        return self.results()

    async def aiterate(self, channel: AsyncChannel) -> AsyncIterator[dict[str, Any]]:
        """`iterate` for asyncio code."""
        try:
            while not self.done:
                yield self._chunk(*self.add(await channel.get()))
        finally:
            self.abort_unfinished()

    def _chunk(self, i: int, result: dict[str, Any]) -> dict[str, Any]:
        if self.submission.batched:
            result["index"] = i
        return result


class AsyncChannel:
    """Outputs for asyncio code: the loop thread feeds an `asyncio.Queue` through
    `call_soon_threadsafe`, so waiting costs no thread. Build it on the event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[ReqOutput] = asyncio.Queue()

    def put(self, out: ReqOutput) -> None:
        """The sink (any thread)."""
        # NOTE: a closed event loop has no listener left; the output is dropped.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, out)

    async def get(self) -> ReqOutput:
        """The next output."""
        return await self._queue.get()
