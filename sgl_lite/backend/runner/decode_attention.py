"""How a torch decode step's attention reads its keys: over the decode copies' whole capacity,
or each shared prefix once (cascade attention, `models/shared_prefix.py`).

The runner asks these questions while it builds a pass's metadata and while it routes a
decode batch between the onnxruntime graph and the torch step; the answers depend only on the
device, the weight format, the model's attention and the batch.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_lite.backend.runner.decode_kv import KVView
from sgl_lite.backend.runner.models.attention import Attention
from sgl_lite.backend.runner.models.shared_prefix import SharedPrefixes, find_shared_prefixes
from sgl_lite.backend.runner.weights.formats import WeightFormat
from sgl_lite.backend.types import Segment

# The fewest decode rows that attend with two batched matmuls over the decode copies' whole
# capacity rather than SDPA's flash kernel over their used part (`decodes_over_copies`).
# One torch decode step (SmolLM2, AVX512-BF16 EPYC, 2 threads; `bench.profile_step.decode_ms`
# with `Attention.plain_softmax` off then on, interleaved): 1 row x 500 keys 14.7 -> 17.1
# ms and 4 x 600 24.9 -> 26.3 (slower); 8 x 1,000 53.4 -> 42.5, 16 x 500 60.3 -> 49.2,
# 32 x 300 80.4 -> 60.7, 64 x 200 129.8 -> 108.7 (faster).
DECODE_OVER_COPIES_MIN_ROWS = 8


def decodes_over_copies(device: torch.device, batch: int, kv_view: KVView) -> bool:
    """Whether a decode step of `batch` rows attends over its copies' whole capacity
    (Attention._decode_over_copies): on the CPU, in bf16 or fp16 (the fast mode; the
    deterministic mode's float64 keeps SDPA), from `DECODE_OVER_COPIES_MIN_ROWS` rows."""
    return (
        batch >= DECODE_OVER_COPIES_MIN_ROWS
        and device.type == "cpu"
        and kv_view.k_all.dtype in (torch.bfloat16, torch.float16)
    )


def reads_shared_prefixes(device: torch.device, fmt: WeightFormat, model: nn.Module) -> bool:
    """Whether decode steps read the prefixes their rows share once (models/shared_prefix.py):
    in the fast mode, on the CPU's flash kernel, for attention that is plain softmax over every
    key (no soft-capping `_core`, no sliding windows). Never in the deterministic mode: the
    result's rounding would depend on which rows share the batch."""
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    return (
        device.type == "cpu"
        and not fmt.deterministic
        and getattr(model, "sliding_window", None) is None
        and all(type(m)._core is Attention._core for m in attentions)
    )


def found_shared(decodes: list[Segment], reads_shared: bool) -> SharedPrefixes | None:
    """The prefixes the decode rows share where the runner reads them once (`reads_shared`,
    from `reads_shared_prefixes`) and they are worth it (`find_shared_prefixes`), else None."""
    if len(decodes) < 2 or not reads_shared:
        return None
    return find_shared_prefixes(decodes)
