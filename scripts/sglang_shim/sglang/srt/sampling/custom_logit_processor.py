"""sglang.srt.sampling.custom_logit_processor: sgl_lite's `CustomLogitProcessor`, which speaks
SGLang's wire format (its `to_str()` pickles the base class under SGLang's name)."""

from sgl_lite.backend.scheduler.custom_logits import CustomLogitProcessor

__all__ = ["CustomLogitProcessor"]
