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
    "multipleOf": "number",  # refused unless 1, which _number writes as integers
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
    """The canonical JSON of each value a const/enum schema allows (see `literal_key`); None
    when it is not a literal schema."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {literal_key(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {literal_key(v) for v in schema["enum"]}
    return None


def literal_key(value: Any) -> str:
    """`value` as canonical JSON: equal keys iff JSON Schema calls the values equal (1 and 1.0
    are one value; `true` and 1 are two, though Python's `==` says otherwise)."""
    return json.dumps(_canonical(value), sort_keys=True)


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
# keywords whose meaning depends on another of the same schema (additionalProperties applies to
# the names its own schema's properties leave out): merged together, per part
_OBJECT_KEYS = ("properties", "additionalProperties")
_ARRAY_KEYS = ("prefixItems", "items")


def merge_all(parts: list[Schema], path: str) -> Schema:
    """One schema equivalent to `allOf: parts` (False when they contradict): an instance is
    valid under it iff it is valid under every part.

    Raises UnsupportedSchema naming the keyword when two parts give it values that cannot be
    combined into one (two different patterns, two anyOf lists...).
    """
    if any(part is False for part in parts):
        return False
    dicts = [numeric_bounds(part) for part in parts if isinstance(part, dict)]
    merged: dict[str, Any] = {}
    for part in dicts:
        for key, value in part.items():
            if key in _OBJECT_KEYS or key in _ARRAY_KEYS:
                continue
            if key not in merged:
                merged[key] = value
            elif key in ANNOTATIONS or literal_key(merged[key]) == literal_key(value):
                continue
            elif key == "required":
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "allOf":
                merged[key] = [*merged[key], *value]
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
                allowed = {literal_key(v) for v in value}
                merged[key] = [v for v in merged[key] if literal_key(v) in allowed]
                if not merged[key]:
                    return False
            elif key == "const":
                return False  # two different constants
            else:
                raise unsupported("allOf", path, f"cannot combine two different '{key}' values")
    for keys in (_OBJECT_KEYS, _ARRAY_KEYS):
        merged.update(_per_member(dicts, *keys, path))
    return merged


def _per_member(dicts: list[dict], named: str, rest: str, path: str) -> dict[str, Any]:
    """`properties`/`additionalProperties` (or `prefixItems`/`items`) of the allOf of `dicts`:
    each member (a property name, an item index) gets the allOf of what every part says of
    it, its own entry in `named` or else that part's `rest`; `rest` gets the allOf of theirs.
    (Merging `named` alone would let one part's `additionalProperties: false` admit another
    part's properties.)"""
    parts = [p for p in dicts if named in p or rest in p]
    if len(parts) == 1:
        return {k: parts[0][k] for k in (named, rest) if k in parts[0]}
    out: dict[str, Any] = {}
    if not parts:
        return out
    if any(isinstance(p.get(rest), list) for p in parts):
        raise unsupported(rest, path, f"'{rest}' as a list under allOf; use prefixItems")
    if named == "properties":
        members: list[Any] = list(dict.fromkeys(n for p in parts for n in p.get(named, {})))
    else:
        members = list(range(max(len(p.get(named, [])) for p in parts)))
    if any(named in p for p in parts):
        merged = {m: _all([_member(p, named, rest, m) for p in parts]) for m in members}
        out[named] = merged if named == "properties" else list(merged.values())
    if any(rest in p for p in parts):
        out[rest] = _all([p.get(rest, True) for p in parts])
    return out


def _member(part: dict, named: str, rest: str, member: str | int) -> Schema:
    """What `part` says of one property name (or item index): its entry in `named`, else `rest`."""
    listed = part.get(named, {} if named == "properties" else [])
    if member in listed if isinstance(member, str) else member < len(listed):
        return listed[member]
    return part.get(rest, True)


def _all(schemas: list[Schema]) -> Schema:
    """`allOf: schemas`, written plainly where it can be (False if one is, `true`s dropped)."""
    if any(s is False for s in schemas):
        return False
    kept = [s for s in schemas if s is not True and s != {}]
    if not kept:
        return True
    return kept[0] if len(kept) == 1 else {"allOf": kept}


def _type_set(t: Any) -> set[str]:
    types = {t} if isinstance(t, str) else set(t)
    if "number" in types:
        types.add("integer")  # every integer is a number
    return types
