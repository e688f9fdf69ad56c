"""bench/report.py on hand-made results: the peers' wall-time targets and the figures' notes."""

from __future__ import annotations

from bench import docs_table, report


def _results(**w2: dict) -> dict:
    return {
        "env": {},
        "workloads": {
            "W1": {"systems": {"sgl_lite": {"wall_s": 2.0}, "vllm": {"wall_s": 5.0}}},
            "W2": {"systems": {"sgl_lite": {"wall_s": 1.0}, **w2}},
        },
    }


def _target(results: dict, figure: str) -> report.Target:
    return next(t for t in report.evaluate_targets(results) if t.figure == figure)


def test_the_vllm_targets_are_its_wall_over_sgl_lites_per_workload():
    results = _results(vllm={"wall_s": 1.2})
    w1 = _target(results, "W1 wall, vLLM CPU / sgl_lite")
    assert (w1.value, w1.status) == (2.5, "met")
    w2 = _target(results, "W2 wall, vLLM CPU / sgl_lite")
    assert (w2.value, w2.status) == (1.2, "missed")


def test_a_peer_absent_from_a_workload_is_named_not_measured():
    results = _results()
    assert _target(results, "W2 wall, vLLM CPU / sgl_lite").status == "n/a: W2 vllm not measured"
    skipped = _results(vllm={"skipped": "no venv"})
    status = _target(skipped, "W2 wall, vLLM CPU / sgl_lite").status
    assert status == "n/a: W2 vllm skipped (reason above)"
    assert _target(results, "W3 wall, vLLM CPU / sgl_lite").status == "n/a: W3 not run"


def test_a_systems_own_notes_reach_the_report_and_the_page():
    figs = {"wall_s": 1.0, "cache_note": "no cache reads", "ttft_note": None}
    assert report.figure_notes("vllm", figs) == ["vllm: no cache reads"]
    block = {"title": "few-shot select", "systems": {"vllm": figs}}
    assert "- vllm: no cache reads" in docs_table._workload("W2", block)


def test_w4_is_held_to_vllms_aggregate_and_prefill():
    w4 = {
        "sgl_lite": {"batch_tokens_per_s": 300.0, "prefill_tokens_per_s": 1500.0},
        "vllm": {"batch_tokens_per_s": 500.0, "prefill_tokens_per_s": 1000.0},
    }
    results = {"env": {}, "workloads": {"W4": {"systems": w4}}}
    batch = _target(results, "W4 16 prompts aggregate tok/s, sgl_lite / vLLM CPU")
    assert (batch.value, batch.status) == (0.6, "missed")
    prefill = _target(results, "W4 prefill tok/s, sgl_lite / vLLM CPU")
    assert (prefill.value, prefill.status) == (1.5, "met")
    del w4["vllm"]["prefill_tokens_per_s"]  # a peer run that predates the prefill figure
    assert _target(results, "W4 prefill tok/s, sgl_lite / vLLM CPU").status == "n/a"
