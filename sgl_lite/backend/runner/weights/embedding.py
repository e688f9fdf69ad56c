"""An embedding table read from its GGUF file: a lookup decodes only the rows it reads.

A GGUF's token table is quantized like its linears (Q6_K or Q8_0 for a tied head, by
llama.cpp's rule). Dequantized whole it is the largest float32 tensor of a small model: 0.4 GB
for a 1B Llama shape with SmolLM2's 49k vocabulary, 1.2 GB for Gemma 3 1B's 262k; even as codes
it is ~1.1 bytes a weight, a second copy beside the graph's head where the head is tied. Read
through a map of the file, the table takes no memory of its own: only the file pages of the
rows read, which the kernel may drop and read again. The rows are dequantized as
`GroupAffine.dequantize` does, to the float32 values the whole dense table would hold, then cast
to the model's dtype like the table was: a lookup gives the same bits either way.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch
from torch import nn

from sgl_lite.backend.runner.weights import gguf_blocks
from sgl_lite.backend.runner.weights.gguf_header import read_header
from sgl_lite.backend.runner.weights.gguf_tensors import raw_rows

TABLE = "token_embd.weight"  # the token table's name in a GGUF file


class FileEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over the (vocab, hidden) table of a GGUF file, read through a
    map of the file: a lookup decodes its rows' blocks as `gguf_blocks.decode` does."""

    def __init__(self, path: Path, dtype: torch.dtype) -> None:
        super().__init__()
        header = read_header(path)
        info = header.tensor(TABLE)
        if info is None or info.type_id not in gguf_blocks.BLOCK_TYPES:
            raise ValueError(f"{path} has no token table in a block format ({TABLE})")
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._rows = raw_rows(self._map, header, info)  # (vocab, bytes per row), no copy
        self.embedding_dim, self.num_embeddings = info.dims[0], self._rows.shape[0]
        self._type = info.type_id
        self.dtype = dtype

    @property
    def weight(self) -> torch.Tensor:
        """The table's shape and dtype, on the meta device: there is no dense copy to read (as
        for a codes-only linear's weight); any use of its values fails loudly."""
        return torch.empty(self.num_embeddings, self.embedding_dim, dtype=self.dtype, device="meta")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) → (T, hidden) in the model's dtype."""
        raw = self._rows[ids.cpu().numpy()]  # a copy of the rows' blocks
        return gguf_blocks.decode(self._type, raw).dequantize().to(self.dtype).to(ids.device)
