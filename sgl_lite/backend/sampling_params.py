"""SamplingParams: SGLang's per-request sampling settings, validated before a request is queued.

The fields of `SamplingParams` are `sgl_lite.common.SAMPLING_PARAM_NAMES`, the one list of
sampling-param names the frontend, the server and the builder all read (a unit test keeps the two
equal). Every refusal is an `InvalidRequest` naming the
param.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

import regex

from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.common import SAMPLING_PARAM_NAMES

# SGLang's max_new_tokens when a request leaves it out (the engine's and /generate's default).
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples and when it stops (SGLang's names and defaults)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None  # SGLang's context-free grammar (GBNF/EBNF or Lark), see constrained/
    # (token id, bias) pairs, sorted by id: OpenAI's logit_bias, frozen so params stay hashable
    logit_bias: tuple[tuple[int, float], ...] = ()
    # what the request's custom logit processor reads (scheduler/custom_logits.py); a JSON
    # object, left out of the hash (the params stay hashable)
    custom_params: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        checks = [
            ("max_new_tokens", self.max_new_tokens >= 0, ">= 0"),
            (
                "min_new_tokens",
                0 <= self.min_new_tokens <= max(self.max_new_tokens, 0),
                "between 0 and max_new_tokens",
            ),
            ("temperature", self.temperature >= 0, ">= 0 (0 means greedy)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 1, "-1 (off) or >= 1"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("repetition_penalty", 0 < self.repetition_penalty <= 2, "in (0, 2]"),
            ("n", self.n >= 1, ">= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise InvalidRequest(
                    name, f"sampling param {name} must be {allowed}, got {getattr(self, name)!r}"
                )
        given = [name for name in CONSTRAINT_NAMES if getattr(self, name) is not None]
        if len(given) > 1:
            # SGLang: "Only one of regex, json_schema, or ebnf can be set."
            raise InvalidRequest(
                given[0],
                f"sampling params {' and '.join(given)} are mutually exclusive; give one of "
                f"{', '.join(CONSTRAINT_NAMES)}",
            )
        for pattern in self.stop_regex:
            compile_stop_regex(pattern)
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidRequest(
                    "logit_bias", f"logit_bias keys must be token ids >= 0, got {token!r}"
                )
            if not math.isfinite(bias) or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise InvalidRequest(
                    "logit_bias",
                    f"logit_bias[{token}] must be a finite number in "
                    f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {bias!r}",
                )

    @property
    def is_greedy(self) -> bool:
        """Greedy decoding: temperature 0 or top_k 1."""
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        """Whether any repetition-style penalty applies."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1)

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(kind, pattern) for a constrained request (kind "regex", "json_schema" or "ebnf"),
        else None."""
        for name in CONSTRAINT_NAMES:
            pattern = getattr(self, name)
            if pattern is not None:
                return (name, pattern)
        return None

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Builds params from SGLang's JSON dict; an InvalidRequest names any bad field."""
        if params is None:
            return cls()
        if not isinstance(params, dict):
            raise InvalidRequest(
                "sampling_params", f"sampling_params must be a dict, got {type(params).__name__}"
            )
        unknown = sorted(set(params) - set(SAMPLING_PARAM_NAMES))
        if unknown:
            raise InvalidRequest(
                "sampling_params",
                f"unknown sampling param(s) {unknown}; known: {sorted(SAMPLING_PARAM_NAMES)}",
            )
        values = {k: v for k, v in params.items() if v is not None}
        for name, kind in _NUMBERS.items():
            if name in values:
                values[name] = _number(name, kind, values[name])
        for name in ("stop", "stop_regex"):
            if name in values:
                values[name] = _strings(name, values[name])
        if "stop_token_ids" in values:
            ids = values["stop_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise InvalidRequest(
                    "stop_token_ids", "sampling param stop_token_ids must be a list of ints"
                )
            values["stop_token_ids"] = tuple(ids)
        if isinstance(values.get("json_schema"), dict):
            values["json_schema"] = json.dumps(values["json_schema"])
        for name in CONSTRAINT_NAMES:
            if name in values and not isinstance(values[name], str):
                raise InvalidRequest(name, f"sampling param {name} must be a string")
        if "logit_bias" in values:
            values["logit_bias"] = _logit_bias(values["logit_bias"])
        if "custom_params" in values and not isinstance(values["custom_params"], dict):
            raise InvalidRequest(
                "custom_params",
                "sampling param custom_params must be a dict (a JSON object) for the custom "
                f"logit processor, got {type(values['custom_params']).__name__}",
            )
        return cls(**values)


# The sampling params that constrain the output; at most one per request (as SGLang).
CONSTRAINT_NAMES = ("regex", "json_schema", "ebnf")

# OpenAI's bound on a logit_bias value (-100 bans a token, +100 all but forces it)
LOGIT_BIAS_LIMIT = 100.0


# The numeric params and their type, read off the annotations ("int", "float", "int | None").
_NUMBERS: dict[str, type] = {
    f.name: {"int": int, "float": float}[str(f.type).split(" |")[0]]
    for f in fields(SamplingParams)
    if str(f.type).split(" |")[0] in ("int", "float")
}


def _number(name: str, kind: type, value: Any) -> int | float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise InvalidRequest(name, f"sampling param {name} must be {kind.__name__}, got {value!r}")
    return kind(value)


def _strings(name: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise InvalidRequest(
            name, f"sampling param {name} must be a non-empty string or a list of them"
        )
    return tuple(items)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{token id: bias}` (ids as ints or as the numeric strings JSON forces) as
    sorted pairs; the engine checks the ids against its vocabulary."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            "logit_bias", f"logit_bias must be a dict of token id -> bias, got {value!r}"
        )
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        token = key
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequest("logit_bias", f"logit_bias key {key!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise InvalidRequest(
                "logit_bias", f"logit_bias[{key!r}] must be a number, got {bias!r}"
            )
        if token in pairs:
            raise InvalidRequest("logit_bias", f"logit_bias names token {token} twice")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


@functools.lru_cache(maxsize=256)
def compile_stop_regex(pattern: str) -> regex.Pattern:
    """A stop_regex compiled (with the `regex` module, which can tell a partial match)."""
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise InvalidRequest(
            "stop_regex", f"stop_regex {pattern!r} is not a valid regular expression: {exc}"
        ) from None
    if compiled.fullmatch(""):
        raise InvalidRequest(
            "stop_regex", f"stop_regex {pattern!r} matches the empty string; it would stop at once"
        )
    return compiled
