"""sgl_lite.common: the small pieces of logic the frontend, the backend and the benchmark share.

Only the standard library is imported here, never torch, outlines-core or another sgl_lite
package, so the frontend can use it without loading the engine (an import-linter contract in
pyproject.toml keeps it so).
"""

from sgl_lite.common.regex import (
    DTYPE_REGEXES,
    RegexError,
    dtype_to_regex,
    validate_regex,
)
from sgl_lite.common.sampling_names import (
    LOGPROB_OPTION_NAMES,
    OPENAI_SPELLINGS,
    SAMPLING_PARAM_NAMES,
)
from sgl_lite.common.sequences import common_prefix_len

__all__ = [
    "DTYPE_REGEXES",
    "LOGPROB_OPTION_NAMES",
    "OPENAI_SPELLINGS",
    "SAMPLING_PARAM_NAMES",
    "RegexError",
    "common_prefix_len",
    "dtype_to_regex",
    "validate_regex",
]
