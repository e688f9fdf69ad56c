"""Engine: the in-process inference engine, with SGLang's `Engine.generate` API.

Callers on any thread submit requests with a sink for their outputs; one loop thread loads and
owns the model, the KV pool, the radix tree and the scheduler, runs `step()` (schedule → forward
→ sample → process) while work remains, publishes each request's `ReqOutput` to its sink, and
ends when idle (loop_thread; omp_threads says why an idle engine must hold no OpenMP team).
Requests submitted together land in the same batches. Bad input is rejected in the caller's
thread with an `InvalidRequest`, before anything reaches the loop. Result dicts are built on the
caller's side (`outputs.ResultBuilder`), never on the loop thread.

`Engine(model_path=None, **flags)` loads a model; `Engine(config, runner=…, tokenizer=…)`
drives any runner with `forward(segments) -> ForwardOutput`, `pool`, `vocab_size` and
`context_length` (the unit tests pass a fake one).
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from sgl_lite.backend import omp_policy
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.constrained import BudgetError, GrammarError
from sgl_lite.backend.engine.admission import Admission
from sgl_lite.backend.engine.inbox import Abort, Add, Call, Message, Stop
from sgl_lite.backend.engine.info import engine_info
from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.engine.intake import RequestBuilder
from sgl_lite.backend.engine.loop_thread import LoopThread
from sgl_lite.backend.engine.results import AsyncChannel, ResultCollector, Submission
from sgl_lite.backend.engine.setup import (
    build_config,
    configure_logging,
    eos_token_ids,
    load_model,
    prepare_loop_thread,
)
from sgl_lite.backend.errors import EngineError, InvalidRequest
from sgl_lite.backend.kvcache.cache_manager import CacheManager
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.scheduler.custom_logits import warn_if_unavailable
from sgl_lite.backend.scheduler.mask_prefetch import MaskPrefetcher, mask_failure
from sgl_lite.backend.scheduler.output_processor import OutputProcessor
from sgl_lite.backend.scheduler.sampler import Sampler
from sgl_lite.backend.scheduler.scheduler import Scheduler
from sgl_lite.backend.types import FinishReason, ForwardOutput, OutputSink, Req, ReqOutput, Segment
from sgl_lite.common.tokenizer import Tokenizer

logger = logging.getLogger("sgl_lite")


class Runner(Protocol):
    """What the engine needs of a model runner."""

    pool: KVPool
    vocab_size: int
    context_length: int

    def forward(self, segments: list[Segment]) -> ForwardOutput: ...


class Engine:
    """In-process engine: `Engine(model_path=None, **server_flags_in_snake_case)`, or
    `Engine(config, runner=..., tokenizer=...)` to drive a given runner and tokenizer."""

    def __init__(
        self,
        model_path: str | EngineConfig | None = None,
        *,
        runner: Runner | None = None,
        tokenizer: Tokenizer | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config = build_config(model_path, kwargs)
        configure_logging(config.log_level)
        if config.num_threads is not None:  # process-wide: only when asked (see EngineConfig)
            torch.set_num_threads(config.num_threads)
        self.forward_passes = 0
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._sinks: dict[str, OutputSink] = {}
        self._reqs: dict[str, Req] = {}
        self._stopped = False
        # The loop thread loads the model itself: all of the engine's tensor work then runs on
        # one thread and so in one OpenMP team (see omp_threads). A load failure comes back here.
        self._worker = LoopThread(self._loop, "sgl_lite-engine")
        self._call(lambda: self._setup(runner, tokenizer))
        logger.info(
            "sgl_lite engine: model=%s device=%s dtype=%s threads=%d kv_pool=%d tokens (%.1f MB%s) "
            "max_running_requests=%d; %s",
            self.model_folder,
            config.device,
            config.dtype,
            torch.get_num_threads(),
            self.runner.pool.num_slots,
            self.runner.pool.nbytes / 2**20,
            ", committed as used" if self.runner.pool.committed_on_use else "",
            config.max_running_requests,
            omp_policy.note(),
        )

    # --- public API ---------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        """The longest sequence (prompt + output) the model takes."""
        return self.runner.context_length

    def max_new_tokens_room(self, prompt_len: int) -> int:
        """The most new tokens a prompt of `prompt_len` tokens may ask for (context and pool)."""
        return self.builder.max_new_tokens_room(prompt_len)

    def submit(self, inp: GenerateInput, sink: OutputSink) -> Submission:
        """Validates and queues a generate call (with `inp.stream`, every step's output goes to
        `sink`, else only the last one).

        `sink` is called on the loop thread with each `ReqOutput` and must not block. Raises
        `InvalidRequest` naming the field for bad input, `QueueFull` past max_queued_requests;
        nothing is queued then. `inp.timeout` (seconds) aborts the requests still unfinished
        then.
        """
        if self._stopped:
            raise EngineError("the engine has been shut down")
        groups = self.builder.build(inp)
        reqs = [r for group in groups for r in group]
        self.admission.admit([r.rid for r in reqs], inp.timeout)
        self._post(Add(reqs, sink))
        return Submission(
            tuple(r.rid for r in reqs), tuple(tuple(r.rid for r in g) for g in groups), inp.batched
        )

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
        timeout: float | None = None,
        custom_logit_processor: str | list[str | None] | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> Any:
        """Generates for one prompt (→ dict) or a list (→ list of dicts, one per prompt × n).

        With `stream=True` returns an iterator of result dicts with the cumulative text so far
        (each with its "index" when the input was a list). `custom_logit_processor`: SGLang's
        `CustomLogitProcessor.to_str()` string (or one per prompt), which reads
        `sampling_params["custom_params"]`; the engine needs enable_custom_logit_processor=True.
        `token_ids_logprob` (with return_logprob): per output token, those ids' logprobs in
        meta_info's `output_token_ids_logprobs`. The arguments become one `GenerateInput`.
        """
        inp = GenerateInput(
            prompt=prompt,
            sampling_params=sampling_params,
            input_ids=input_ids,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            stream=stream,
            rid=rid,
            timeout=timeout,
            custom_logit_processor=custom_logit_processor,
            token_ids_logprob=token_ids_logprob,
        )
        outputs: queue.SimpleQueue[ReqOutput] = queue.SimpleQueue()
        collector = ResultCollector(self.submit(inp, outputs.put), self.abort)
        if stream:
            return collector.iterate(outputs.get)
        return collector.wait(outputs.get)

    async def async_generate(
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
        timeout: float | None = None,
        custom_logit_processor: str | list[str | None] | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> Any:
        """`generate` for asyncio code (no thread waits); with stream=True an async iterator."""
        inp = GenerateInput(
            prompt=prompt,
            sampling_params=sampling_params,
            input_ids=input_ids,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            stream=stream,
            rid=rid,
            timeout=timeout,
            custom_logit_processor=custom_logit_processor,
            token_ids_logprob=token_ids_logprob,
        )
        channel = AsyncChannel()
        # Tokenizing and validating run off the event loop; waiting for outputs costs nothing.
        sub = await asyncio.to_thread(self.submit, inp, channel.put)
        collector = ResultCollector(sub, self.abort)
        if stream:
            return collector.aiterate(channel)
        return await collector.await_all(channel)

    def abort(self, rid: str) -> None:
        """Aborts a request by id; its slots are freed and its caller gets finish_reason abort."""
        self._post(Abort(rid))

    def abort_all(self, message: str) -> int:
        """Aborts every queued and running request with `message`; returns how many."""
        return self._call(lambda: self._abort_all(FinishReason.abort(message)))

    @staticmethod
    def refused_for_constraint(error: BaseException | None) -> bool:
        """Whether a refusal (an `InvalidRequest`, or a finish reason's error) was the request's
        constraint's: the pattern itself (its field a grammar kind), or a budget its compiled
        grammar cannot fit (named `max_new_tokens`, the grammar's error as its cause:
        `_poll_grammars`). Callers count these without knowing the grammar layer's errors."""
        if getattr(error, "field", None) in ("regex", "json_schema", "ebnf"):
            return True
        return isinstance(getattr(error, "__cause__", None), GrammarError)

    def flush_cache(self) -> bool:
        """Empties the radix cache; False (and nothing done) while requests are running."""
        return self._call(lambda: not self.scheduler.has_work and self.cache.flush())

    def get_server_info(self) -> dict[str, Any]:
        """Config, pool usage and cache statistics."""
        return self._call(lambda: engine_info(self))

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
        """Stops the engine; pending requests are aborted."""
        if not self._stopped:
            self._post(Stop())
            self._worker.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` run on the loop thread; raises what it raised."""
        result: Future[Any] = Future()
        self._post(Call(fn, result))
        return result.result()

    def _post(self, message: Message) -> None:
        """Queues a message for the loop, starting its thread if the engine was idle."""
        self._inbox.put(message)
        self._worker.wake()

    # --- loop thread ------------------------------------------------------------------------
    def _setup(self, runner: Runner | None, tokenizer: Tokenizer | None) -> None:
        """Loads the model (unless given) and builds the parts that run it; on the loop thread.
        A failure stops the engine (every later request would find no model) and is raised."""
        try:
            self._load(runner, tokenizer)
        except BaseException:
            self._stopped = True
            raise

    def _load(self, runner: Runner | None, tokenizer: Tokenizer | None) -> None:
        config = self.config
        self.model_folder, runner, tokenizer = load_model(config, runner, tokenizer)
        self.tokenizer = tokenizer
        self.runner = runner
        self.cache = CacheManager(runner.pool, config.disable_radix_cache)
        eos = eos_token_ids(runner, tokenizer)
        self.sampler = Sampler(eos, runner.vocab_size, seed=config.random_seed)
        self.outputs = OutputProcessor(tokenizer, eos, jump_forward=not config.disable_jump_forward)
        self.scheduler = Scheduler(config, self.cache, self.outputs)
        self.masks = MaskPrefetcher(overlap=config.overlap_masks)
        self.builder = RequestBuilder(
            config,
            tokenizer,
            vocab_size=runner.vocab_size,
            context_length=runner.context_length,
            pool_size=runner.pool.num_slots,
        )
        self.admission = Admission(config.max_queued_requests, config.request_timeout)
        if config.enable_custom_logit_processor:
            warn_if_unavailable()

    def _loop(self) -> None:
        """Runs steps while there is work, and returns once idle (`LoopThread` restarts it)."""
        # Grad mode and the CUDA device are per thread, like the OpenMP team.
        if not prepare_loop_thread(getattr(self, "runner", None)):
            self._stopped = True  # every later thread would fail alike: stop, answering all
        idle = False
        while not self._stopped:
            # Block for new input only when the last step had nothing to run (e.g. every
            # waiting request is still compiling its grammar), so the loop never spins.
            handled = self._drain_inbox(block=idle)
            if self._stopped:
                break
            if idle and not handled and not self._reqs and self._worker.retire(self._inbox.empty):
                return  # nothing queued, compiling or running: the thread and its team end
            self._poll_grammars()
            for rid, seconds in self.admission.expired():
                if (req := self._reqs.get(rid)) is not None:
                    self._abort(req, FinishReason.abort(f"request timed out after {seconds:g} s"))
            try:
                idle = self.step() is None
            except Exception as exc:
                logger.exception("engine step failed; aborting the running requests")
                error = EngineError(f"engine error: {exc}")
                for req in list(self._reqs.values()):
                    if req.is_finished:  # ended in the failed step before it could publish
                        self._publish(req)
                    elif req in self.scheduler.running:
                        self._abort(req, FinishReason.abort(str(error), error))
        if getattr(self, "scheduler", None) is None:  # the model never loaded
            return
        # Requests submitted while stopping are answered too: nobody waits on a dead loop.
        self._drain_inbox(block=False)
        error = EngineError("engine shut down")
        self._abort_all(FinishReason.abort(str(error), error))
        self.masks.shutdown()
        self.builder.close()

    def _abort_all(self, reason: FinishReason) -> int:
        reqs = list(self._reqs.values())
        for req in reqs:
            self._abort(req, reason)
        return len(reqs)

    def _drain_inbox(self, block: bool) -> bool:
        """Handles every queued message (waiting up to 50 ms for one if `block`); True if any."""
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, message: Message) -> None:
        """Acts on one inbox message; the one place the loop reads them."""
        match message:
            case Add(reqs, sink):
                for req in reqs:
                    self._reqs[req.rid] = req
                    self._sinks[req.rid] = sink
                    self.scheduler.add(req)
            case Abort(rid):
                if (running := self._reqs.get(rid)) is not None:
                    self._abort(running, FinishReason.abort("aborted by request"))
            case Call(fn, result):
                try:
                    value = fn()
                except BaseException as exc:  # the caller raises it (a failed setup included)
                    result.set_exception(exc)
                else:
                    result.set_result(value)
            case Stop():
                self._stopped = True

    def _poll_grammars(self) -> None:
        for req, exc in self.scheduler.attach_grammars():
            # NOTE: a budget below the constraint's shortest output is known only once it has
            # compiled, and is max_new_tokens' fault; anything else is the constraint's own.
            kind = (req.sampling_params.constraint or ("regex", ""))[0]
            error = InvalidRequest(
                "max_new_tokens" if isinstance(exc, BudgetError) else kind, str(exc)
            )
            error.__cause__ = exc  # what the grammar raised (the server's metrics read it)
            self._abort(req, FinishReason.abort(str(exc), error))

    def step(self) -> list[Req] | None:
        """One scheduling step: schedule → forward → sample → process, then publish.

        Returns the requests that finished, or None when there was nothing to run.
        """
        batch = self.scheduler.schedule()
        if batch is None:
            return None
        self.admission.started(batch.reqs)
        pending = self.masks.start(batch)  # grammar masks on the worker, beside the forward
        try:
            output = self.runner.forward(batch.segments)
        finally:
            masks = pending.wait()  # the worker is idle past here: process() advances guides
        self.forward_passes += 1
        for req, exc in masks.errors.items():  # that request's error, not the whole step's
            self._abort(req, mask_failure(exc))
        samples = self.sampler.sample(batch, output, masks.masks)
        for req, sample in zip(batch.reqs, samples):
            if sample.error is not None:  # its own logit processor failed: it alone ends
                self._abort(req, FinishReason.abort(str(sample.error), sample.error))
        finished = self.scheduler.process(batch, samples)
        for req, sample in zip(batch.reqs, samples):
            if req.is_finished or (req.stream and sample.token is not None):
                self._publish(req)
        return finished

    def _abort(self, req: Req, reason: FinishReason) -> None:
        """Ends a request outside the step (abort, engine fault, failed grammar), uncached."""
        self.scheduler.abort(req)
        req.finish_reason = reason
        self.outputs.detokenizer(req).finish(req.output_ids, None)
        self._publish(req)

    def _publish(self, req: Req) -> None:
        """Hands the request's progress since its last output to its sink; never after its last."""
        if self._reqs.get(req.rid) is not req:  # its final output went out (a failed mask)
            return
        out = self.outputs.progress(req)
        final = req.finish_reason is not None
        sink = self._sinks.pop(req.rid, None) if final else self._sinks.get(req.rid)
        if final:
            self._reqs.pop(req.rid, None)
            self.admission.ended(req.rid)
        if sink is not None:
            try:
                sink(out)
            except Exception:  # a broken sink must not stop the loop; its request ends
                logger.exception("output sink of request %s failed", req.rid)
                if not final:
                    self._sinks.pop(req.rid, None)
                    self.abort(req.rid)
