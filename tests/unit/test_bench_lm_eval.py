"""bench/lm_eval_bench.py and bench/lm_eval_task.py: the offline task it writes, what it reads
back from lm-eval's output files and /metrics, and the figures it derives from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import lm_eval_bench as bench
from bench.lm_eval_task import TASK, build_items, passages, write_task


def test_items_are_deterministic_four_option_questions_over_shared_passages():
    items = build_items(120)  # 30 questions per passage: past the 24 shipped ones
    assert items == build_items(120)  # the same n, the same task
    assert len({item["query"] for item in items}) == 120
    texts = passages()
    for i, item in enumerate(items):
        assert item["query"].startswith(texts[i % len(texts)])
        assert item["query"].endswith("\nAnswer:")
        assert len(item["choices"]) == len(set(item["choices"])) == 4
        assert 0 <= item["gold"] < 4
    # the options are shuffled: the right one is not always first
    assert len({item["gold"] for item in items}) > 1
    # past the shipped questions, generated sums keep the right answer at `gold`
    question = items[-1]["query"].rsplit("Question: ", 1)[1].split("?")[0]
    a, b = (int(w) for w in question.removeprefix("What is ").split(" plus "))
    answer = items[-1]["choices"][items[-1]["gold"]]
    assert answer == str(a + b)


def test_zero_items_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 1"):
        build_items(0)


def test_the_task_yaml_names_the_jsonl_it_wrote(tmp_path):
    assert write_task(tmp_path, 5) == TASK
    yaml = (tmp_path / f"{TASK}.yaml").read_text()
    data = tmp_path / f"{TASK}.jsonl"
    assert f"test: {data}" in yaml and "output_type: multiple_choice" in yaml
    assert 'doc_to_text: "{{query}}"' in yaml and 'doc_to_choice: "{{choices}}"' in yaml
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert rows == build_items(5)


def _lm_eval_output(out: Path) -> None:
    """What lm-eval 0.4.x writes with --output_path/--log_samples: results and samples files
    (tuples logged as lists of strings, arguments as gen_args_i/arg_j)."""
    folder = out / "default"
    folder.mkdir(parents=True)
    results = {"results": {TASK: {"acc,none": 0.5}}, "total_evaluation_time_seconds": "12.345"}
    (folder / "results_2026-01-01.json").write_text(json.dumps(results))
    samples = [
        {
            "doc_id": doc_id,
            "arguments": {
                f"gen_args_{i}": {"arg_0": f"ctx{doc_id}", "arg_1": f" c{i}"} for i in range(2)
            },
            "resps": [[[str(-1.0 - doc_id - i), "False"]] for i in range(2)],
            "acc": float(doc_id == 0),
        }
        for doc_id in (1, 0)  # lm-eval writes them in its own order
    ]
    lines = "".join(json.dumps(s) + "\n" for s in samples)
    (folder / f"samples_{TASK}_2026-01-01.jsonl").write_text(lines)


def test_the_output_files_give_accuracy_time_and_each_items_loglikelihoods(tmp_path):
    _lm_eval_output(tmp_path)
    got = bench.parse_output(tmp_path, TASK)
    assert got["acc"] == 0.5 and got["eval_s"] == 12.35
    assert [item["pairs"] for item in got["items"]] == [
        [("ctx0", " c0"), ("ctx0", " c1")],
        [("ctx1", " c0"), ("ctx1", " c1")],
    ]
    assert got["items"][1]["loglikelihoods"] == [-2.0, -3.0]
    assert [item["acc"] for item in got["items"]] == [1.0, 0.0]


def test_no_output_files_is_a_skipped_row_not_a_crash(tmp_path):
    with pytest.raises(bench.Skipped, match="no results"):
        bench.parse_output(tmp_path, TASK)


class _Reference:
    def __init__(self, scores: dict[tuple[str, str], float]) -> None:
        self.scores = scores

    def score(self, pairs):
        return [(self.scores[p], False) for p in pairs]


def test_agreement_counts_items_with_any_option_past_the_tolerance():
    items = [
        {"pairs": [("a", " x"), ("a", " y")], "loglikelihoods": [-1.0, -2.0]},
        {"pairs": [("b", " x"), ("b", " y")], "loglikelihoods": [-1.0, -2.00005]},
        {"pairs": [("c", " x"), ("c", " y")], "loglikelihoods": [-1.5, -2.0]},
    ]
    reference = _Reference(
        {("a", " x"): -1.0, ("a", " y"): -2.0, ("b", " x"): -1.0, ("b", " y"): -2.0}
        | {("c", " x"): -1.0, ("c", " y"): -2.0002}
    )
    got = bench.agreement(items, reference)
    assert got == {"max_abs_diff": 0.5, "items_over_1e-4": 1}


def test_vllm_counters_sum_over_labels_and_miss_as_none():
    text = (
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        'vllm:prompt_tokens_total{engine="0",model_name="default"} 1200.0\n'
        'vllm:prompt_tokens_total{engine="1",model_name="default"} 34.0\n'
        'vllm:prompt_tokens_by_source_total{source="local"} 99.0\n'
        "vllm:prefix_cache_hits_total 1000.0\n"
    )
    assert bench.metric_total(text, "vllm:prompt_tokens_total") == 1234.0
    assert bench.metric_total(text, "vllm:prefix_cache_hits_total") == 1000.0
    assert bench.metric_total(text, "vllm:generation_tokens_total") is None


def test_systems_expand_our_modes_and_refuse_unknown_names():
    assert bench.systems("sgl_lite,vllm", "sgl_lite,sgl_lite-nocache") == [
        "sgl_lite",
        "sgl_lite-nocache",
        "vllm",
    ]
    with pytest.raises(SystemExit, match="unknown peer"):
        bench.systems("llama", "sgl_lite")
    with pytest.raises(SystemExit, match="unknown mode"):
        bench.systems("sgl_lite", "sgl_lite-fast")


def test_the_table_has_a_row_per_system_and_the_skip_reason():
    rows = [
        {"system": "sgl_lite", "items": 4, "wall_s": 1.5, "acc": 0.75},
        {"system": "vllm", "skipped": "missing"},
    ]
    lines = bench.table(rows).splitlines()
    assert lines[0].startswith("| system | items | wall_s")
    assert lines[2].startswith("| sgl_lite | 4 | 1.5 |") and "| 0.75 |" in lines[2]
    assert lines[3].count("missing") == len(bench.FIGURES)
