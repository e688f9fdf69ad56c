"""SGLang's deployment line `--mem-fraction-static 0.85` on a shared CPU box: the pool is a
ceiling, so the server's resident memory after start-up and a request stays near the model's."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import memory
from sgl_lite.backend.kvcache import sizing
from sgl_lite.backend.runner.model_loader import resolve_model_path
from tests.support.processes import ENV, ROOT
from tests.support.server import free_port

FRACTION = 0.85
LIMIT = 2 * 2**30  # SmolLM2-135M's weights, torch and the tokenizer take about 0.7 GiB


def resident_bytes(pid: int) -> int:
    """VmRSS of process `pid` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def no_room_for_the_model() -> str | None:
    """Why 0.85 of this machine's free RAM cannot hold the model and a minimal pool, or None."""
    folder = resolve_model_path("default")
    dtype = memory.dense_dtype_name(EngineConfig(device="cpu"))
    need = memory.weight_bytes(folder, dtype)
    need += sizing.MIN_POOL_TOKENS * memory.kv_bytes_per_token(folder, dtype)
    free = sizing.available_cpu_memory()
    if free * FRACTION >= need:
        return None
    return f"{FRACTION} of {free / 2**30:.2f} GiB free RAM is below the model ({need / 2**30:.2f})"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_mem_fraction_085_on_cpu_keeps_the_server_near_the_model_size(tmp_path) -> None:
    reason = no_room_for_the_model()
    if reason:
        pytest.skip(reason)
    port = free_port()
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--model-path", "default"]
    cmd += ["--mem-fraction-static", str(FRACTION), "--port", str(port), "--host", "127.0.0.1"]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"server exited {proc.returncode}: {log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"no /health after 180 s: {log.read_text()}"
            time.sleep(0.25)
        started = resident_bytes(proc.pid)
        info = httpx.get(f"{url}/get_server_info", timeout=30).json()
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}}
        reply = httpx.post(f"{url}/generate", json=body, timeout=120)
        assert reply.status_code == 200 and reply.json()["text"], reply.text
        served = resident_bytes(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    gib = 2**30
    assert started < LIMIT and served < LIMIT, (started / gib, served / gib, info["kv_pool_bytes"])
    # The pool is sized (and capped at what 64 running requests of 8192 tokens can use), and the
    # start-up line says so; its pages are committed as they are used, not at start-up.
    tokens = info["pool_free_tokens"] + info["pool_used_tokens"]
    assert tokens <= 64 * 8192
    text = log.read_text()
    line = re.search(r"mem_fraction_static=0\.85: KV pool of (\d+) tokens.*", text)
    assert line is not None and int(line.group(1)) == tokens, text
    assert "committed as it is used" in line.group(0) and "GiB free RAM" in line.group(0)
    if tokens == 64 * 8192:
        assert "capped by max_running_requests 64 x context 8192" in line.group(0)
    assert proc.returncode == 0, text
