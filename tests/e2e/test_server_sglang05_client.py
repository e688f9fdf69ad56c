"""SGLang 0.5's own frontend (`sgl.RuntimeEndpoint`) runs SGLang's frontend test programs
against our server with no protocol error.

SGLang 0.5 and 0.4.10 are one package name, so 0.5 lives in a venv of its own that sees our
venv's packages through a .pth file: `make setup-dev` builds `.venv-sglang05` (see the Makefile);
`SGL_LITE_SGLANG05_PYTHON` points at another interpreter. `SGL_LITE_SGLANG05_SLOW=1` adds the
programs that take minutes on a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_lite.server import create_app
from tests.support.server import serve

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("sglang05_programs.py")


def sglang05_python() -> str:
    python = os.environ.get("SGL_LITE_SGLANG05_PYTHON") or str(ROOT / ".venv-sglang05/bin/python")
    if not Path(python).exists():
        pytest.fail(f"no SGLang 0.5 client at {python}: run `make setup-dev` (or set "
                    "SGL_LITE_SGLANG05_PYTHON)")  # fmt: skip
    return python


def test_sglang05_runtime_endpoint_runs_sglangs_test_programs(engine):  # the session's engine
    python = sglang05_python()
    with serve(create_app(engine)) as url:
        slow = ["--slow"] if os.environ.get("SGL_LITE_SGLANG05_SLOW") else []
        env = {**os.environ, "PYTHONPATH": ""}  # its own sglang, not a checkout's
        run = subprocess.run(
            [python, str(SCRIPT), url, *slow],
            capture_output=True,
            text=True,
            timeout=1200,
            env=env,
            cwd=str(ROOT),
        )
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcomes.pop("__version__").startswith("0.5."), "not SGLang 0.5's client"
    results = {k: v for k, v in outcomes.items() if not k.endswith("_seconds")}
    errors = {k: v for k, v in results.items() if v.startswith("error")}
    assert not errors, errors
    ran_clean = [k for k, v in results.items() if v == "ok"]
    print(json.dumps(outcomes, indent=1), file=sys.stderr)
    # the programs whose checks a 135M model can pass, pass: the protocol carried them
    assert {"test_select", "test_regex", "test_dtype_gen", "test_stream_logprobs"} <= set(
        ran_clean
    ), results
