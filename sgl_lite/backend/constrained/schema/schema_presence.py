"""Rewrites of what a schema says about which properties an object has, as `anyOf`s of
objects with some names required and others absent (`lacking`): `dependencies` with
`dependentRequired`/`dependentSchemas` (`dependency_branches`) and `not` of presence
(`negated_presence`). Both are exact; the normalizer (schema_normalize) decides where they
apply."""

from __future__ import annotations

from typing import Any

from sgl_lite.backend.constrained.regex_check import GrammarError
from sgl_lite.backend.constrained.schema.schema_merge import (
    ANNOTATIONS,
    Schema,
    lacking,
    merge_all,
)


def dependency_branches(deps: dict[str, Any]) -> list[Schema] | None:
    """The anyOf equal to `deps` (name → required names or a schema): one branch per choice of
    the trigger names present; None when a dependent schema does not merge."""
    names = list(deps)
    branches: list[Schema] = []
    for mask in range(1 << len(names)):
        present = [n for i, n in enumerate(names) if mask >> i & 1]
        absent = [n for n in names if n not in present]
        required = list(present)
        parts: list[Schema] = []
        for name in present:
            dep = deps[name]
            if isinstance(dep, list):
                required += [d for d in dep if d not in required]
            elif dep is False:
                break
            elif isinstance(dep, dict):
                parts.append(dep)
        else:
            if set(required) & set(absent):
                continue  # a present trigger requires an absent one
            branch: dict[str, Any] = lacking(absent)
            if required:
                branch["required"] = required
            try:
                merged = merge_all([branch, *parts], "/dependentSchemas") if parts else branch
            except GrammarError:
                return None
            if merged is not False:
                branches.append(merged)
    return branches or [False]


def negated_presence(negated: Any) -> list[list[Schema]] | None:
    """`not: negated` as a conjunction of anyOfs (their branch lists), where `negated` only
    says which properties are present: `{required: P}` or an `allOf` of such (all of P
    present), or an `anyOf` of those. Each anyOf is "an object lacking one name of P"; a
    non-object satisfies every `required`, so fails the `not`, and every branch is an object.
    None where `negated` says anything else (or nothing: `required: []` always holds)."""
    alternatives = _only(negated, "anyOf")
    groups = [_present(a) for a in (alternatives if alternatives is not None else [negated])]
    if not groups or any(not names for names in groups):
        return None
    return [
        [{"type": "object", **lacking([name])} for name in names]
        for names in groups
        if names is not None
    ]


def _present(schema: Any) -> list[str] | None:
    """The property names whose presence is all `schema` says (`required`, or an `allOf` of
    such), in order; None where it says anything else."""
    if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"required"}:
        names = schema["required"]
        return list(dict.fromkeys(names)) if all(isinstance(n, str) for n in names) else None
    parts = _only(schema, "allOf")
    if not parts:
        return None
    found = [_present(p) for p in parts]
    if any(f is None for f in found):
        return None
    return list(dict.fromkeys(name for names in found if names is not None for name in names))


def _only(schema: Any, keyword: str) -> list[Any] | None:
    """`schema[keyword]` where it is a list and all `schema` says besides annotations."""
    if not isinstance(schema, dict) or set(schema) - ANNOTATIONS != {keyword}:
        return None
    value = schema[keyword]
    return value if isinstance(value, list) else None
