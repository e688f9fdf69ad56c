"""The benchmark runner end to end on a reduced workload: it runs and writes every field.

Nothing here is about speed; speed is what `make bench` reports.
"""

from __future__ import annotations

import json

import pytest

from bench import report, run
from tests.support import NUM_THREADS
from tests.support.gguf_files import name_tables_built_once

# The smallest sizes that still run every path: one conversation of two turns (the second turn
# hits the cache), one question, one JSON item at a budget a little past the shortest valid
# output (16 tokens: the budget rule closes it; W3T's tight budget is its own), a decode batch
# of 2. Every engine mode and grammar backend still loads (13 engines), so it stays past the
# default limit on a shared machine.
SMOKE_QUESTIONS = 1


@pytest.mark.timeout(900)
def test_bench_quick_run_writes_every_field_of_the_results_file(tmp_path, capsys):
    with name_tables_built_once():  # the HF baselines' model: the same weights, sooner
        run.main(
            [
                "--quick",
                "--repeats",
                "1",
                "--conversations",
                "1",
                "--questions",
                str(SMOKE_QUESTIONS),
                "--json-items",
                "1",
                "--json-max-new-tokens",
                "24",
                "--decode-batch",
                "2",
                "--num-threads",
                str(NUM_THREADS),
                "--out",
                str(tmp_path),
                "--no-peers",
            ]
        )
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "bench_results.json").read_text())

    for key in report.REQUIRED_ENV:
        assert key in data["env"], key
    assert data["env"]["torch_threads"] == NUM_THREADS
    sizes = data["sizes"]
    assert sizes["conversations"] == 1 and sizes["turns"] == 2
    assert sizes["questions"] == SMOKE_QUESTIONS and sizes["json_items"] == 1
    assert sizes["json_max_new_tokens"] == 24 and sizes["decode_batch"] == 2
    assert set(data["workloads"]) == set(report.WORKLOAD_SYSTEMS)
    for w, names in report.WORKLOAD_SYSTEMS.items():
        systems = data["workloads"][w]["systems"]
        assert set(systems) == set(names), w
        for name, figs in systems.items():  # figures, or the reason there are none
            assert "skipped" in figs or figs, (w, name)

    w1 = data["workloads"]["W1"]["systems"]
    for name in ("sgl_lite", "hf_alone", "hf_manual_cache"):
        for key in (
            "wall_s",
            "ttft_mean_s",
            "prompt_tokens_submitted",
            "prompt_tokens_computed",
            "cache_hit_rate",
        ):
            assert key in w1[name], (name, key)
    assert w1["sgl_lite"]["agreement_with_hf_alone"] is not None
    w2 = data["workloads"]["W2"]["systems"]
    for name in ("sgl_lite", "hf_alone", "hf_manual_cache"):
        assert len(w2[name]["decisions"]) == SMOKE_QUESTIONS and "accuracy" in w2[name]
    assert len(data["workloads"]["W2"]["answers"]) == SMOKE_QUESTIONS
    w3 = data["workloads"]["W3"]["systems"]
    assert "valid_fraction" in w3["hf_alone"]
    if "skipped" not in w3["sgl_lite"]:
        for key in (
            "valid_fraction",
            "tokens_emitted",
            "forward_passes_jump_forward",
            "forward_passes_no_jump_forward",
            "constrained_over_unconstrained_per_token",
        ):
            assert key in w3["sgl_lite"], key
    for name in ("sgl_lite", "hf_alone"):
        w4 = data["workloads"]["W4"]["systems"][name]
        assert w4["batch1_tokens_per_s"] > 0 and w4["batch_tokens_per_s"] > 0
    for w, figs in data["workloads"]["W5"]["systems"].items():
        assert "skipped" in figs or "dsl_over_engine" in figs, w

    assert len(data["targets"]) == 22
    for target in data["targets"]:
        assert target["status"] in ("met", "missed") or target["status"].startswith("n/a"), target
    assert "Targets (BENCHMARKS.md)" in printed
