"""The engine runs all of its tensor work on its loop thread (see backend/omp_threads.py).

A second thread that runs parallel kernels gets an OpenMP team of its own, and with more workers
than CPUs libgomp stops spinning between kernels: a decode step then takes twice as long. So
building an engine and generating with it must run no tensor op on the caller's thread, and the
threads beside the forward (grammar compiles, the mask worker) run theirs on one OpenMP thread.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.omp_threads import use_one_omp_thread
from tests.support import NUM_THREADS

# Allocations run no kernel, so no parallel region (small request tensors are built this way).
ALLOCATIONS = {"aten.empty.memory_format", "aten.empty_strided.default"}


class OpsOnThisThread(TorchDispatchMode):
    """Records the aten ops but allocations dispatched on the thread that entered it (modes are
    per thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) not in ALLOCATIONS:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_caller_thread_runs_no_tensor_op_to_load_or_generate(tiny_llama_folder):
    with OpsOnThisThread() as mode:
        engine = Engine(str(tiny_llama_folder), num_threads=NUM_THREADS, max_total_tokens=256)
        try:
            out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4})
        finally:
            engine.shutdown()
    assert out["meta_info"]["completion_tokens"] == 4
    assert mode.ops == []


def test_the_recorder_sees_ops_on_its_own_thread():
    """The check above could fail: ops run on the caller's thread are recorded."""
    with OpsOnThisThread() as mode:
        torch.ones(4).sum()
    assert mode.ops


def test_a_helper_thread_can_drop_to_one_omp_thread_without_touching_others():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that the helper's 1 differs from the process-wide count
    seen: list[int] = []

    def helper() -> None:
        use_one_omp_thread()
        seen.append(torch.get_num_threads())

    try:
        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)  # the suite's thread count, for the tests after this one
