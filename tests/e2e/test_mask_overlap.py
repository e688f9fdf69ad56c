"""Grammar masks computed beside the forward pass (backend/scheduler/mask_prefetch.py) on SmolLM2.

Greedy outputs are identical with the overlap on and off, for constrained requests of every
backend (outlines-core, llguidance, xgrammar) batched with unconstrained ones; with it on, each
guide's mask is computed once per sampled token, on the worker thread. A request aborted while
its step runs leaves nothing in flight and no slot behind; a guide whose mask raises ends that
request alone, with the error, and the others finish as if it had not been there.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from sgl_lite.backend.constrained import AutomatonGuide
from sgl_lite.backend.constrained.matchers.grammar_guide import BackendGuide
from sgl_lite.backend.engine import Engine
from sgl_lite.backend.scheduler.mask_prefetch import WORKER_NAME, MaskPrefetcher
from tests.support import NUM_THREADS

PRODUCT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "price": {"type": "integer", "minimum": 1, "maximum": 999},
    },
    "required": ["name", "price"],
}
ARITHMETIC = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9]{1,3}
"""


def batch(ebnf_too: bool) -> tuple[list[str], list[dict]]:
    """Constrained requests of each kind between unconstrained ones, all greedy."""
    greedy = {"temperature": 0, "max_new_tokens": 40}
    jobs = [
        ("A product as JSON:", {"json_schema": json.dumps(PRODUCT)}),
        ("The weather today is", {"max_new_tokens": 12}),
        ("A phone number:", {"regex": r"\d{3}-\d{4}"}),
        ("Any JSON object about a cat:", {"json_schema": json.dumps({"type": "object"})}),
        ("Once upon a time", {"max_new_tokens": 20}),
    ]
    if ebnf_too:
        jobs.append(("A sum that equals 12:", {"ebnf": ARITHMETIC}))
    return [p for p, _ in jobs], [greedy | extra for _, extra in jobs]


def set_overlap(engine: Engine, overlap: bool) -> None:
    """Swaps the engine's prefetcher on its loop thread, between steps."""

    def swap() -> None:
        engine.masks.shutdown()
        engine.masks = MaskPrefetcher(overlap=overlap)

    engine._call(swap)


@pytest.fixture(scope="module", params=["auto", "xgrammar"])
def engine(request) -> Iterator[Engine]:
    """`auto` routes regexes to outlines-core and schemas and EBNF to llguidance (its routing
    table); `xgrammar` takes them all. float32: the tests compare greedy
    outputs across runs and batches, which are identical in float32 only."""
    eng = Engine(
        num_threads=NUM_THREADS,
        max_total_tokens=4096,
        grammar_backend=request.param,
        dtype="float32",
        quantization="none",
    )
    assert eng.masks.overlap  # the default
    yield eng
    eng.shutdown()


@pytest.fixture
def mask_calls(monkeypatch) -> list[tuple[object, str]]:
    """(guide's constraint, thread name) of every allowed_mask() call, on every backend."""
    calls: list[tuple[object, str]] = []
    for cls in (AutomatonGuide, BackendGuide):
        original = cls.allowed_mask

        def recorded(self, _original=original):
            calls.append((self.constraint, threading.current_thread().name))
            return _original(self)

        monkeypatch.setattr(cls, "allowed_mask", recorded)
    return calls


def test_greedy_outputs_identical_with_overlap_on_and_off(engine, mask_calls) -> None:
    prompts, params = batch(ebnf_too=True)
    runs = {}
    for overlap in (False, True, False):
        set_overlap(engine, overlap)
        mask_calls.clear()
        engine.flush_cache()
        outs = engine.generate(prompts, params)
        workers = [c for c in mask_calls if c[1].startswith(WORKER_NAME)]
        runs.setdefault(overlap, []).append([(o["text"], o["output_ids"]) for o in outs])
        assert bool(workers) is overlap, "masks are computed on the worker exactly when on"
        if overlap:
            # one worker computation per guide per sampled token (jump-forward adds the rest);
            # outputs the length limit cut may have lost forced tokens, so only stopped ones
            per_guide = Counter(constraint for constraint, _ in workers)
            for o, p in zip(outs, params):
                kind = next((k for k in ("regex", "json_schema", "ebnf") if k in p), None)
                if kind is None or o["meta_info"]["finish_reason"]["type"] != "stop":
                    continue
                meta = o["meta_info"]
                assert (
                    per_guide[(kind, p[kind])] == meta["completion_tokens"] - meta["forced_tokens"]
                ), (kind, o)
        for o, p in zip(outs, params):
            if "json_schema" in p:
                assert o["meta_info"]["constraint_violation"] is None, o
    assert runs[True][0] == runs[False][0] == runs[False][1]
    engine.check_integrity()


def test_abort_while_its_step_runs_leaves_nothing_in_flight(engine) -> None:
    set_overlap(engine, True)
    forward = engine.runner.forward
    in_forward = threading.Event()

    def slow_forward(segments):
        in_forward.set()
        time.sleep(0.05)  # a window for the abort to land while the step runs
        return forward(segments)

    engine.runner.forward = slow_forward
    try:
        params = {"temperature": 0, "max_new_tokens": 200, "regex": "[a-z ]+"}
        stream = engine.generate("Spell a long word:", params, stream=True, rid="abort-me")
        first = next(stream)
        assert first["meta_info"]["finish_reason"] is None
        in_forward.clear()
        assert in_forward.wait(5)
        engine.abort("abort-me")
        last = list(stream)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        engine.runner.forward = forward
    assert engine._call(lambda: engine.masks.in_flight) is False
    engine.check_integrity()
    prompts, params = batch(ebnf_too=False)
    outs = engine.generate(prompts, params)  # the engine keeps serving
    assert all(o["meta_info"]["finish_reason"]["type"] != "abort" for o in outs)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_mask_that_raises_ends_only_its_request(engine, monkeypatch, overlap) -> None:
    set_overlap(engine, overlap)
    prompts, params = batch(ebnf_too=False)
    engine.flush_cache()
    expected = engine.generate(prompts, params)
    bad = r"[0-9]{2}-[0-9]{2}-boom"
    for cls in (AutomatonGuide, BackendGuide):
        original = cls.allowed_mask

        def failing(self, _original=original):
            if self.constraint == ("regex", bad) and self.num_advanced >= 2:
                raise RuntimeError("mask exploded")
            return _original(self)

        monkeypatch.setattr(cls, "allowed_mask", failing)
    engine.flush_cache()
    outs = engine.generate(
        [*prompts, "A date:"], [*params, {"temperature": 0, "max_new_tokens": 30, "regex": bad}]
    )
    reason = outs[-1]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "mask exploded" in reason["message"], reason
    assert len(outs[-1]["output_ids"]) >= 2  # jump-forward may have added the "-"
    got = [(o["text"], o["output_ids"]) for o in outs[:-1]]
    assert got == [(o["text"], o["output_ids"]) for o in expected]
    assert engine._call(lambda: engine.masks.in_flight) is False
    engine.check_integrity()
