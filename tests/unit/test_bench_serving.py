"""bench/serving.py: the rows it reports from sglang.bench_serving's JSON line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import serving


def test_the_figures_come_from_the_tools_last_json_line(tmp_path, monkeypatch):
    line = {k: 1.23456 for k in serving.FIGURES} | {"backend": "sglang", "completed": 32}

    def fake_run(cmd, **_):
        out = Path(cmd[cmd.index("--output-file") + 1])
        out.write_text(json.dumps({"stale": 1}) + "\n" + json.dumps(line) + "\n")
        assert cmd[cmd.index("--backend") + 1] == "sglang"
        assert "--gsp-num-groups" in cmd  # the dataset's own arguments
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(serving, "TOOL_PYTHON", Path(__file__))  # exists
    monkeypatch.setattr(serving.subprocess, "run", fake_run)
    got = serving.run_tool("sgl_lite", "http://x", "generated-shared-prefix", tmp_path, tmp_path)
    assert got["completed"] == 32 and got["request_throughput"] == 1.23
    assert set(got) == set(serving.FIGURES)


def test_a_failed_run_is_skipped_with_the_tools_error(tmp_path, monkeypatch):
    def fake_run(cmd, **_):
        return subprocess.CompletedProcess(cmd, 1, "", "KeyError: 'internal_states'")

    monkeypatch.setattr(serving, "TOOL_PYTHON", Path(__file__))
    monkeypatch.setattr(serving.subprocess, "run", fake_run)
    with pytest.raises(serving.Skipped, match="internal_states"):
        serving.run_tool("sgl_lite", "http://x", "random-ids", tmp_path, tmp_path)


def test_the_table_has_a_row_per_system_and_dataset_skips_included():
    rows = [
        {"system": "sgl_lite", "dataset": "random-ids", "completed": 32, "duration": 9.5},
        {"system": "vllm", "dataset": "random-ids", "skipped": "no venv"},
    ]
    lines = serving.table(rows).splitlines()
    assert len(lines) == 4 and "| random-ids | sgl_lite | 32 |" in lines[2]
    assert lines[3].count("no venv") == len(serving.FIGURES)
