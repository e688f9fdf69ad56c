"""`python -m sgl_lite.launch_server` with the deployment guide's SGLang flags, as a process."""

from __future__ import annotations

import contextlib
import os
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
from tests.support.processes import ENV, launch, running
from tests.support.server import free_port


def pool_tokens(url: str) -> int:
    info = httpx.get(f"{url}/get_server_info", timeout=30).json()
    return info["pool_free_tokens"] + info["pool_used_tokens"]


def test_unknown_sglang_flag_exits_2_naming_it_and_the_nearest() -> None:
    done = launch("--model-path", "default", "--max-totl-tokens", "100", "--enable-lora")
    assert done.returncode == 2
    assert "--max-totl-tokens is not a flag sgl_lite supports" in done.stderr
    assert "closest name sgl_lite has is --max-total-tokens" in done.stderr
    assert "--enable-lora is not a flag" in done.stderr


@pytest.mark.parametrize("flag", ["--tp", "--tp-size", "--tensor-parallel-size"])
def test_tensor_parallelism_points_to_the_router(flag) -> None:
    done = launch(flag, "2")
    assert done.returncode == 2 and "sglang_router.launch_router" in done.stderr


def test_no_room_for_a_pool_is_a_start_up_error() -> None:
    done = launch("--mem-fraction-static", "0.0001", timeout=120)
    assert done.returncode == 2
    assert "mem_fraction_static=0.0001 of" in done.stderr and "raise the fraction" in done.stderr


def test_dp_beyond_the_cores_is_a_start_up_error() -> None:
    done = launch("--dp", str((os.cpu_count() or 1) + 1))
    assert done.returncode == 2 and "CPU cores here" in done.stderr


def children(pid: int) -> list[int]:
    """Child process ids of `pid` (Linux /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_dp_2_serves_two_workers_behind_the_router_and_stops_on_sigterm() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "sgl_lite.launch_server", "--dp", "2", "--port", str(port)]
    cmd += ["--max-total-tokens", "2048", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the router did not come up"
            time.sleep(0.5)
        kids = children(proc.pid)
        assert len(kids) == 3  # two workers and the router
        for i in range(4):
            body = {"text": f"Request {i}:", "sampling_params": {"max_new_tokens": 2}}
            assert httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not any(Path(f"/proc/{k}").exists() for k in kids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in kids + children(proc.pid):  # a failed run must not leave workers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)


def test_deployment_guide_command_line_serves(tmp_path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:")
    # The guide's command plus SGLang's other common flags. --max-total-tokens caps the pool
    # that 0.85 of this machine's RAM would give (as in SGLang), so the test stays small.
    flags = ["--mem-fraction-static", "0.85", "--max-total-tokens", "4096", "--tp", "1"]
    flags += ["--dp-size", "1", "--trust-remote-code", "--enable-metrics", "--log-level", "info"]
    flags += ["--chat-template", str(template), "--tokenizer-path", str(memory_folder())]
    with running(*flags) as (url, log, _):
        assert pool_tokens(url) == 4096
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hello"}],
                  "max_tokens": 2, "temperature": 0},
            timeout=60,
        )  # fmt: skip
        assert chat.status_code == 200, chat.text
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(memory_folder())
        expected = len(tok.encode("Q: Hello\nA:", add_special_tokens=False))
        assert chat.json()["usage"]["prompt_tokens"] == expected  # our template, not the model's
        assert httpx.get(f"{url}/metrics", timeout=30).status_code == 200
        text = log.read_text()
    assert "mem_fraction_static=0.85: KV pool of 4096 tokens (capped by max_total_tokens" in text


def test_mem_fraction_static_sizes_the_pool_from_free_memory() -> None:
    folder = memory_folder()
    # Sizes in the dtype the server will load (`auto`: bfloat16 on a CPU with a bf16 GEMM).
    dtype = memory.dense_dtype_name(EngineConfig())
    per_token = memory.kv_bytes_per_token(folder, dtype)
    weights = memory.weight_bytes(folder, dtype)
    target = 12_000  # tokens: choose the fraction that should give about this many
    fraction = (weights + target * per_token) / sizing.available_cpu_memory()
    with running("--mem-fraction-static", f"{fraction:.5f}") as (url, _, _):
        tokens = pool_tokens(url)
    # Free memory moves while other processes run; 4000 tokens of slack is ±3 GiB of RAM here.
    assert abs(tokens - target) < 4000, (tokens, fraction)


def memory_folder() -> Path:
    from sgl_lite.backend.runner.model_loader import resolve_model_path

    return resolve_model_path(None)
