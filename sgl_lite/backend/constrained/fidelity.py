"""The last check before a constrained result is returned: does the text satisfy its constraint?

Regexes are matched with Python's `re.fullmatch`, JSON Schemas validated with `jsonschema`,
every format it knows checked (its `format-nongpl` extra: date-time, uri, hostname...). A
pattern Python cannot read is a violation, never a pass. The automaton should make a mismatch
impossible; when one happens anyway (a backend approximation, a stop string cutting the text)
it is reported, counted in `COUNTERS`, and never passed off as success. Nothing here knows
about requests or the engine.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema


class _Counters:
    """Process-wide counts of constrained outcomes, for /metrics (thread-safe)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Adds `n` to counter `name`."""
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter: budget_closed, constraint_violations, budget_refused."""
        with self._lock:
            return dict(self._counts)


COUNTERS = _Counters()


def check_output(kind: str, pattern: str | dict, text: str) -> str | None:
    """None when `text` satisfies the constraint, else a sentence saying how it does not."""
    if kind == "regex":
        try:
            compiled = _compiled_regex(str(pattern))
        except re.error as exc:
            return f"output cannot be checked: Python cannot read the regex {pattern!r} ({exc})"
        if compiled.fullmatch(text) is None:
            return f"output does not fully match the regex {pattern!r}"
        return None
    if kind == "json_schema":
        try:
            instance = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"output is not valid JSON: {exc}"
        import jsonschema  # NOTE: at first use (~1 s); GrammarCompiler warms it

        # NOTE: a request carries its schema as text: parsed once per text, not per output
        validator = _validator(pattern) if isinstance(pattern, str) else _new_validator(pattern)
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
        except re.error as exc:
            return f"output cannot be checked: the schema has a pattern Python cannot read ({exc})"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "the root"
        return f"output fails the schema at {where}: {error.message}"
    raise ValueError(f"constraint kind must be 'regex' or 'json_schema', got {kind!r}")


@functools.lru_cache(maxsize=256)
def _validator(text: str) -> Any:
    return _new_validator(json.loads(text))


def _new_validator(schema: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=_format_checker(cls))


@functools.lru_cache(maxsize=256)
def _compiled_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@functools.lru_cache(maxsize=8)
def _format_checker(cls: Any) -> jsonschema.FormatChecker:
    """The draft's format checker, with Draft 2020-12's checks for the formats it lacks (an
    older draft's `uuid`, `duration`...), which the backends enforce whatever the draft."""
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    latest = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    checker.checkers = {**latest, **cls.FORMAT_CHECKER.checkers}
    return checker
