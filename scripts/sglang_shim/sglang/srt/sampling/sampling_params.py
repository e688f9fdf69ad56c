"""sglang.srt.sampling.sampling_params: the names test_matched_stop.py imports.

`get_max_seq_length` is an SGLang internal (the longest string a stop regex can match, which its
scheduler uses to bound a stop-regex scan), not part of the server's wire contract; a test of it
fails here with NotImplementedError rather than passing on a reimplementation of SGLang's code.
"""

MAX_LEN = 2**30


def get_max_seq_length(regex_str: str) -> int:
    """Refused: an SGLang scheduler internal, not a server behaviour sgl_lite promises."""
    raise NotImplementedError(
        "get_max_seq_length is an SGLang scheduler internal, not part of the server contract"
    )
