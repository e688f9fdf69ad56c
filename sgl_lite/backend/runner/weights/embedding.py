"""An embedding table kept as its file's codes: a lookup dequantizes only the rows it reads.

A GGUF's token table is quantized like its linears (Q6_K or Q8_0 for a tied head, by
llama.cpp's rule). Dequantized whole it is the largest float32 tensor of a small model: 0.4 GB
for a 1B Llama shape with SmolLM2's 49k vocabulary, 1.2 GB for Gemma 3 1B's 262k; as codes it
is ~1.25 bytes a weight (against 2 in bf16, 4 in float32). The rows a pass reads are
dequantized as `GroupAffine.dequantize` does, to the float32 values the whole dense table would
hold, then cast to the model's dtype like the table was: a lookup gives the same bits either
way.
"""

from __future__ import annotations

import torch
from torch import nn

from sgl_lite.backend.runner.weights.quant import GroupAffine


class CodesEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over a (vocab, hidden) table held as codes."""

    def __init__(self, codes: GroupAffine, dtype: torch.dtype) -> None:
        super().__init__()
        # Plain attributes, not buffers: `model.to(dtype)` must not turn the codes into floats.
        self.q, self.scale, self.group = codes.q, codes.scale, codes.group
        # The 8-bit formats of a table (Q6_K, Q8_0) are symmetric: no offsets to hold.
        self.offset = codes.offset if bool(codes.offset.any()) else None
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = codes.q.shape

    @property
    def weight(self) -> torch.Tensor:
        """The table's shape and dtype, on the meta device: there is no dense copy to read (as
        for a codes-only linear's weight); any use of its values fails loudly."""
        return torch.empty(self.q.shape, dtype=self.dtype, device="meta")

    @property
    def nbytes(self) -> int:
        """Memory the codes, scales and offsets take."""
        parts = [self.q, self.scale] + ([self.offset] if self.offset is not None else [])
        return sum(t.numel() * t.element_size() for t in parts)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) → (T, hidden) in the model's dtype: `GroupAffine.dequantize`'s rows."""
        t, k = len(ids), self.embedding_dim
        groups = self.q.index_select(0, ids).view(t, k // self.group, self.group).float()
        rows = groups * self.scale.index_select(0, ids)[..., None]
        if self.offset is not None:
            rows = rows + self.offset.index_select(0, ids)[..., None]
        return rows.view(t, k).to(self.dtype)
