"""Engine: the in-process inference engine, with SGLang's `Engine.generate` API.

Callers on any thread submit requests; one loop thread owns the model, the KV pool, the radix
tree and the scheduler, and runs `step()` (schedule → forward → sample → process) while work
remains. Requests submitted together land in the same batches. Bad input is rejected in the
caller's thread with a ValueError, before anything reaches the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch

from sgl_lite.backend.cache_manager import CacheManager
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.memory import resolve_mem_fraction
from sgl_lite.backend.model_loader import resolve_model_path
from sgl_lite.backend.model_runner import ForwardOutput, ModelRunner
from sgl_lite.backend.output_processor import OutputProcessor
from sgl_lite.backend.request import Req
from sgl_lite.backend.requests_builder import RequestBuilder
from sgl_lite.backend.sampler import Sampler
from sgl_lite.backend.scheduler import ScheduleBatch, Scheduler
from sgl_lite.backend.tokenizer_overrides import load_tokenizer_with_overrides

logger = logging.getLogger("sgl_lite")


def _configure_logging(level: str) -> None:
    """Our own logger only: the start-up line (model, device, threads, pool) shows by default."""
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False


class Engine:
    """In-process engine: `Engine(model_path=None, **server_flags_in_snake_case)`."""

    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        if "mem_fraction_static" in kwargs:  # SGLang's pool sizing, resolved before the config
            kwargs = resolve_mem_fraction({"model_path": model_path, **kwargs})
            model_path = kwargs.pop("model_path")
        self.config = EngineConfig.from_kwargs(model_path=model_path, **kwargs)
        _configure_logging(self.config.log_level)
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        torch.manual_seed(self.config.random_seed)
        folder = resolve_model_path(self.config.model_path)
        self.model_folder = folder
        self.tokenizer = load_tokenizer_with_overrides(
            folder,
            self.config.tokenizer_path,
            self.config.chat_template,
            self.config.trust_remote_code,
        )
        self.runner = ModelRunner(folder, self.config)
        self.cache = CacheManager(self.runner.pool, self.config.disable_radix_cache)
        self.scheduler = Scheduler(self.config, self.cache)
        eos = self._eos_token_ids()
        self.sampler = Sampler(eos, self.runner.vocab_size)
        self.outputs = OutputProcessor(
            self.tokenizer, eos, self.cache, jump_forward=not self.config.disable_jump_forward
        )
        self.builder = RequestBuilder(self.config, self.tokenizer, self.runner)
        self.forward_passes = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._channels: dict[str, queue.SimpleQueue] = {}
        self._reqs: dict[str, Req] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="sgl_lite-engine", daemon=True)
        self._thread.start()
        logger.info(
            "sgl_lite engine: model=%s device=%s dtype=%s threads=%d kv_pool=%d tokens (%.1f MB) "
            "max_running_requests=%d",
            folder,
            self.config.device,
            self.config.dtype,
            torch.get_num_threads(),
            self.runner.pool.num_slots,
            self.runner.pool.nbytes / 2**20,
            self.config.max_running_requests,
        )

    def _eos_token_ids(self) -> set[int]:
        ids = getattr(self.runner.hf_config, "eos_token_id", None)
        ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # --- public API ---------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | list[str] | None = None,
    ) -> Any:
        """Generates for one prompt (→ dict) or a list (→ list of dicts, one per prompt × n).

        With `stream=True` returns an iterator of result dicts with the cumulative text so far.
        """
        reqs, batched = self.builder.build(
            prompt=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            stream=stream,
            rid=rid,
        )
        channel = self._submit(reqs)
        if stream:
            return self._stream(reqs, channel, batched)
        results = self._wait_all(reqs, channel)
        return results if batched or len(results) > 1 else results[0]

    async def async_generate(self, *args: Any, **kwargs: Any) -> Any:
        """`generate` for asyncio code; with stream=True an async iterator of chunks."""
        if kwargs.get("stream"):
            return self._astream(self.generate(*args, **kwargs))
        return await asyncio.to_thread(self.generate, *args, **kwargs)

    @staticmethod
    async def _astream(chunks: Iterator[dict]) -> AsyncIterator[dict]:
        sentinel = object()
        while (chunk := await asyncio.to_thread(next, chunks, sentinel)) is not sentinel:
            yield chunk

    def abort(self, rid: str) -> None:
        """Aborts a request by id; its slots are freed and its caller gets finish_reason abort."""
        self._inbox.put(("abort", rid))

    def flush_cache(self) -> bool:
        """Empties the radix cache; False (and nothing done) while requests are running."""
        return self._call(lambda: not self.scheduler.has_work and self.cache.flush())

    def get_server_info(self) -> dict[str, Any]:
        """Config, pool usage and cache statistics."""
        return self._call(self._server_info)

    def cache_tree(self, snippet_chars: int = 60) -> dict[str, Any]:
        """The radix tree as JSON (`sgl_lite.cache_view.tree_to_dict`), copied on the loop
        thread so it is one consistent instant; decoding runs in the caller's thread."""
        from sgl_lite.cache_view import tree_to_dict

        tree = self._call(self.cache.tree.export)
        return tree_to_dict(tree, self.tokenizer.decode, snippet_chars)

    def check_integrity(self) -> None:
        """Asserts the slot invariant (free + cached + in use == total) on the loop thread."""
        self._call(lambda: self.cache.check_integrity(self.scheduler.running))

    def shutdown(self) -> None:
        """Stops the loop thread; pending requests are aborted."""
        if not self._stopped:
            self._inbox.put(("stop", None))
            self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- caller side ----------------------------------------------------------------------
    def _submit(self, reqs: list[Req]) -> queue.SimpleQueue:
        if self._stopped:
            raise RuntimeError("the engine has been shut down")
        channel: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox.put(("add", (reqs, channel)))
        return channel

    def _wait_all(self, reqs: list[Req], channel: queue.SimpleQueue) -> list[dict]:
        results: dict[str, dict] = {}
        while len(results) < len(reqs):
            rid, result, done = channel.get()
            if done:
                results[rid] = result
        return [results[r.rid] for r in reqs]

    def _stream(self, reqs: list[Req], channel: queue.SimpleQueue, batched: bool) -> Iterator[dict]:
        index = {r.rid: i for i, r in enumerate(reqs)}
        done_count = 0
        try:
            while done_count < len(reqs):
                rid, result, done = channel.get()
                done_count += done
                if batched:
                    result["index"] = index[rid]
                yield result
        finally:
            if done_count < len(reqs):  # the consumer stopped early: free what it left
                for r in reqs:
                    self.abort(r.rid)

    def _call(self, fn):
        reply: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox.put(("call", (fn, reply)))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    # --- loop thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        idle = True
        while not self._stopped:
            # Block for new input only when the last step had nothing to run (e.g. every
            # waiting request is still compiling its grammar), so the loop never spins.
            self._drain_inbox(block=idle)
            if self._stopped:
                break
            self._poll_grammars()
            try:
                idle = self.step() is None
            except Exception as exc:
                logger.exception("engine step failed; aborting the running requests")
                for req in list(self.scheduler.running):
                    self._finish(
                        req, {"type": "abort", "message": f"engine error: {exc}"}, cache=False
                    )
        for req in list(self._reqs.values()):
            self._finish(req, {"type": "abort", "message": "engine shut down"}, cache=False)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            reqs, channel = payload
            for req in reqs:
                self._reqs[req.rid] = req
                self._channels[req.rid] = channel
                self.scheduler.add(req)
        elif kind == "abort":
            req = self._reqs.get(payload)
            if req is not None:
                self._finish(req, {"type": "abort", "message": "aborted by request"}, cache=False)
        elif kind == "call":
            fn, reply = payload
            try:
                reply.put((True, fn()))
            except Exception as exc:
                reply.put((False, exc))
        elif kind == "stop":
            self._stopped = True

    def _poll_grammars(self) -> None:
        for req in list(self.scheduler.waiting):
            future = req.grammar_future
            if future is None or req.guide is not None or not future.done():
                continue
            try:
                from sgl_lite.backend.constrained import Guide

                req.guide = Guide(future.result())
            except Exception as exc:
                self._finish(
                    req, {"type": "abort", "message": str(exc), "status_code": 400}, cache=False
                )

    def step(self) -> list[Req] | None:
        """One scheduling step: schedule → forward → sample → process.

        Returns the requests that finished, or None when there was nothing to run.
        """
        batch = self.scheduler.schedule()
        if batch is None:
            return None
        output = self.runner.forward(batch.segments)
        self.forward_passes += 1
        finished = self._process(batch, output)
        self.scheduler.after_step(batch)
        return finished

    def _process(self, batch: ScheduleBatch, output: ForwardOutput) -> list[Req]:
        sampling: list[tuple[Req, int]] = []  # (request, its sampling row in output.logits)
        completes = [batch.completes(i) for i in range(len(batch.reqs))]
        for i, (req, segment) in enumerate(zip(batch.reqs, batch.segments)):
            rows = output.rows(i)
            if req.needs_input_logprobs:
                input_rows = rows if rows is None or not completes[i] else rows[:-1]
                start = segment.start + segment.logits_from
                self.outputs.record_input_logprobs(req, start, input_rows, req.top_logprobs_num)
            if completes[i]:
                if req.sampling_params.max_new_tokens == 0:
                    req.finish_reason = {"type": "length", "length": 0}
                else:
                    sampling.append((req, output.ranges[i][1] - 1))
        if sampling:
            reqs = [r for r, _ in sampling]
            rows = [row for _, row in sampling]
            last = output.logits
            if len(rows) != len(last):
                last = last.index_select(0, torch.tensor(rows, device=last.device))
            result = self.sampler.sample(last.cpu(), reqs)
            for j, req in enumerate(reqs):
                self.outputs.append_token(
                    req,
                    result.token_ids[j],
                    result.logprobs[j] if result.logprobs else None,
                    result.top_logprobs[j] if result.top_logprobs else None,
                )
        finished = []
        for req, sampled in zip(batch.reqs, completes):
            if req.finish_reason is not None:
                self._finish(req, req.finish_reason, cache=True)
                finished.append(req)
            elif req.stream and sampled:
                self._channels[req.rid].put((req.rid, self.outputs.result(req), False))
        return finished

    def _finish(self, req: Req, reason: dict, cache: bool) -> None:
        req.finish_reason = reason
        if cache:
            self.scheduler.finish(req)
        else:
            self.scheduler.remove(req)
            self.scheduler.finish(req)
        req.finished_at = time.perf_counter()
        if not cache:
            req.text = self.outputs.decode(req)
        self._reqs.pop(req.rid, None)
        channel = self._channels.pop(req.rid, None)
        if channel is not None:
            channel.put((req.rid, self.outputs.result(req), True))

    def _server_info(self) -> dict[str, Any]:
        cache, pool = self.cache, self.runner.pool
        return {
            **dataclasses.asdict(self.config),
            "model_path": str(self.model_folder),
            "context_length": self.runner.context_length,
            "num_threads": torch.get_num_threads(),
            "kv_pool_bytes": pool.nbytes,
            "pool_free_tokens": pool.num_free,
            "pool_used_tokens": pool.num_slots - pool.num_free,
            "cached_tokens": cache.tree.cached_tokens,
            "evicted_tokens": cache.tree.evictions,
            "cache_hit_tokens": cache.hit_tokens,
            "prompt_tokens_submitted": cache.submitted_tokens,
            "cache_hit_rate": cache.hit_tokens / max(cache.submitted_tokens, 1),
            "num_running_reqs": len(self.scheduler.running),
            "num_waiting_reqs": len(self.scheduler.waiting),
            "max_running_batch_seen": self.scheduler.max_running_seen,
            "preemptions": self.scheduler.preemptions,
            "forward_passes": self.forward_passes,
        }
