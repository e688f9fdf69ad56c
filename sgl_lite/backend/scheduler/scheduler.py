"""Scheduler: continuous batching over waiting and running requests.

Each step is a prefill batch (new requests' uncached suffixes and unfinished chunks, under a token
budget, plus the next token of every other running request) or, when there is nothing to
prefill, a decode batch (one token for every running request).
When slots run short it evicts cached prefixes, then preempts the newest running request.

`process(batch, samples)` is the one place a step's results land: the output processor applies
each sample to its request (tokens, grammar, text, finish), and the scheduler then cuts K/V
that jump-forward replaced, finishes and caches the requests that ended, and caches the fresh
prefixes of those that go on. The scheduler knows nothing about tensors beyond slot ids, and
nothing about text.
"""

from __future__ import annotations

import logging

import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.errors import EngineError
from sgl_lite.backend.kvcache.cache_manager import CacheManager
from sgl_lite.backend.scheduler.logprobs import InputLogprobs, TokenLogprobs
from sgl_lite.backend.scheduler.output_processor import OutputProcessor
from sgl_lite.backend.types import FinishReason, Req, ReqStatus, Sample, ScheduleBatch, Segment
from sgl_lite.common import common_prefix_len

logger = logging.getLogger("sgl_lite")
LPM_QUEUE_LIMIT = 128  # past this many waiting requests, matching them all costs more than it saves
IN_BATCH_SHARED_MIN = 32  # defer a request that would recompute this many tokens another computes


def _sequence_slice(req: Req, start: int, n: int) -> list[int]:
    """`req.fill_ids[start:start + n]` without building `fill_ids` (a copy of the prompt) when
    the slice lies in the output, as every decode step's does."""
    prompt = len(req.input_ids)
    if start >= prompt:
        return req.output_ids[start - prompt : start - prompt + n]
    return req.fill_ids[start : start + n]


class Scheduler:
    """Queues, admission, chunking, eviction and preemption."""

    def __init__(self, config: EngineConfig, cache: CacheManager, outputs: OutputProcessor) -> None:
        self.config = config
        self.cache = cache
        self.outputs = outputs
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.max_running_seen = 0
        self.preemptions = 0
        self.prompt_tokens_admitted = 0
        self.cache_hit_tokens = 0  # prompt tokens admitted with their K/V already cached
        self._arrivals = 0

    # --- queue --------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        """Queues a new request."""
        self._arrivals += 1
        req.arrival = self._arrivals
        self.waiting.append(req)

    def abort(self, req: Req) -> None:
        """Takes a request out of the queues and gives its slots back, uncached."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
            self.cache.release(req)
        req.status = ReqStatus.FINISHED

    def finish(self, req: Req) -> None:
        """A request is done: its tokens go into the radix tree and it leaves the batch."""
        if req in self.running:
            self.running.remove(req)
            self.cache.cache_finished(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    # --- one step -----------------------------------------------------------------------
    def attach_grammars(self) -> list[tuple[Req, Exception]]:
        """Gives each waiting request whose grammar has compiled its guide (budgeted by its
        max_new_tokens: see constrained/protocols.py); returns those whose compile failed, timed
        out or whose budget is too small, with the error, for the engine to abort."""
        failed = []
        for req in self.waiting:
            future = req.grammar_future
            if future is None or req.guide is not None or not future.done():
                continue
            params = req.sampling_params
            try:
                grammar = future.result()
                req.guide = grammar.new_guide(
                    max_new_tokens=params.max_new_tokens, constraint=params.constraint
                )
            except Exception as exc:
                failed.append((req, exc))
        return failed

    def schedule(self) -> ScheduleBatch | None:
        """Picks the next batch: prefill when anything needs it, otherwise decode."""
        batch = self._prefill_batch()
        if batch is None:
            batch = self._decode_batch()
        if batch is not None:
            self.max_running_seen = max(self.max_running_seen, len(self.running))
        return batch

    def _prefill_batch(self) -> ScheduleBatch | None:
        budget = self.config.chunked_prefill_size
        reqs: list[Req] = []
        segments: list[Segment] = []
        # Unfinished chunks and jump-forward extensions of running requests go first.
        for req in self.running:
            if req.remaining > 1 and budget > 0:
                segment = self._extend(req, budget)
                if segment is None:
                    break
                reqs.append(req)
                segments.append(segment)
                budget -= len(segment.token_ids)
        for req in self._ordered_waiting():
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if req.grammar_future is not None and req.guide is None:
                continue  # still compiling; the others go on
            self.cache.match(req, self._match_limit(req))
            if reqs and self._shares_uncached_prefix(req, reqs):
                self.cache.release(req)  # the prefix lands in the tree after this step
                continue
            served = self._served_logprobs(req)  # now: admitting may evict the slot it reads
            # Admit only what fits whole, with a slot left per running request for its decode,
            # so a half-admitted prompt never sits on slots it cannot complete.
            if self.cache.available() - len(self.running) < req.remaining + 1:
                self.cache.release(req)
                break
            segment = self._extend(req, budget)
            if segment is None:
                self.cache.release(req)
                break
            if served is not None:
                assert req.logprobs is not None
                req.logprobs.add_input(req.input_ids, served, self.outputs.token_text)
            req.cached_tokens = req.prefix_len
            self.cache_hit_tokens += req.prefix_len
            self.prompt_tokens_admitted += len(req.input_ids)
            self.waiting.remove(req)
            self.running.append(req)
            req.status = ReqStatus.RUNNING
            reqs.append(req)
            segments.append(segment)
            budget -= len(segment.token_ids)
        if not reqs:
            return None
        # Running requests ride along with their next token (a mixed batch): a prefill or a
        # jump-forward extension never stalls the others' decoding for a step.
        chosen = set(map(id, reqs))
        for req in self.running:
            if id(req) not in chosen and req.remaining == 1:
                segment = self._extend(req, 1)
                if segment is None:
                    break
                reqs.append(req)
                segments.append(segment)
        return ScheduleBatch(reqs, segments)

    def _decode_batch(self) -> ScheduleBatch | None:
        if not self.running:
            return None
        while self.cache.available() < len(self.running) and len(self.running) > 1:
            self._preempt(self.running[-1])
        reqs = list(self.running)
        segments = []
        for req in reqs:
            segment = self._extend(req, 1)
            assert segment is not None, "decode slots were reserved above"
            segments.append(segment)
        return ScheduleBatch(reqs, segments)

    # --- helpers ------------------------------------------------------------------------
    def _ordered_waiting(self) -> list[Req]:
        if (
            self.config.schedule_policy == "fcfs"
            or len(self.waiting) > LPM_QUEUE_LIMIT
            or self.config.disable_radix_cache
        ):
            return list(self.waiting)
        tree = self.cache.tree
        hits = {
            id(r): tree.split_prompt(r.fill_ids[: self._match_limit(r)]).hit_len
            for r in self.waiting
        }
        return sorted(self.waiting, key=lambda r: (-hits[id(r)], r.arrival))

    def _match_limit(self, req: Req) -> int:
        """How much of the sequence may come from the cache: at least one token is computed
        to get logits, and of the prompt positions whose logprobs are asked for, those past
        the entries the cache keeps beside the K/V (kvcache/logprob_store.py) are recomputed."""
        limit = req.seq_len - 1  # also for max_new_tokens=0: a pass needs one token
        if not req.needs_input_logprobs:
            return limit
        state = req.logprobs
        assert state is not None
        floor = min(limit, max(state.start_len - 1, 0))
        if state.top_k > self.cache.logprob_top_k:  # more top entries than are kept
            return floor
        # one token past the limit: its entry is served when the limit's token is computed
        ids = req.fill_ids[: limit + 1]
        return self.cache.logprob_match_limit(ids, state.start_len, floor)

    def _served_logprobs(self, req: Req) -> InputLogprobs | None:
        """The stored prompt logprobs of the positions a logprob request took from the cache
        (`start_len + 1 .. prefix_len`: the last is the first computed token's own entry)."""
        state = req.logprobs
        if not req.needs_input_logprobs or state is None:
            return None
        state.keep_top = self.cache.logprob_top_k
        first = state.start_len
        if req.prefix_len <= first:
            return None
        stored = self.cache.stored_logprobs(req.fill_ids[: req.prefix_len + 1], first)
        positions = list(range(first + 1, req.prefix_len + 1))
        return InputLogprobs(positions, TokenLogprobs(stored.chosen, stored.top), False)

    def _store_logprobs(self, req: Req, got: InputLogprobs | None) -> None:
        """Keeps the prompt logprobs a pass computed beside the K/V of their tokens; an entry
        whose token has no slot yet (the next chunk's first) waits for that chunk's pass."""
        state = req.logprobs
        if state is None or state.keep_top <= 0:
            return
        entries = state.unstored
        if got is not None and got.values.top is not None:
            entries = entries + list(zip(got.positions, got.values.chosen, got.values.top))
        ready = [e for e in entries if e[0] < req.kv_len]
        state.unstored = [e for e in entries if e[0] >= req.kv_len]
        if ready:
            slots = req.slot_ids[torch.tensor([pos for pos, _, _ in ready])]
            self.cache.store_logprobs(slots, [lp for _, lp, _ in ready], [t for _, _, t in ready])

    @staticmethod
    def _shares_uncached_prefix(req: Req, admitted: list[Req]) -> bool:
        uncached = req.fill_ids[req.kv_len :]
        return any(
            common_prefix_len(uncached, other.fill_ids, req.kv_len) >= IN_BATCH_SHARED_MIN
            for other in admitted
        )

    def _extend(self, req: Req, budget: int) -> Segment | None:
        """Allocates slots for the request's next chunk and describes it, or None if no room."""
        n = min(req.remaining, budget)
        slots = self.cache.alloc(n)
        if slots is None:
            return None
        start = req.kv_len
        req.slot_ids = torch.cat([req.slot_ids, slots])
        token_ids = _sequence_slice(req, start, n)
        completes = start + n == req.seq_len
        logits_from = n - 1 if completes else n
        if req.needs_input_logprobs:
            assert req.logprobs is not None
            logits_from = min(logits_from, max(req.logprobs.start_len - 1 - start, 0))
        # A prompt's last token, before any output: the token a repeat recomputes alone.
        prompt_end = completes and not req.output_ids and n > 1
        return Segment(
            token_ids=token_ids,
            start=start,
            kv_slots=req.slot_ids,
            logits_from=logits_from,
            last_alone=prompt_end and req.sampling_params.max_new_tokens > 0,
        )

    def _preempt(self, req: Req) -> None:
        """Frees a running request's slots and puts it back at the front of the queue."""
        self.running.remove(req)
        self.cache.release(req)
        req.status = ReqStatus.WAITING
        self.waiting.insert(0, req)
        self.preemptions += 1

    # --- results ----------------------------------------------------------------------
    def process(self, batch: ScheduleBatch, samples: list[Sample]) -> list[Req]:
        """Applies a pass's samples; returns the requests that finished."""
        finished = []
        for i, (req, segment, sample) in enumerate(zip(batch.reqs, batch.segments, samples)):
            if req.is_finished:  # ended during the step (its grammar mask failed)
                continue
            try:
                self._store_logprobs(req, sample.input_logprobs)
                cut = self.outputs.apply(req, sample, batch.completes(i))
            except Exception as exc:  # this request's fault (e.g. its grammar), not the batch's
                logger.exception("processing request %s failed; it alone is aborted", req.rid)
                self._fail(req, exc)
                finished.append(req)
                continue
            if cut is not None:
                self.cache.truncate(req, cut)
            if req.finish_reason is not None:
                self.finish(req)
                finished.append(req)
            elif len(segment.token_ids) > 1:
                # Fresh prefixes go into the tree at once, so the next step's requests (and
                # the rest of a chunked prompt) reuse them.
                self.cache.cache_unfinished(req)
        return finished

    def _fail(self, req: Req, exc: Exception) -> None:
        """Ends a request whose token could not be applied: uncached, with the error."""
        self.abort(req)
        error = EngineError(f"engine error on this request: {type(exc).__name__}: {exc}")
        req.finish_reason = FinishReason.abort(str(error), error)
        self.outputs.detokenizer(req).finish(req.output_ids, None)
