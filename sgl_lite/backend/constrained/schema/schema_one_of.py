"""The `oneOf` rewrites schema_normalize applies (branches made provably exclusive, so they can
be written as an `anyOf`), and the absent-property schema they and it use:

- `exclusive_required`: a `oneOf` of bare `required` lists, exactly (see its docstring);
- `never`: a schema with `not: {}` or `not: true` accepts nothing (exact: it is `false`, so
  `properties: {x: {"not": {}}}` says, as `x: false` does, that `x` must be absent, which
  both backends write by leaving `x` out);
- `discriminated`: a sound restriction of a `oneOf` whose branches each give one common
  property a const/enum, pairwise disjoint, without requiring it (JSONSchemaBench's
  Glaiveai2K/calculate_area: `shape` is `circle`, `rectangle` or `triangle`). As written,
  an object without that property matches every branch, so such branches may overlap; with
  the property also required (and the branch an object), a value matching branch i carries
  one of i's literals, which every other branch refuses: it matches exactly one branch, as
  `oneOf` asks, and the branches can be written as an `anyOf`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_lite.backend.constrained.schema.schema_merge import ANNOTATIONS, Schema, literal_set


def never(schema: Any) -> bool:
    """Whether `schema` is a dict that accepts no instance by its `not` (`{}` or `true`)."""
    value = schema.get("not") if isinstance(schema, dict) else None
    return value is True or (isinstance(value, dict) and not value)


def discriminated(
    branches: list[Any], deref: Callable[[Any], Any], within: frozenset[str]
) -> tuple[str, list[Schema]] | None:
    """`(name, branches)`: the first property `name` (in the first branch's order) that every
    branch of `branches` (already followed through bare `$ref`s by the caller) gives a
    const/enum pairwise disjoint from the others', and the branches with `name` required;
    None where no property does. `within`: the types the node's own `type` allows (unless
    that is objects only, each branch is made an object: a non-object matches every branch,
    so fails the `oneOf`). `deref` follows a property's bare `$ref`."""
    objects_only = within <= {"object"}
    if len(branches) < 2 or not all(isinstance(b, dict) for b in branches):
        return None
    props = [b.get("properties") if isinstance(b.get("properties"), dict) else {} for b in branches]
    for name in props[0]:
        literals = [literal_set(deref(p[name])) if name in p else None for p in props]
        if any(lits is None for lits in literals):
            continue
        sets = [lits for lits in literals if lits is not None]
        if any(sets[i] & sets[j] for i in range(len(sets)) for j in range(i + 1, len(sets))):
            continue
        out = [_required(b, name, objects_only) for b in branches]
        if all(b is not None for b in out):
            return name, [b for b in out if b is not None]
    return None


def _required(branch: dict, name: str, objects_only: bool) -> dict | None:
    """`branch` with `name` required and, unless `objects_only`, `type: object` (a subset of
    its own `type`); None where that `type` leaves objects out."""
    out = dict(branch)
    required = list(out.get("required") or [])
    if name not in required:
        out["required"] = [*required, name]
    if not objects_only:
        kind = out.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            return None
        out["type"] = "object"
    return out


def discriminated_note(where: str, name: str) -> str:
    """The `constraint_notes` sentence for `discriminated`'s restriction of the oneOf at `where`."""
    return (
        f"oneOf at {where}: every branch is written with its property {name!r} present, whose "
        "const/enum tells the branches apart (a subset of the valid values)"
    )


def exclusive_required(branches: list[Any]) -> list[Schema] | None:
    """`oneOf` of bare `required` lists as an anyOf: branch i requires its names and lacks one
    name of every other branch (a single one: then `properties: {name: false}` says it); None
    where that does not apply."""
    sets = []
    for b in branches:
        if not isinstance(b, dict) or set(b) - ANNOTATIONS != {"required"}:
            return None
        sets.append(list(dict.fromkeys(b["required"])))
    out: list[Schema] = []
    for i, own in enumerate(sets):
        forbidden: list[str] = []
        for j, other in enumerate(sets):
            if j == i:
                continue
            missing = [n for n in other if n not in own]
            if not missing:
                break  # whenever branch i holds, branch j does too: never exactly one
            if len(missing) > 1:
                return None
            forbidden.append(missing[0])
        else:
            if set(forbidden) & set(own):
                continue
            # NOTE: `type` because a non-object satisfies every branch, so fails a oneOf of two
            branch: dict[str, Any] = {"type": "object", "required": own}
            if forbidden:
                branch["properties"] = dict.fromkeys(forbidden, False)
                branch["additionalProperties"] = True  # see closed_objects
            out.append(branch)
    return out or [False]
