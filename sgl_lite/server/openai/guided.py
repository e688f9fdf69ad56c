"""A request's output constraint from the body fields that set one: SGLang's `regex`,
`json_schema` and `ebnf`, and vLLM's legacy guided decoding fields, which alias them.

| vLLM field | the SGLang sampling param it becomes |
|---|---|
| `guided_json` (a schema, or its JSON text) | `json_schema` |
| `guided_regex` | `regex` |
| `guided_choice` (a list of strings) | `regex`: an alternation of the strings, each literal |
| `guided_grammar` (GBNF/EBNF or Lark) | `ebnf` |

vLLM 0.12 replaced those fields with one object, `structured_outputs`, whose keys alias the
same params: `json` → `json_schema`, `regex` → `regex`, `choice` → `regex` (as
`guided_choice`), `grammar` → `ebnf`, `json_object: true` → `json_schema` `{"type": "object"}`
(as `response_format` `json_object`). Its options: `disable_fallback` is accepted either way
(a constraint is built by the server's one grammar backend or refused, never handed to another);
`structural_tag`, `whitespace_pattern`, and `disable_any_whitespace` or
`disable_additional_properties` set true are a 400 naming the key.

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

# vLLM's `structured_outputs` keys -> the engine's sampling param
STRUCTURED_OUTPUTS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "regex",
    "grammar": "ebnf",
    "json_object": "json_schema",
}
# its keys refused when set (to anything but their default), and why
STRUCTURED_OUTPUTS_REFUSED = {
    "structural_tag": "structural tags are not implemented; use tools or a json schema",
    "whitespace_pattern": "JSON whitespace is set for every request by the server's "
    "--constrained-json-whitespace-pattern, not per request",
    "disable_any_whitespace": "JSON whitespace is set for every request by the server's "
    "--constrained-json-whitespace-pattern, not per request",
    "disable_additional_properties": "a schema's additionalProperties is enforced as written; "
    "set it to false in the schema",
}
ANY_OBJECT = json.dumps({"type": "object"})


def given_constraints(req: Any) -> list[str]:
    """The constraint fields `req` (a completions or chat body) sets, as the client spells them
    (`structured_outputs.json` for a key of vLLM's object); a 400 naming a refused key of
    that object."""
    given = [name for name in CONSTRAINT_FIELDS if getattr(req, name, None) is not None]
    return given + _structured_outputs(getattr(req, "structured_outputs", None))


def _structured_outputs(obj: Any) -> list[str]:
    """The constraint keys set in vLLM's `structured_outputs` object, as dotted names."""
    if obj is None:
        return []
    for key, why in STRUCTURED_OUTPUTS_REFUSED.items():
        if getattr(obj, key) not in (None, False):
            field = f"structured_outputs.{key}"
            raise ApiError(400, f"{field} is not supported: {why}", param=field)
    values = _structured_values(obj)
    return [f"structured_outputs.{key}" for key in STRUCTURED_OUTPUTS if values[key] is not None]


def _structured_values(obj: Any) -> dict[str, Any]:
    """The constraint keys' values of a `StructuredOutputs` (`json_object: false` is unset)."""
    return {
        "json": obj.json_,
        "regex": obj.regex,
        "choice": obj.choice,
        "grammar": obj.grammar,
        "json_object": True if obj.json_object else None,
    }


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
    if name.startswith("structured_outputs."):
        key = name.split(".", 1)[1]
        param, value = STRUCTURED_OUTPUTS[key], _structured_values(req.structured_outputs)[key]
        if key == "choice":
            value = choice_regex(value)
        elif key == "json_object":
            value = ANY_OBJECT
        elif isinstance(value, dict):
            value = json.dumps(value)
        return Constraint({param: value}, {param: name})
    param, value = CONSTRAINT_FIELDS[name], getattr(req, name)
    if name == "guided_choice":
        value = choice_regex(value)
    elif isinstance(value, dict):  # a JSON Schema given as an object
        value = json.dumps(value)
    return Constraint({param: value}, {param: name} if param != name else {})


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (vLLM's `guided_choice`)."""
    return "(" + "|".join(regex_literal(choice) for choice in choices) + ")"
