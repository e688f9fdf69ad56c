"""A request's output constraint from the body fields that set one: SGLang's `regex`,
`json_schema` and `ebnf`, and vLLM's legacy guided decoding fields, which alias them.

| vLLM field | the SGLang sampling param it becomes |
|---|---|
| `guided_json` (a schema, or its JSON text) | `json_schema` |
| `guided_regex` | `regex` |
| `guided_choice` (a list of strings) | `regex`: an alternation of the strings, each literal |
| `guided_grammar` (GBNF/EBNF or Lark) | `ebnf` |

At most one constraint per request: a second one (here, or chat's `response_format` and
required tool calls) is a 400 naming every field set. `guided_decoding_backend` and
`guided_whitespace_pattern` are `compat.py`'s (a no-op and a refusal).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from sgl_lite.server.openai.tools import regex_literal
from sgl_lite.server.protocol import ApiError

# the client's field -> the engine's sampling param; SGLang's own names map to themselves
CONSTRAINT_FIELDS = {
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf": "ebnf",
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "regex",
    "guided_grammar": "ebnf",
}


class Constraint(NamedTuple):
    """A request's constraint as the engine's sampling param, and the field the client named."""

    params: dict[str, str]  # {"regex": ...}, {"json_schema": ...}, {"ebnf": ...}, or {}
    aliases: dict[str, str]  # the engine's param -> the client's field, for error messages


NO_CONSTRAINT = Constraint({}, {})


def given_constraints(req: Any) -> list[str]:
    """The constraint fields `req` (a completions or chat body) sets, as the client spells them."""
    return [name for name in CONSTRAINT_FIELDS if getattr(req, name, None) is not None]


def require_one(given: list[str]) -> None:
    """A 400 naming every field in `given` when there are several: each sets the output's format."""
    if len(given) > 1:
        raise ApiError(
            400, f"give one of {' and '.join(given)}: each sets the output's format", param=given[0]
        )


def body_constraint(req: Any) -> Constraint:
    """The constraint of `req`'s SGLang or vLLM fields (a 400 if it sets more than one)."""
    given = given_constraints(req)
    require_one(given)
    if not given:
        return NO_CONSTRAINT
    name = given[0]
    param, value = CONSTRAINT_FIELDS[name], getattr(req, name)
    if name == "guided_choice":
        value = choice_regex(value)
    elif isinstance(value, dict):  # a JSON Schema given as an object
        value = json.dumps(value)
    return Constraint({param: value}, {param: name} if param != name else {})


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (vLLM's `guided_choice`)."""
    return "(" + "|".join(regex_literal(choice) for choice in choices) + ")"
