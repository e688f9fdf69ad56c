"""Shared fixtures, the test tiers and the hypothesis profiles.

Every collected test gets its folder's tier marker (tests/support/tiers.py: tests/unit, model,
tokenizer, e2e, process, cuda), and a test whose needs exceed its folder is refused; `-m` skips
whole folders it cannot select. `make test-fast` runs `-m "unit or model"`, where nothing reads
a SmolLM2 file. cuda tests are skipped without a CUDA device.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

# First: the engine's OpenMP wait policy is set before torch loads, as a user's import of the
# engine sets it (sgl_lite/backend/omp_policy.py), so this process's engines wait as users' do.
from sgl_lite.backend import omp_policy

omp_policy.apply()

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from tests.support import NUM_THREADS  # noqa: E402
from tests.support.gguf_files import name_tables_built_once  # noqa: E402
from tests.support.tiers import cannot_select, tier_of  # noqa: E402
from tests.support.tiny import TINY_LLAMA, build_tiny_tokenizer  # noqa: E402

torch.set_num_threads(NUM_THREADS)

# Hypothesis: `dev` (small, the default) keeps `make test-fast` quick; `ci` (CI=true, as CI
# runners set it) explores more. HYPOTHESIS_PROFILE overrides both. No deadline in either: on
# a shared 2-core machine one example's wall time measures the machine, not the code.
settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"sgl_lite tests: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"hypothesis profile {settings.get_current_profile_name()}"
    )


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    # A tier folder (or a file in one) whose tier `-m` excludes: never imported.
    return True if cannot_select(config.option.markexpr or "", collection_path) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        tier = tier_of(item)
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "cuda" and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None)


@pytest.fixture(scope="module", autouse=True)
def _return_freed_memory():
    """After each module, the memory its engines freed goes back to the system.

    glibc keeps freed heap memory for reuse (and raises its mmap threshold after large frees),
    so each module's engines left ~0.8 GB resident after they were gone: one suite process
    reached 15 GB a third of the way through. `malloc_trim` hands it back (measured: a shut
    down engine's 1.0-1.3 GB resident fell to 0.4 GB). Only past TRIM_ABOVE_BYTES resident:
    the collect and trim cost ~0.4 s a module, which the fast tier's ~100 engine-free modules
    would pay for nothing.
    """
    yield
    trim = getattr(_LIBC, "malloc_trim", None)  # glibc only
    if trim is not None and _resident_bytes() > TRIM_ABOVE_BYTES:
        gc.collect()
        trim(0)


TRIM_ABOVE_BYTES = 2 << 30


def _resident_bytes() -> int:
    """This process's resident memory (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# --- the embedded SmolLM2 (tokenizer, e2e) -----------------------------------------------------
@pytest.fixture(scope="session")
def smollm_folder():
    """The converted embedded model (converted once into the cache dir)."""
    from sgl_lite.backend.runner.model_loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_folder):
    """SmolLM2's tokenizer."""
    from sgl_lite.backend.runner.model_loader import load_tokenizer

    return load_tokenizer(smollm_folder)


@pytest.fixture(scope="session")
def engine():
    """One shared engine on the embedded model; tests must leave it idle and consistent."""
    from sgl_lite.backend.engine import Engine

    # NOTE: float32, not `auto` (bfloat16 on a CPU with a bf16 GEMM, float32 elsewhere): the
    # tests on this engine check identity (cache on/off, alone/batched) and agreement with
    # transformers' float32 logits, which the engine promises in float32 only.
    eng = Engine(
        num_threads=NUM_THREADS, max_total_tokens=16384, dtype="float32", quantization="none"
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def hf_smollm(smollm_folder):
    """transformers' own implementation of the same weights, for reference outputs."""
    from bench.hf_baselines import load_hf_model

    with name_tables_built_once():  # the same model, loaded in half the time
        return load_hf_model(smollm_folder, torch.float32)


# --- the served app ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(url):
    """An OpenAI client on the module's `url` (the tier's conftest.py or the module serves it)."""
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


# --- built in the test (unit, model) -----------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_tokenizer():
    """`build_tiny_tokenizer()` (tests/support/tiny.py), built once per session."""
    return build_tiny_tokenizer()


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """`SGL_LITE_CACHE` in the test's own folder: what a test converts (a GGUF's config and
    tokenizer folder) goes there, never to the user's cache; returns that folder."""
    monkeypatch.setenv("SGL_LITE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_llama_folder(tmp_path, tiny_tokenizer):
    """A loadable model folder: TINY_LLAMA's config, random weights (seed 0), the tiny tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    return tmp_path
