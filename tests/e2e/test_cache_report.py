"""ProgramState.cache_report() and run_batch's hit-rate bar, against the steps' own meta_info."""

from __future__ import annotations

import re

import pytest

import sgl_lite as sgl
from sgl_lite.cache_view import CacheReport, CacheStep
from sgl_lite.frontend.backends.engine import EngineBackend


@sgl.function
def quiz(s, question):
    s += sgl.system("You are a terse quiz master.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=3, temperature=0))
    s += sgl.user("Is that right? Answer yes or no.")
    s += sgl.assistant(sgl.select("verdict", choices=["yes", "no"]))
    s += sgl.gen(max_tokens=2, temperature=0)  # an unnamed step is reported too


@pytest.fixture()
def backend(idle_engine):
    """The frontend's engine backend on the flushed engine (left whole: tests/e2e/conftest.py)."""
    return EngineBackend(engine=idle_engine)


def test_cache_report_lists_each_step_with_its_meta_info_numbers(backend) -> None:
    cold = quiz.run(question="What is the capital of Italy?", backend=backend)
    warm = quiz.run(question="What is the capital of Italy?", backend=backend)
    for state in (cold, warm):
        assert state.error() is None
        report = state.cache_report()
        assert [(s.kind, s.name) for s in report.steps] == [
            ("gen", "answer"), ("select", "verdict"), ("gen", None),
        ]  # fmt: skip
        gen = state.get_meta_info("answer")
        assert (report.steps[0].prompt_tokens, report.steps[0].cached_tokens) == (
            gen["prompt_tokens"], gen["cached_tokens"],
        )  # fmt: skip
        select = state.get_meta_info("verdict")
        assert report.steps[1].prompt_tokens == select["prompt_tokens"]
        assert report.steps[1].cached_tokens == min(
            min(select["cached_tokens"]), select["prompt_tokens"]
        )
        assert report.prompt_tokens == sum(s.prompt_tokens for s in report.steps)
        assert report.hit_rate == report.cached_tokens / report.prompt_tokens
    # The first step of the cold run finds little; the same program again finds nearly all.
    assert cold.cache_report().steps[0].hit_rate < 0.5
    assert warm.cache_report().steps[0].hit_rate > 0.9
    # The select step prefills the prompt before scoring: its choices find it cached.
    assert cold.cache_report().steps[1].hit_rate > 0.9
    table = str(warm.cache_report()).splitlines()
    assert table[1].startswith("gen('answer')") and table[-1].startswith("total")


def test_cache_report_includes_forks(backend) -> None:
    state = quiz.run(question="Name a colour.", backend=backend)
    forks = state.fork(2)
    for i, f in enumerate(forks):
        f += sgl.gen(f"more{i}", max_tokens=2, temperature=0)
    forks.join()
    names = [s.name for s in state.cache_report().steps]
    assert names[:3] == ["answer", "verdict", None] and sorted(names[3:]) == ["more0", "more1"]


def test_run_batch_progress_bar_shows_the_running_hit_rate(backend, capsys) -> None:
    questions = ["Capital of Spain?", "Capital of Peru?", "Capital of Chad?"]
    states = quiz.run_batch(
        [{"question": q} for q in questions], backend=backend, progress_bar=True
    )
    err = capsys.readouterr().err
    shown = re.findall(r"cache hit (\d+\.\d)%", err)
    assert shown, err
    reports = [s.cache_report() for s in states]
    total = sum(r.cached_tokens for r in reports) / sum(r.prompt_tokens for r in reports)
    assert float(shown[-1]) == pytest.approx(100 * total, abs=0.051)


def test_step_from_meta_handles_missing_and_per_choice_counts() -> None:
    assert CacheStep.from_meta("gen", None, None) == CacheStep("gen", None, 0, 0)
    step = CacheStep.from_meta("select", "x", {"prompt_tokens": 10, "cached_tokens": [12, 9]})
    assert (step.cached_tokens, step.hit_rate) == (9, 0.9)
    assert CacheReport.from_records([]).hit_rate == 0.0
