"""MaskPrefetcher without a model: one computation per guide per step, on one worker thread
that runs its tensor ops on one OpenMP thread, errors kept per request, the engine switch."""

from __future__ import annotations

import threading

import pytest
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler.mask_prefetch import WORKER_NAME, MaskPrefetcher
from sgl_lite.backend.types import Req, ScheduleBatch, Segment
from sgl_lite.server_args import build_parser, engine_kwargs
from tests.support.fakes import ByteTokenizer, FakeRunner


class CountingGuide:
    """allowed_mask() records its thread and the torch thread count there; may raise."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail
        self.release = threading.Event()
        self.release.set()

    def allowed_mask(self) -> torch.Tensor:
        self.release.wait(5)
        self.calls.append((threading.current_thread().name, torch.get_num_threads()))
        if self.fail:
            raise ValueError("bad state")
        return torch.ones(8, dtype=torch.bool)


def batch_of(*guides, prefill_last: bool = False) -> ScheduleBatch:
    reqs, segments = [], []
    for i, guide in enumerate(guides):
        req = Req(rid=str(i), input_ids=[1, 2, 3], sampling_params=SamplingParams())
        req.guide = guide  # type: ignore[assignment]
        req.slot_ids = torch.arange(3)
        reqs.append(req)
        # the last request's segment ends before its prompt does: it samples nothing
        end = 2 if prefill_last and i == len(guides) - 1 else 3
        segments.append(
            Segment(token_ids=[1, 2, 3][:end], start=0, kv_slots=req.slot_ids, logits_from=end - 1)
        )
    return ScheduleBatch(reqs, segments)


@pytest.mark.parametrize("overlap", [True, False])
def test_one_mask_per_sampling_guide_and_errors_per_request(overlap: bool) -> None:
    ok, bad, chunk = CountingGuide(), CountingGuide(fail=True), CountingGuide()
    prefetcher = MaskPrefetcher(overlap=overlap)
    batch = batch_of(ok, None, bad, chunk, prefill_last=True)
    threads = torch.get_num_threads()
    pending = prefetcher.start(batch)
    assert prefetcher.in_flight is overlap
    results = pending.wait()
    assert not prefetcher.in_flight
    assert set(results.masks) == {batch.reqs[0]} and set(results.errors) == {batch.reqs[2]}
    assert isinstance(results.errors[batch.reqs[2]], ValueError)
    assert len(ok.calls) == len(bad.calls) == 1 and chunk.calls == []
    name, worker_threads = ok.calls[0]
    assert name.startswith(WORKER_NAME) is overlap
    if overlap:
        assert worker_threads == 1  # the worker's own OpenMP count, not a second team
    assert torch.get_num_threads() == threads  # the process-wide count is untouched
    prefetcher.shutdown()


def test_the_worker_runs_while_the_caller_works_and_steps_never_overlap() -> None:
    guide = CountingGuide()
    guide.release.clear()
    prefetcher = MaskPrefetcher(overlap=True)
    pending = prefetcher.start(batch_of(guide))
    with pytest.raises(RuntimeError, match="never waited for"):
        prefetcher.start(batch_of(CountingGuide()))
    assert guide.calls == []  # still blocked: the caller (the forward) is not waiting on it
    guide.release.set()
    assert len(pending.wait().masks) == 1
    prefetcher.start(batch_of(CountingGuide())).wait()
    prefetcher.shutdown()


def test_overlap_is_the_default_and_switchable() -> None:
    assert EngineConfig().overlap_masks is True
    parser = build_parser()
    assert "overlap_masks" not in engine_kwargs(parser.parse_args([]))
    assert engine_kwargs(parser.parse_args(["--disable-overlap-masks"]))["overlap_masks"] is False
    config = EngineConfig(overlap_masks=False)
    with Engine(config, runner=FakeRunner(), tokenizer=ByteTokenizer()) as engine:
        assert engine.masks.overlap is False
        out = engine.generate("ab", {"max_new_tokens": 3, "temperature": 0})
        assert len(out["output_ids"]) == 3
