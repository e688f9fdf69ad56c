"""Regexes for `dtype=` constraints (int, float, bool, str): SGLang's, with bounded digits."""

from __future__ import annotations

from sgl_lite.backend.constrained.numbers import DTYPE_FLOAT_PATTERN, DTYPE_INT_PATTERN

# NOTE: bounded (at most 19 integer digits, see numbers.py); SGLang's are [-+]?[0-9]+ and
# [-+]?[0-9]*\.?[0-9]+, which let a model write digits until max_new_tokens.
REGEX_INT = DTYPE_INT_PATTERN
REGEX_FLOAT = DTYPE_FLOAT_PATTERN
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_TYPE_NAMES: dict[object, str] = {int: "int", float: "float", bool: "bool", str: "str"}
_BY_NAME = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}


def dtype_to_regex(dtype: type | str) -> str:
    """The regex for `int`, `float`, `bool` or `str` (the type or its name)."""
    name = dtype if isinstance(dtype, str) else _TYPE_NAMES.get(dtype)
    if name not in _BY_NAME:
        raise ValueError(
            f"dtype must be one of int, float, bool, str (or their names), got {dtype!r}"
        )
    return _BY_NAME[name]
