"""The DSL's constructors (SGLang's names): they validate their arguments and build IR only.

Mistakes that can be seen without running anything (an unknown argument, an invalid regex, a
role inside a role, a select without choices) raise here, where the program is written. The
top layer of the frontend's core: it imports the program layer, never a concrete backend.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from sgl_lite.common.regex import validate_regex
from sgl_lite.frontend import ir
from sgl_lite.frontend.choices import ChoicesMethod, as_choices_method, token_length_normalized
from sgl_lite.frontend.program import SglFunction
from sgl_lite.frontend.sampling import check_timeout

_GEN_ARGS = ("name", *ir.SAMPLING_FIELDS, "choices", "choices_method", "timeout")


def function(
    func: Callable | None = None, *, num_api_spec_tokens: int | None = None, **unknown: Any
) -> Any:
    """Decorator: `@sgl.function` or `@sgl.function(num_api_spec_tokens=...)`."""
    _reject_unknown("function", unknown, ("num_api_spec_tokens",))
    if func is None:
        return lambda f: SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)
    return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    ebnf: str | None = None,
    choices: Sequence[str] | None = None,
    choices_method: ChoicesMethod | None = None,
    timeout: float | None = None,
    **unknown: Any,
) -> ir.Gen | ir.Select:
    """Generates text into variable `name`; every argument falls back to the run() defaults.

    `choices=[...]` makes it a `select`. `dtype`, `regex`, `json_schema` and `ebnf` (a
    context-free grammar, SGLang's `ebnf` sampling param) constrain the output (at most one).
    `n=k` samples k alternatives: the variable holds the list of them and the program's text
    continues with the first (as SGLang). `stop_regex` stops generation at a match of any of
    the patterns (trimmed from the text like a stop string). `timeout` (seconds) bounds the
    step: past it the request is aborted and the program fails with StepTimeout.
    """
    _reject_unknown("gen", unknown, _GEN_ARGS)
    _check_name(name)
    timeout = check_timeout("gen", timeout)
    if choices is not None:
        return select(
            name, choices=choices, temperature=temperature or 0.0, choices_method=choices_method
        )
    if choices_method is not None:
        raise ValueError("gen(choices_method=...) needs choices=[...] too")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f"gen(n={n!r}) must be an int >= 1 (the number of alternatives)")
    stop_regex = _stop_regexes(stop_regex)
    given = [
        k
        for k, v in (
            ("dtype", dtype),
            ("regex", regex),
            ("json_schema", json_schema),
            ("ebnf", ebnf),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise ValueError(f"gen() takes at most one of dtype, regex, json_schema, ebnf; got {given}")
    if ebnf is not None and (not isinstance(ebnf, str) or not ebnf.strip()):
        raise ValueError(f"gen(ebnf=...) must be a non-empty grammar string, got {ebnf!r}")
    if isinstance(dtype, str):  # SGLang also takes the type's name
        by_name = {t.__name__: t for t in ir.DTYPES}
        if dtype not in by_name:  # dtype_regex's refusal, for a name
            raise ValueError(f"gen(dtype=...) must be one of int, float, bool, str; got {dtype!r}")
        dtype = by_name[dtype]
    if dtype is not None:
        ir.dtype_regex(dtype)  # raises for a dtype that has no pattern
    if regex is not None:
        validate_regex(regex)
    if json_schema is not None:
        json_schema = _schema_string(json_schema)
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"gen(max_tokens={max_tokens}) must be >= 0")
    if temperature is not None and temperature < 0:
        raise ValueError(f"gen(temperature={temperature}) must be >= 0")
    if stop is not None and not isinstance(stop, str):  # IR nodes are frozen: a tuple
        stop = tuple(stop)
    sampling = ir.SamplingArgs(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        n=n,
        stop=stop,
        stop_token_ids=tuple(stop_token_ids) if stop_token_ids is not None else None,
        stop_regex=stop_regex,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        dtype=dtype,
        regex=regex,
        json_schema=json_schema,
        ebnf=ebnf,
    )
    return ir.Gen(name=name, sampling=sampling, timeout=timeout)


def gen_int(name: str | None = None, **kwargs: Any) -> ir.Gen | ir.Select:
    """`gen(name, dtype=int, ...)`: an integer (the variable holds its text)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> ir.Gen | ir.Select:
    """`gen(name, dtype=str, ...)`: a double-quoted string."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesMethod | None = None,
    **unknown: Any,
) -> ir.Select:
    """Picks one of `choices` by scoring each as a continuation of the prompt."""
    _reject_unknown("select", unknown, ("name", "choices", "temperature", "choices_method"))
    _check_name(name)
    if choices is None or isinstance(choices, str) or len(choices) == 0:
        raise ValueError(f"select({name!r}) needs choices=[...], a non-empty list of strings")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select({name!r}) choices must be non-empty strings; got {choices!r}")
    if temperature and temperature > 1e-5:
        raise ValueError(
            f"select({name!r}, temperature={temperature}): select is greedy; "
            "only temperature=0 is supported (as in SGLang)"
        )
    method = token_length_normalized if choices_method is None else choices_method
    return ir.Select(
        name=name,
        choices=tuple(choices),
        temperature=0.0,
        choices_method=as_choices_method(method),
    )


def system(expr: Any = None) -> ir.Concat:
    """A system message holding `expr` (`s.system(...)` inside a program)."""
    return ir.role("system", expr)


def user(expr: Any = None) -> ir.Concat:
    """A user message holding `expr` (`s.user(...)` inside a program)."""
    return ir.role("user", expr)


def assistant(expr: Any = None) -> ir.Concat:
    """A assistant message holding `expr` (`s.assistant(...)` inside a program)."""
    return ir.role("assistant", expr)


def system_begin() -> ir.RoleBegin:
    """Opens a system message; close it with `system_end()`."""
    return ir.RoleBegin(role="system")


def system_end() -> ir.RoleEnd:
    """Closes the open system message."""
    return ir.RoleEnd(role="system")


def user_begin() -> ir.RoleBegin:
    """Opens a user message; close it with `user_end()`."""
    return ir.RoleBegin(role="user")


def user_end() -> ir.RoleEnd:
    """Closes the open user message."""
    return ir.RoleEnd(role="user")


def assistant_begin() -> ir.RoleBegin:
    """Opens a assistant message; close it with `assistant_end()`."""
    return ir.RoleBegin(role="assistant")


def assistant_end() -> ir.RoleEnd:
    """Closes the open assistant message."""
    return ir.RoleEnd(role="assistant")


# --- validation helpers --------------------------------------------------------------------
def _schema_string(schema: Any) -> str:
    if hasattr(schema, "model_json_schema"):  # a pydantic model class
        return json.dumps(schema.model_json_schema())
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
        return schema
    raise ValueError(
        f"json_schema must be a JSON str, a dict or a pydantic model; got {type(schema).__name__}"
    )


def _stop_regexes(stop_regex: Any) -> str | tuple[str, ...] | None:
    """`stop_regex` checked the way the engine will (a pattern that compiles and cannot match
    the empty string); a list becomes a tuple (IR nodes are frozen)."""
    if stop_regex is None:
        return None
    patterns = [stop_regex] if isinstance(stop_regex, str) else list(stop_regex)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(f"gen(stop_regex=...) takes a str or a list of str; got {pattern!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {exc}") from None
        if compiled.fullmatch(""):
            raise ValueError(
                f"stop_regex {pattern!r} matches the empty string; it would stop at once"
            )
    return stop_regex if isinstance(stop_regex, str) else tuple(patterns)


def _check_name(name: Any) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(
            f"a variable name must be a non-empty str; got {name!r} (the first "
            "argument of gen/select is the name: gen('answer', max_tokens=16))"
        )


def _reject_unknown(func: str, unknown: dict[str, Any], known: Sequence[str]) -> None:
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(
        f"{func}() got unknown argument(s) {', '.join(hints)}; it takes: {', '.join(known)}"
    )
