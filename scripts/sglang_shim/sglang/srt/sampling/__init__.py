"""sglang.srt.sampling: the names SGLang's server tests import from it."""
