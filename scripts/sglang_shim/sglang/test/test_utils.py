"""sglang.test.test_utils: the launch helper and constants SGLang's server tests import.

`popen_launch_server(model, base_url, ...)` starts `python -m sgl_lite.launch_server
--model-path default` on `base_url`'s host and port, under the name the test gave
(`--served-model-name model`, as SGLang serves a model under its path), with the test's
`api_key` and `other_args`, and returns the process once /health answers. The model names below
are SGLang's, so a test's requests and its `models.retrieve` use the names it expects; every one
of them is served by sgl_lite's default model.

Environment (set by scripts/sglang_server_tests.py): SGL_LITE_REPO (the checkout whose sgl_lite
the server imports), SGL_LITE_NUM_THREADS (passed as --num-threads), SGL_LITE_SERVER_LOG_DIR
(one log file per launch), SGL_LITE_TEST_PORT (the port of DEFAULT_URL_FOR_TEST).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest
from pathlib import Path
from urllib.parse import urlparse

import requests

from sglang.srt.utils import kill_process_tree

DEFAULT_MODEL_NAME_FOR_TEST = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SMALL_MODEL_NAME_FOR_TEST = "meta-llama/Llama-3.2-1B-Instruct"
DEFAULT_SMALL_CROSS_ENCODER_MODEL_NAME_FOR_TEST = "cross-encoder/ms-marco-MiniLM-L6-v2"
DEFAULT_SMALL_EMBEDDING_MODEL_NAME_FOR_TEST = "Alibaba-NLP/gte-Qwen2-1.5B-instruct"
DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH = 600
DEFAULT_URL_FOR_TEST = f"http://127.0.0.1:{os.environ.get('SGL_LITE_TEST_PORT', '21000')}"


class CustomTestCase(unittest.TestCase):
    """SGLang's base test case; here a plain TestCase (no retries: a failure is a failure)."""


def _server_env(env: dict[str, str] | None) -> dict[str, str]:
    # The server imports the real environment, not this shim: PYTHONPATH is the checkout only.
    out = dict(os.environ if env is None else env)
    repo = os.environ.get("SGL_LITE_REPO", "")
    out["PYTHONPATH"] = repo
    return out


def popen_launch_server(
    model: str,
    base_url: str,
    timeout: float,
    api_key: str | None = None,
    other_args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    return_stdout_stderr: tuple | None = None,
    **_: object,
) -> subprocess.Popen:
    """Starts sgl_lite's server for a test and returns it once /health answers 200."""
    url = urlparse(base_url)
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--model-path", "default"]
    cmd += ["--served-model-name", model, "--host", url.hostname or "127.0.0.1"]
    cmd += ["--port", str(url.port or 80)]
    threads = os.environ.get("SGL_LITE_NUM_THREADS")
    if threads:
        cmd += ["--num-threads", threads]
    if api_key:
        cmd += ["--api-key", api_key]
    cmd += [str(arg) for arg in other_args]
    log_dir = Path(os.environ.get("SGL_LITE_SERVER_LOG_DIR", "."))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{int(time.time() * 1000)}.log"
    log = open(log_path, "w")  # noqa: SIM115 (the child writes to it for its whole life)
    log.write(" ".join(cmd) + "\n")
    log.flush()
    if return_stdout_stderr:
        stdout, stderr = return_stdout_stderr
    else:
        stdout, stderr = log, subprocess.STDOUT
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=_server_env(env))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode} before serving: {log_path.read_text()}"
            )
        try:
            if requests.get(f"{base_url}/health", headers=headers, timeout=5).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.5)
    kill_process_tree(proc.pid)
    raise TimeoutError(f"server did not answer /health within {timeout} s: {log_path}")


def run_logprob_check(test: unittest.TestCase, arg: tuple) -> None:
    """Refused: SGLang's logprob checker is its test code, not reimplemented here (the inputs it
    is driven with in test_srt_endpoint.py reach 50 000 tokens, past the default model's 8192
    context, so those cases would fail on the model regardless)."""
    raise NotImplementedError("run_logprob_check (SGLang's test helper) is not in the shim")
