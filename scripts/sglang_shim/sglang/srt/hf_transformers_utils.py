"""sglang.srt.hf_transformers_utils: the older import path of `get_tokenizer`."""

from sglang.srt.utils.hf_transformers_utils import get_tokenizer

__all__ = ["get_tokenizer"]
