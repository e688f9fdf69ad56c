"""The engine runs all of its tensor work on its loop thread (see backend/omp_threads.py).

A second thread that runs parallel kernels gets an OpenMP team of its own, and with more workers
than CPUs libgomp stops spinning between kernels: a decode step then takes twice as long. So
building an engine and generating with it must run no tensor op on the caller's thread, and the
threads beside the forward (grammar compiles, the mask worker) run theirs on one OpenMP thread.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.omp_threads import use_one_omp_thread
from tests.conftest import NUM_THREADS

TINY = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


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


@pytest.fixture
def folder(tmp_path, tiny_tokenizer):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY)).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_the_caller_thread_runs_no_tensor_op_to_load_or_generate(folder):
    with OpsOnThisThread() as mode:
        engine = Engine(str(folder), num_threads=NUM_THREADS, max_total_tokens=256)
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
    torch.set_num_threads(2)
    seen: list[int] = []

    def helper() -> None:
        use_one_omp_thread()
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert seen == [1]
    assert torch.get_num_threads() == 2
