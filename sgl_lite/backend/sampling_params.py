"""SamplingParams: SGLang's per-request sampling settings, validated before a request is queued."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples and when it stops (SGLang's names and defaults)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None

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
                raise ValueError(
                    f"sampling param {name} must be {allowed}, got {getattr(self, name)!r}"
                )
        if self.regex is not None and self.json_schema is not None:
            raise ValueError(
                "sampling params regex and json_schema are mutually exclusive; give one"
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
        """("regex" | "json_schema", pattern) for a constrained request, else None."""
        if self.regex is not None:
            return ("regex", self.regex)
        if self.json_schema is not None:
            return ("json_schema", self.json_schema)
        return None

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Builds params from SGLang's JSON dict, with a ValueError naming any bad field."""
        if params is None:
            return cls()
        if not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown sampling param(s) {unknown}; known: {sorted(known)}")
        values = {k: v for k, v in params.items() if v is not None}
        types = {
            "max_new_tokens": int,
            "min_new_tokens": int,
            "top_k": int,
            "n": int,
            "temperature": float,
            "top_p": float,
            "min_p": float,
            "frequency_penalty": float,
            "presence_penalty": float,
            "repetition_penalty": float,
            "sampling_seed": int,
        }
        for name, kind in types.items():
            if name in values:
                value = values[name]
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or (kind is int and not float(value).is_integer())
                ):
                    raise ValueError(
                        f"sampling param {name} must be {kind.__name__}, got {value!r}"
                    )
                values[name] = kind(value)
        if "stop" in values:
            stop = values["stop"]
            stop = [stop] if isinstance(stop, str) else stop
            if not isinstance(stop, (list, tuple)) or not all(
                isinstance(s, str) and s for s in stop
            ):
                raise ValueError("sampling param stop must be a non-empty string or a list of them")
            values["stop"] = tuple(stop)
        if "stop_token_ids" in values:
            ids = values["stop_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ValueError("sampling param stop_token_ids must be a list of ints")
            values["stop_token_ids"] = tuple(ids)
        if isinstance(values.get("json_schema"), dict):
            values["json_schema"] = json.dumps(values["json_schema"])
        for name in ("regex", "json_schema"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"sampling param {name} must be a string")
        return cls(**values)
