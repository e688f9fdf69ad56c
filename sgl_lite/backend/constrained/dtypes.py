"""Regexes for `dtype=` constraints (int, float, bool, str), as SGLang defines them."""

from __future__ import annotations

REGEX_INT = r"[-+]?[0-9]+"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+"
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
