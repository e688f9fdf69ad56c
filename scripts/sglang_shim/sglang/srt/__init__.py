"""sglang.srt: the names SGLang's server tests import from it (see the package docstring)."""
