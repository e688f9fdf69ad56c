"""The client matrix's runner: a scenario script under tests/support/clients/ run by the python
of `.venv-clients` (`make clients` builds it from tests/support/clients/requirements.txt; the
`SGL_LITE_CLIENTS_PYTHON` variable points at another interpreter) against a server URL, its
last stdout line read back as JSON.

The clients live in a venv of their own so that their pins (openai, pydantic, httpx, ...) never
meet .venv's; the test modules (tests/e2e/test_clients_*.py) serve our app from .venv and assert
on what the client got back. A missing venv fails the test: it is never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("clients")
# What every scenario runs with: no checkout on its path (the clients import nothing of ours),
# nothing fetched (the hub offline, litellm's bundled price map, the Agents SDK's tracing off).
CLIENT_ENV = {
    "PYTHONPATH": "",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "OPENAI_API_KEY": "unused",
    "TOKENIZERS_PARALLELISM": "false",
}


def clients_python() -> str:
    """The interpreter of .venv-clients (or SGL_LITE_CLIENTS_PYTHON); fails the test if absent."""
    python = os.environ.get("SGL_LITE_CLIENTS_PYTHON") or str(ROOT / ".venv-clients/bin/python")
    if not Path(python).exists():
        pytest.fail(
            f"no client venv at {python}: run `make clients` (or set SGL_LITE_CLIENTS_PYTHON)"
        )
    return python


def run_scenario(script: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Runs tests/support/clients/`script` with `args` under the clients' python; returns the
    JSON object its last stdout line holds, with `__seconds__` (its wall time) added. A non-zero
    exit fails the test with the script's stderr tail."""
    python = clients_python()
    start = time.monotonic()
    run = subprocess.run(
        [python, str(SCENARIOS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **CLIENT_ENV},
        cwd=str(ROOT),
    )
    seconds = time.monotonic() - start
    if run.returncode != 0:
        pytest.fail(f"{script} exited {run.returncode}:\n{run.stderr[-4000:]}")
    lines = run.stdout.strip().splitlines()
    if not lines:
        pytest.fail(f"{script} printed nothing:\n{run.stderr[-4000:]}")
    outcome = json.loads(lines[-1])
    print(f"{script}: {seconds:.1f} s", file=sys.stderr)
    return {**outcome, "__seconds__": seconds}
