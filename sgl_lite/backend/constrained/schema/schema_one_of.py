"""The `oneOf` rewrites schema_normalize applies (branches made provably exclusive, so they can
be written as an `anyOf`), and the absent-property schema they and it use. `OneOfRewriter`
holds them for one root schema, beside the analysis they rest on (bare `$ref`s followed, the
types a sub-schema allows, `disjoint`: no instance matches both, sound and not complete):

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
  `oneOf` asks, and the branches can be written as an `anyOf`;
- `value_set`, `objects_apart` and `as_objects`: what the disjointness test reads
  beyond types and literals (an anchored literal `pattern` as the one string it allows; a
  property one branch requires and the other forbids; more required properties than the other
  allows) and the restriction of an untyped branch that only constrains objects to objects
  (`{"required": ["name"]}` beside `{"type": "array"}`: an array matches the first too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from sgl_lite.backend.constrained.regex_check import GrammarError
from sgl_lite.backend.constrained.schema.schema_merge import (
    ALL_TYPES,
    ANNOTATIONS,
    Schema,
    declared_types,
    lacking,
    literal_set,
    resolve_ref,
)

# NOTE: text in which no character is a regex metacharacter matches only itself
_ANCHORED_LITERAL = re.compile(r"\^([A-Za-z0-9_ /:@,-]*)\$")
# keywords that constrain objects only, and keywords that constrain another type only
_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties", "minProperties",
                              "maxProperties", "patternProperties", "propertyNames",
                              "dependencies", "dependentRequired", "dependentSchemas"})  # fmt: skip
_OTHER_TYPE_KEYWORDS = frozenset({"items", "prefixItems", "additionalItems", "contains",
                                  "minItems", "maxItems", "uniqueItems", "minLength",
                                  "maxLength", "pattern", "format", "minimum", "maximum",
                                  "exclusiveMinimum", "exclusiveMaximum",
                                  "multipleOf"})  # fmt: skip
MAX_LITERALS_CHECKED = 64  # an enum's values validated one by one against another oneOf branch


def never(schema: Any) -> bool:
    """Whether `schema` is a dict that accepts no instance by its `not` (`{}` or `true`)."""
    value = schema.get("not") if isinstance(schema, dict) else None
    return value is True or (isinstance(value, dict) and not value)


def discriminated(
    branches: list[Any], deref: Callable[[Any], Any], within: frozenset[str]
) -> tuple[str, list[Schema]] | None:
    """`(name, branches)`: the first property `name` (in the first branch's order) that every
    branch of `branches` (already followed through bare `$ref`s by the caller) gives a
    const/enum (or anchored literal pattern, see `value_set`) pairwise disjoint from the
    others', and the branches with `name` required;
    None where no property does. `within`: the types the node's own `type` allows (unless
    that is objects only, each branch is made an object: a non-object matches every branch,
    so fails the `oneOf`). `deref` follows a property's bare `$ref`."""
    objects_only = within <= {"object"}
    if len(branches) < 2 or not all(isinstance(b, dict) for b in branches):
        return None
    props = [b.get("properties") if isinstance(b.get("properties"), dict) else {} for b in branches]
    for name in props[0]:
        literals = [value_set(deref(p[name])) if name in p else None for p in props]
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
                branch.update(lacking(forbidden))
            out.append(branch)
    return out or [False]


def value_set(schema: Any) -> set[str] | None:
    """A superset of the values `schema` allows, as canonical JSON (see `literal_set`): its
    const/enum, or the one string a `type: string` schema's anchored literal `pattern` (`^Abs$`)
    matches; None when neither bounds it."""
    literals = literal_set(schema)
    if literals is not None or not isinstance(schema, dict) or schema.get("type") != "string":
        return literals
    found = _ANCHORED_LITERAL.fullmatch(str(schema.get("pattern")))
    return None if found is None else {json.dumps(found.group(1))}


def objects_apart(a: dict, b: dict, deref: Callable[[Any], Any]) -> bool:
    """Whether no object matches both `a` and `b` (sound, not complete): one requires a property
    the other forbids, or requires more properties than the other's `maxProperties`."""
    for one, other in ((a, b), (b, a)):
        required = _list(one.get("required"))
        if any(isinstance(name, str) and forbids(other, name, deref) for name in required):
            return True
        limit = other.get("maxProperties")
        if isinstance(limit, int) and min_properties(one, deref) > limit:
            return True
    return False


def forbids(schema: dict, name: str, deref: Callable[[Any], Any]) -> bool:
    """Whether an object matching `schema` cannot have the property `name`: its schema there
    is false, or it is left to an `additionalProperties` that is (no `patternProperties`, whose
    patterns might take it)."""
    props = schema.get("properties")
    if isinstance(props, dict) and name in props:
        target = deref(props[name])
        return target is False or never(target)
    if schema.get("patternProperties"):
        return False
    extra = schema.get("additionalProperties", True)
    return extra is False or never(extra)


def min_properties(schema: Any, deref: Callable[[Any], Any], depth: int = 0) -> int:
    """A lower bound on the property count of an object matching `schema`: its `required`
    names, its `minProperties`, and what every `anyOf`/`oneOf` branch or any `allOf` part asks."""
    schema = deref(schema)
    if not isinstance(schema, dict) or depth > 8:
        return 0
    least = schema.get("minProperties")
    count = len({n for n in _list(schema.get("required")) if isinstance(n, str)})
    count = max(count, least if isinstance(least, int) else 0)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            count = max(count, min(min_properties(b, deref, depth + 1) for b in branches))
    for part in _list(schema.get("allOf")):
        count = max(count, min_properties(part, deref, depth + 1))
    return count


def _list(value: Any) -> list[Any]:
    """`value` where it is a list, else no items (a malformed keyword constrains nothing here)."""
    return value if isinstance(value, list) else []


def as_objects(branch: Any, types: frozenset[str]) -> dict | None:
    """`branch` (whose instances have one of `types`) written for objects only where it
    declares no type and constrains objects only: a subset of it, without the non-objects it
    lets through unchecked; else None. Beside a `$ref` (which, up to draft 7, makes its sibling
    keywords ignored) as an `allOf`, so `type: object` holds in every draft."""
    if (
        not isinstance(branch, dict)
        or "object" not in types
        or {"type", "const", "enum"} & set(branch)
    ):
        return None
    if not _OBJECT_KEYWORDS & set(branch) or _OTHER_TYPE_KEYWORDS & set(branch):
        return None
    if "$ref" in branch:
        return {"type": "object", "allOf": [branch]}
    return {**branch, "type": "object"}


class OneOfRewriter:
    """The `oneOf` rewrites for one root schema, and the analysis they rest on: bare `$ref`s
    followed in the root, the types a sub-schema allows, provable disjointness of two
    sub-schemas. Each restriction it makes appends its sentence to `notes`."""

    def __init__(self, root: dict, notes: list[str]) -> None:
        self.root = root
        self.notes = notes
        self._validator: Any = None  # the root's validator, built at the first `_rejects`

    def rewrite(
        self, branches: list[Any], within: frozenset[str], where: str
    ) -> list[Schema] | None:
        """The branches of an `anyOf` to write for `oneOf: branches` (at `where`, under a node
        whose own `type` allows `within`): the branches as they are where they provably exclude
        each other, else a rewrite or a sound restriction; None where none applies."""
        resolved = [self.deref(b) for b in branches]
        apart = [
            all(self.disjoint(a, b, within) for j, b in enumerate(resolved) if j != i)
            for i, a in enumerate(resolved)
        ]
        if all(apart):
            new: list[Schema] | None = branches
        else:
            new = exclusive_required(resolved)
        found = None if new is not None else discriminated(resolved, self.deref, within)
        if found is not None:
            new = found[1]  # NOTE: a sound restriction, like the branch cut below
            self.notes.append(discriminated_note(where, found[0]))
        if new is None:
            new = self._apart_branches(branches, resolved, apart, within, where)
        return new

    def _apart_branches(
        self,
        branches: list[Any],
        resolved: list[Any],
        apart: list[bool],
        within: frozenset[str],
        where: str,
    ) -> list[Schema] | None:
        """A sound restriction of a `oneOf` whose branches may overlap: the branches disjoint
        from every other one (a value of one matches exactly one branch), an untyped branch
        that only constrains objects written as objects where that makes it disjoint (see
        `as_objects`); None where no branch is."""
        written: list[Any] = [b if ok else None for b, ok in zip(branches, apart)]
        narrowed = []
        if not within <= {"object"}:
            for i, branch in enumerate(resolved):
                objects = None if apart[i] else as_objects(branch, self.possible_types(branch, 0))
                others = (b for j, b in enumerate(resolved) if j != i)
                if objects is not None and all(self.disjoint(objects, b, within) for b in others):
                    written[i] = objects
                    narrowed.append(str(i))
        if all(b is None for b in written):
            return None
        dropped = [str(i) for i, b in enumerate(written) if b is None]
        parts = []
        if narrowed:  # NOTE: a non-object matches such a branch unchecked, so others too
            parts.append(f"branches {', '.join(narrowed)} are written as objects only")
        if dropped:
            parts.append(
                f"branches {', '.join(dropped)} may match one value together with another, so "
                "they are not written"
            )
        self.notes.append(f"oneOf at {where}: {'; '.join(parts)} (a subset of the valid values)")
        return [b for b in written if b is not None]

    # -- analysis --------------------------------------------------------------------------

    def deref(self, schema: Any, hops: int = 0) -> Any:
        """A bare local `$ref` followed to its target (a few hops at most); else unchanged."""
        while (
            isinstance(schema, dict)
            and set(schema) - ANNOTATIONS == {"$ref"}
            and hops < 8
            and isinstance(schema["$ref"], str)
            and schema["$ref"].startswith("#")
        ):
            try:
                schema, _ = resolve_ref(self.root, schema["$ref"], "")
            except GrammarError:
                return schema
            hops += 1
        return schema

    def possible_types(self, schema: Any, depth: int) -> frozenset[str]:
        """A superset of the JSON types an instance of `schema` can have."""
        schema = self.deref(schema)
        if not isinstance(schema, dict) or "$ref" in schema:
            return ALL_TYPES if schema is not False else frozenset()
        types = declared_types(schema)
        if depth > 8:
            return types
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                union: frozenset[str] = frozenset()
                for branch in schema[key]:
                    union |= self.possible_types(branch, depth + 1)
                types &= union
        for part in schema.get("allOf") or ():
            types &= self.possible_types(part, depth + 1)
        return types

    def disjoint(self, a: Any, b: Any, within: frozenset[str] = ALL_TYPES) -> bool:
        """Whether no instance of a type in `within` matches both (sound, not complete)."""
        types = self.possible_types(a, 0) & self.possible_types(b, 0) & within
        if not types:
            return True
        la, lb = value_set(a), value_set(b)
        if la is not None and lb is not None and not la & lb:
            return True
        if (la is not None and self._rejects(b, la)) or (lb is not None and self._rejects(a, lb)):
            return True
        # NOTE: a discriminator separates objects only: `required` holds for any non-object
        if types <= {"object"} and isinstance(a, dict) and isinstance(b, dict):
            pa, pb = a.get("properties") or {}, b.get("properties") or {}
            common = set(a.get("required") or ()) & set(b.get("required") or ())
            for name in common & set(pa) & set(pb):
                la, lb = value_set(self.deref(pa[name])), value_set(self.deref(pb[name]))
                if la is not None and lb is not None and not la & lb:
                    return True
            return objects_apart(a, b, self.deref)
        return False

    def _rejects(self, schema: Any, literals: set[str]) -> bool:
        """Whether `schema` (its `$ref`s read in the root) accepts none of `literals` (canonical
        JSON), by the validator itself; False where it cannot tell. Formats are not checked:
        accepting more only makes this answer False more often."""
        if len(literals) > MAX_LITERALS_CHECKED:
            return False
        if self._validator is None:
            import jsonschema

            self._validator = jsonschema.validators.validator_for(self.root)(self.root)
        try:
            check = self._validator.evolve(schema=schema)
            return not any(check.is_valid(json.loads(value)) for value in literals)
        except Exception:  # NOTE: an invalid or unresolvable sub-schema: cannot tell
            return False
