"""sglang.srt.utils: process and platform helpers the tests call."""

from __future__ import annotations

import contextlib

import psutil


def kill_process_tree(
    parent_pid: int, include_parent: bool = True, skip_pid: int | None = None
) -> None:
    """Ends a process and its children: SIGTERM, then SIGKILL after 30 s for what is left."""
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    procs = [p for p in parent.children(recursive=True) if p.pid != skip_pid]
    if include_parent:
        procs.append(parent)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)


def is_npu() -> bool:
    """Whether an Ascend NPU is in use: never, for sgl_lite."""
    return False


def is_cuda() -> bool:
    """Whether the server runs on CUDA (torch's view from the test process)."""
    import torch

    return torch.cuda.is_available()


def is_hip() -> bool:
    """Whether the server runs on ROCm: never, for sgl_lite's tests."""
    return False
