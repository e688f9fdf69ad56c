"""A sound restriction of overlapping `patternProperties`, for llguidance.

llguidance compiles `patternProperties` only when no property name can match two of its
patterns (it refuses "patternProperty regexes /.*/ and /x/ are not disjoint"). JSON Schema
asks a name matching several patterns to satisfy every one of their schemas; `merged` writes
the patterns of such an object as one alternation whose schema is the `allOf` of them all. A
name matching one pattern then satisfies the others' schemas too: a subset of the valid
objects, so it is applied only after llguidance refused the schema as submitted.
"""

from __future__ import annotations

from typing import Any

# the keys whose values are data, not schemas: never rewritten
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})


def merged(schema: Any) -> tuple[Any, list[str]] | None:
    """(`schema` with every object's two or more `patternProperties` merged into one, the
    `constraint_notes` sentence of each merge); None where no object has two. A `$ref` into a
    `patternProperties` keeps it as it is (its target would move)."""
    referenced = _refs(schema)
    notes: list[str] = []
    out = _merge(schema, (), referenced, notes)
    return (out, notes) if notes else None


def _merge(node: Any, path: tuple[str, ...], referenced: list[str], notes: list[str]) -> Any:
    if isinstance(node, list):
        return [_merge(v, (*path, str(i)), referenced, notes) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {
        k: v if k in _DATA_KEYS else _merge(v, (*path, k), referenced, notes)
        for k, v in node.items()
    }
    patterns = out.get("patternProperties")
    where = "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)
    inside = f"#{where.rstrip('/')}/patternProperties"
    if (
        isinstance(patterns, dict)
        and len(patterns) > 1
        and not any(ref == inside or ref.startswith(inside + "/") for ref in referenced)
    ):
        # NOTE: patternProperties searches a name (unanchored); so does an alternation
        union = "|".join(f"(?:{p})" for p in patterns)
        out["patternProperties"] = {union: {"allOf": list(patterns.values())}}
        notes.append(
            f"patternProperties at {where}: a property name matching any of its "
            f"{len(patterns)} patterns is written to satisfy all their schemas (a subset of the "
            "valid values)"
        )
    return out


def _refs(node: Any) -> list[str]:
    """Every local `$ref` in `node`."""
    if isinstance(node, list):
        return [ref for v in node for ref in _refs(v)]
    if not isinstance(node, dict):
        return []
    own = node.get("$ref")
    found = [own] if isinstance(own, str) and own.startswith("#") else []
    for key, value in node.items():
        if key not in _DATA_KEYS:
            found += _refs(value)
    return found
