"""A truncated GGUF file is refused naming the tensor whose data is missing, and the file,
before any work (`weights/gguf_header.py`, `model_loader.convert_gguf`)."""

from __future__ import annotations

import numpy as np
import pytest

from sgl_lite.backend.runner.model_loader import ModelLoadError, resolve_model_path
from sgl_lite.backend.runner.weights.gguf_header import GGUFFormatError, read_header


def _write(path, arch: str = "llama") -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((8, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_truncated_file_names_the_tensor_whose_data_is_cut(tmp_path, private_cache):
    whole = tmp_path / "whole.gguf"
    _write(whole)
    names = [t.name for t in read_header(whole).tensors]
    assert names == ["token_embd.weight", "output_norm.weight"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-40])  # into the last tensor's 128 bytes
    with pytest.raises(GGUFFormatError, match="tensor 'output_norm.weight' ends at byte"):
        read_header(cut)
    with pytest.raises(ModelLoadError, match=r"cut\.gguf.*'output_norm\.weight'.*truncated"):
        resolve_model_path(cut)
    assert not (private_cache / "models").exists()  # refused before any conversion work


def test_array_metadata_is_skipped_but_its_length_kept(tmp_path):
    import gguf

    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "bb", "ccc"])
    writer.add_token_types([1, 1, 1])
    writer.add_array("nested", [[1, 2], [3, 4, 5]])
    writer.add_uint32("after", 7)  # read at the right place after the arrays
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    assert "tokenizer.ggml.tokens" not in header.metadata
    assert header.array_lengths == {
        "tokenizer.ggml.tokens": 3,
        "tokenizer.ggml.token_type": 3,
        "nested": 2,
    }
    assert header.metadata["after"] == 7
