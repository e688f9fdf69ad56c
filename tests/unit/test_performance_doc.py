"""docs/performance.md is `bench.docs_table`'s rendering of docs/bench_results.json, so its
figures never go stale, and the renderer puts every workload's figures from the JSON in that
workload's table (checked on figures altered here, so a renderer that printed anything but what
the file holds would fail)."""

from __future__ import annotations

import copy
import itertools
import json
import re

import pytest

from bench import docs_table, report

RESULTS = docs_table.DEFAULT_RESULTS


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text())


def _tables(page: str) -> dict[str, list[dict[str, str]]]:
    """Every Markdown table of the page by the heading above it: its rows as {header: cell}."""
    tables: dict[str, list[dict[str, str]]] = {}
    heading, header = None, None
    for line in page.splitlines():
        if line.startswith("#"):
            heading, header = line.lstrip("# "), None
        elif line.startswith("|") and heading is not None:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
            if header is None:
                header = cells
            elif not set(line) <= set("|-"):
                tables.setdefault(heading, []).append(dict(zip(header, cells)))
        else:
            header = None
    return tables


def _altered(results: dict) -> dict:
    """A copy whose every numeric figure is a different number (1001, 1002, ...)."""
    altered = copy.deepcopy(results)
    numbers = itertools.count(1001)
    for block in altered["workloads"].values():
        for figs in block["systems"].values():
            for key, value in figs.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    figs[key] = float(next(numbers))
    return altered


def test_the_committed_performance_page_is_the_rendering_of_the_committed_results():
    fresh = docs_table.render_file(RESULTS, docs_table.DEFAULT_OUT)
    committed = docs_table.DEFAULT_OUT.read_text()
    assert committed == fresh, "docs/performance.md is stale: run `python -m bench.docs_table`"
    assert "do not edit: regenerate with `python -m bench.docs_table`" in committed


def test_each_workload_table_holds_that_workloads_figures_from_the_results(results):
    altered = _altered(results)
    page = docs_table.render(altered, source="bench_results.json", regenerate="x", chart=False)
    tables = _tables(page)
    checked = 0
    for w, block in altered["workloads"].items():
        rows = {row["system"]: row for row in tables[f"{w}: {block['title']}"]}
        assert set(rows) == set(block["systems"])
        for name, figs in block["systems"].items():
            if "skipped" in figs:
                assert "skipped" in rows[name].values()
                continue
            for column in report.WORKLOAD_COLUMNS[w]:
                if column in figs:
                    assert rows[name][column] == report._fmt(figs[column]), (w, name, column)
                    checked += 1
    assert checked >= 40  # every workload of the committed file contributed figures
    summary = {row["workload, figure"]: row for row in tables["Summary"]}
    w1 = altered["workloads"]["W1"]["systems"]
    assert summary["W1 multi-turn chat, wall (s)"]["sgl_lite"] == report._fmt(
        w1["sgl_lite"]["wall_s"]
    )
    assert summary["W1 multi-turn chat, wall (s)"]["HF-alone"] == report._fmt(
        w1["hf_alone"]["wall_s"]
    )


def test_the_header_names_the_run_and_the_machine_the_results_record(results):
    page = docs_table.render(results, source="bench_results.json", regenerate="x", chart=False)
    env = results["env"]
    command = (
        f"python -m bench.run --workloads {','.join(results['workloads'])} "
        f"--repeats {env['repeats']} --num-threads {env['torch_threads']}"
    )
    assert command in page
    machine = {row[""]: row["this run"] for row in _tables(page)["Performance"]}
    assert env["cpu_model"] in machine["CPU"]
    assert machine["torch threads"] == str(env["torch_threads"])


def test_the_run_command_is_rebuilt_from_what_the_file_records(results):
    quick = copy.deepcopy(results)
    quick["env"] |= {"quick": True, "repeats": 1, "torch_threads": 1}
    # quick: 1, 2, 2, 4 (the file's decode batch is the full run's 16)
    quick["sizes"] |= {"conversations": 1, "questions": 3, "json_items": 2, "decode_batch": 4}
    quick["workloads"]["W1"]["systems"]["llama_cpp"] = {"skipped": "--no-peers"}
    assert docs_table.run_command(quick) == (
        "python -m bench.run --workloads W1,W2,W3,W4,W5 --repeats 1 --num-threads 1 --quick "
        "--questions 3 --no-peers"
    )
    quick["sizes"] |= {"json_max_new_tokens": 24, "decode_batch": 2}  # the smoke test's
    assert docs_table.run_command(quick).endswith(
        "--questions 3 --json-max-new-tokens 24 --decode-batch 2 --no-peers"
    )
    quick["env"]["command"] = "python -m bench.run --out docs"
    assert docs_table.run_command(quick) == "python -m bench.run --out docs"
