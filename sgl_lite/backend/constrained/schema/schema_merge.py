"""Schema algebra for the JSON Schema compiler: local `$ref`, `allOf` merging, `oneOf` disjointness.

Pure functions over schema dicts; errors are GrammarError naming the keyword and its path.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from sgl_lite.backend.constrained.regex_check import GrammarError, UnsupportedSchema

Schema = dict[str, Any] | bool
ALL_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "$defs",
        "definitions",
    }
)
# Standard keywords the regex backend cannot enforce, with why: refused wherever they appear.
REFUSED = {
    "not": "negation cannot be compiled into the automaton",
    "if": "conditional schemas (if/then/else) are not compiled",
    "then": "conditional schemas (if/then/else) are not compiled",
    "else": "conditional schemas (if/then/else) are not compiled",
    "patternProperties": "property names matched by pattern are not compiled",
    "propertyNames": "constraints on property names are not compiled",
    "dependentRequired": "property dependencies are not compiled",
    "dependentSchemas": "property dependencies are not compiled",
    "dependencies": "property dependencies are not compiled",
    "unevaluatedProperties": "unevaluated-property tracking is not compiled",
    "unevaluatedItems": "unevaluated-item tracking is not compiled",
    "contains": "'contains' is not compiled",
    "minContains": "'contains' is not compiled",
    "maxContains": "'contains' is not compiled",
    "additionalItems": "use prefixItems and items (2020-12)",
    "$dynamicRef": "dynamic references are not resolved",
    "$recursiveRef": "recursive references are not resolved; use a local $ref",
}
# Keywords that imply the instance type when "type" is absent.
TYPE_HINTS = {
    "properties": "object",
    "required": "object",
    "additionalProperties": "object",
    "minProperties": "object",
    "maxProperties": "object",
    "items": "array",
    "prefixItems": "array",
    "minItems": "array",
    "maxItems": "array",
    "minLength": "string",
    "maxLength": "string",
    "pattern": "string",
    "format": "string",
    "minimum": "number",
    "maximum": "number",
    "exclusiveMinimum": "number",
    "exclusiveMaximum": "number",
}


def unsupported(keyword: str, path: str, why: str) -> UnsupportedSchema:
    """The refusal every unsupported keyword gets: its name, its path, and why."""
    return UnsupportedSchema(
        f"json_schema keyword '{keyword}' at {path or '/'} is not supported: {why}"
    )


def resolve_ref(root: Any, ref: str, path: str) -> tuple[Schema, str]:
    """The schema a local `$ref` points to, and its path. Raises GrammarError otherwise."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise unsupported("$ref", path, f"only local references ('#/...') resolve, got {ref!r}")
    pointer = unquote(ref[1:])
    if pointer and not pointer.startswith("/"):
        raise unsupported("$ref", path, f"anchor references ({ref!r}) are not resolved")
    node = root
    for part in pointer.split("/")[1:] if pointer else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise GrammarError(f"json_schema $ref {ref!r} at {path or '/'} does not resolve")
    if not isinstance(node, (dict, bool)):
        raise GrammarError(f"json_schema $ref {ref!r} at {path or '/'} is not a schema")
    return node, pointer


def lacking(names: list[str]) -> dict[str, Any]:
    """The keywords of an object in which none of `names` is present: each listed as `false`,
    and `additionalProperties: true` said outright, because llguidance's closed_objects would
    otherwise close an object that lists properties and so forbid every other name too (so
    said even where `names` is empty)."""
    keywords: dict[str, Any] = {"additionalProperties": True}
    if names:
        keywords["properties"] = dict.fromkeys(names, False)
    return keywords


def declared_types(schema: Schema) -> frozenset[str]:
    """The instance types a schema accepts: from `type` and `const`/`enum`, else all."""
    if schema is False:
        return frozenset()
    if schema is True:
        return ALL_TYPES
    t = schema.get("type")
    if isinstance(t, str):
        types = {t}
    elif isinstance(t, list):
        types = set(t)
    else:
        types = set(ALL_TYPES)  # NOTE: keywords like "properties" do not exclude other types
    if "integer" in types or "number" in types:
        types |= {"integer", "number"}  # NOTE: 1 is both, so integer and number overlap
    for key in ("const", "enum"):
        if key in schema:
            values = [schema["const"]] if key == "const" else schema["enum"]
            literal_types = {_json_type(v) for v in values}
            if literal_types & {"integer", "number"}:
                literal_types |= {"integer", "number"}
            types &= literal_types
    return frozenset(types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def literal_set(schema: Any) -> set[str] | None:
    """The canonical JSON of each value a const/enum schema allows (1 and 1.0 are one value);
    None when it is not a literal schema."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {json.dumps(_canonical(schema["const"]), sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(_canonical(v), sort_keys=True) for v in schema["enum"]}
    return None


def _canonical(value: Any) -> Any:
    """`value` with integral floats as ints: JSON Schema compares numbers by value."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def disjoint(a: Schema, b: Schema) -> bool:
    """Whether no instance can match both schemas, by types, literals or a required
    discriminator property with disjoint literals (a sound check, not a complete one)."""
    if not declared_types(a) & declared_types(b):
        return True
    la, lb = literal_set(a), literal_set(b)
    if la is not None and lb is not None and not la & lb:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        common = set(a.get("required") or ()) & set(b.get("required") or ()) & set(pa) & set(pb)
        for name in common:
            la, lb = literal_set(pa[name]), literal_set(pb[name])
            if la is not None and lb is not None and not la & lb:
                return True
    return False


def numeric_bounds(schema: dict) -> dict:
    """Draft 4's boolean exclusiveMinimum/exclusiveMaximum (a flag on the bound beside it) as
    the numeric bounds of later drafts."""
    out = dict(schema)
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(flag), bool) and out.pop(flag) and bound in out:
            out[flag] = out.pop(bound)
    return out


_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


def merge_all(parts: list[Schema], path: str) -> Schema:
    """One schema equivalent to `allOf: parts` (False when they contradict).

    Raises GrammarError naming the keyword when two parts give it values that cannot be
    combined into one (two different patterns, two anyOf lists...).
    """
    merged: dict[str, Any] = {}
    for part in parts:
        if part is True:
            continue
        if part is False:
            return False
        for key, value in part.items():
            if key not in merged:
                merged[key] = value
            elif key in ANNOTATIONS or merged[key] == value:
                continue
            elif key == "properties":
                props = dict(merged[key])
                for name, sub in value.items():
                    props[name] = {"allOf": [props[name], sub]} if name in props else sub
                merged[key] = props
            elif key == "required":
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "type":
                types = _type_set(merged[key]) & _type_set(value)
                if not types:
                    return False
                merged[key] = sorted(types)
            elif key in _LOWER_BOUNDS:
                merged[key] = max(merged[key], value)
            elif key in _UPPER_BOUNDS:
                merged[key] = min(merged[key], value)
            elif key == "enum":
                keep = [v for v in merged[key] if v in value]
                if not keep:
                    return False
                merged[key] = keep
            elif key == "const":
                return False  # two different constants
            elif key in ("items", "additionalProperties") and isinstance(value, (dict, bool)):
                merged[key] = {"allOf": [merged[key], value]}
            else:
                raise unsupported("allOf", path, f"cannot combine two different '{key}' values")
    return merged


def _type_set(t: Any) -> set[str]:
    types = {t} if isinstance(t, str) else set(t)
    if "number" in types:
        types.add("integer")  # every integer is a number
    return types
