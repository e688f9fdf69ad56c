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

from sgl_lite.backend.constrained.schema.schema_normalize import DATA_KEYS, pointer, ref_targets


def merged(schema: Any) -> tuple[Any, list[str]] | None:
    """(`schema` with every object's two or more `patternProperties` merged into one, the
    `constraint_notes` sentence of each merge); None where no object has two. A `$ref` into a
    `patternProperties` keeps it as it is (its target would move)."""
    referenced = ref_targets(schema)
    notes: list[str] = []
    out = _merge(schema, (), referenced, notes)
    return (out, notes) if notes else None


def _merge(
    node: Any, path: tuple[str, ...], referenced: set[tuple[str, ...]], notes: list[str]
) -> Any:
    if isinstance(node, list):
        return [_merge(v, (*path, str(i)), referenced, notes) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {
        k: v if k in DATA_KEYS else _merge(v, (*path, k), referenced, notes)
        for k, v in node.items()
    }
    patterns = out.get("patternProperties")
    inside = (*path, "patternProperties")
    if (
        isinstance(patterns, dict)
        and len(patterns) > 1
        and not any(target[: len(inside)] == inside for target in referenced)
    ):
        # NOTE: patternProperties searches a name (unanchored); so does an alternation
        union = "|".join(f"(?:{p})" for p in patterns)
        out["patternProperties"] = {union: {"allOf": list(patterns.values())}}
        notes.append(
            f"patternProperties at {pointer(path)}: a property name matching any of its "
            f"{len(patterns)} patterns is written to satisfy all their schemas (a subset of the "
            "valid values)"
        )
    return out
