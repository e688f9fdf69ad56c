"""Rewrites of a JSON Schema into keywords the backends enforce, before any backend sees it.

Every rewrite here is exact (an instance is valid before if and only if it is valid after),
except the format rewrite, which narrows as every compiled format does (formats.py), and the
restrictions listed below:
- `oneOf` whose branches provably exclude each other (types, literals, an enum none of whose
  values the other branch accepts, a required property with disjoint literals, a property one
  requires and the other forbids, property counts) is `anyOf`; a `oneOf` of bare `required`
  lists ("exactly one of these keys") is an `anyOf` whose branches forbid the other keys
  (`properties: {k: false}`);
- `dependencies` / `dependentRequired` / `dependentSchemas` become an `anyOf` over which of the
  trigger keys are present (absent: `properties: {k: false}`);
- `not` of property presence (`not: {required: [a, b]}`, an `allOf` of such, an `anyOf` of
  such) becomes an object lacking one of them (an `anyOf` of absent-property branches), one
  such `anyOf` per `anyOf` branch negated (see `negated_presence`); `not` of values on an
  integer (`type: integer, not: {enum: [0]}`) an `anyOf` of the ranges between them;
- `propertyNames: {pattern: P}` on an object that lists no properties is
  `patternProperties: {P: <additionalProperties>}, additionalProperties: false`;
- a keyword that only constrains a type the node cannot have (`uniqueItems` beside
  `type: string`), `uniqueItems` when at most one item is allowed, and `propertyNames: true` are
  dropped: they hold for every instance;
- `format: uri-reference` / `format: regex` become a pattern for a subset of RFC 3986
  references / of regexes (text without metacharacters); the internationalized formats
  (`idn-email`, `iri`, `iri-reference`, `idn-hostname`) their ASCII forms, a subset (noted);
- sound restrictions (a subset of the valid instances, each described in `notes`):
  `uniqueItems` with `minItems` <= 1 becomes `maxItems: 1`; a `oneOf` whose branches each
  give one common property disjoint const/enum values, without requiring it, is an `anyOf` of
  the branches with that property required (schema_one_of); a `oneOf` whose branches
  are not all provably disjoint keeps, as an `anyOf`, the branches disjoint from every other
  one, an untyped branch that only constrains objects written as objects where that makes it
  disjoint;
- `minProperties: 1` beside a `required` name is dropped; with listed properties and none
  required it is an `anyOf` requiring one of them (a subset where other names are allowed);
- `not: {}` / `not: true` is `false` (schema_one_of.never);
- a count written as an integral float (`minLength: 2.0`) is that integer;
- a `format` no JSON Schema draft defines (`"datetime"`) is dropped: the specification makes an
  unknown format an annotation, and validators ignore it. Each drop is described in `notes`
  (the response's `constraint_notes`).
Anything else is left alone, to be enforced or refused by name by the backend. A rewrite is
skipped where a `$ref` points inside the keyword it would replace. The final validation always
uses the schema as submitted, never this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from sgl_lite.backend.constrained.schema.formats import KNOWN_FORMATS
from sgl_lite.backend.constrained.schema.keywords import schema_keywords
from sgl_lite.backend.constrained.schema.numbers import integer_gaps
from sgl_lite.backend.constrained.schema.schema_merge import (
    ANNOTATIONS,
    Schema,
    declared_types,
    literal_set,
)
from sgl_lite.backend.constrained.schema.schema_one_of import OneOfRewriter, never
from sgl_lite.backend.constrained.schema.schema_presence import (
    dependency_branches,
    negated_presence,
)

_SCHEMA_KEYS = ("additionalItems", "contains", "additionalProperties", "propertyNames", "not",
                "if", "then", "else", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP_KEYS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
# keywords that constrain only one instance type, and hold for every instance of another type
_ARRAY_ONLY = ("uniqueItems", "contains", "minContains", "maxContains", "additionalItems",
               "unevaluatedItems")  # fmt: skip
_OBJECT_ONLY = ("propertyNames", "dependencies", "dependentRequired", "dependentSchemas",
                "unevaluatedProperties", "patternProperties")  # fmt: skip
# the keywords whose values are instances, not schemas: never rewritten, never holding a $ref
DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
# the keys `_Normalizer.node` walks as keywords; a $ref may still point under any other key
_WALKED = frozenset({*_SCHEMA_KEYS, *_LIST_KEYS, *_MAP_KEYS, "items", "dependencies", *DATA_KEYS})
MAX_INLINED = 3  # oneOf branches copied from $ref targets rewritten within one another
MAX_NONEMPTY_BRANCHES = 8  # listed properties a `minProperties: 1` anyOf has a branch for
MAX_DEPENDENCY_KEYS = 4  # the anyOf has up to 2**n branches
_SEGMENT = "[A-Za-z0-9._~-]+"  # RFC 3986 unreserved characters, no ':' and no '%'
# NOTE: a relative or absolute path reference ("a/b", "/a/b/"): never "//", so never an
# authority, and no ':', so never a scheme. Absolute URIs are left out: their bounded pattern
# (formats.py) takes seconds to index, once per field.
URI_REFERENCE = f"/?{_SEGMENT}(/{_SEGMENT})*/?"
# NOTE: text without regex metacharacters is a regex (matching itself) in every dialect
REGEX = "[A-Za-z0-9_ -]*"
# the keywords whose value is a count: an integral float (`2.0`) is the same count (`2`)
COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
          "minContains", "maxContains")  # fmt: skip
EXTRA_FORMATS = {"uri-reference": URI_REFERENCE, "regex": REGEX}
# the internationalized formats, each a superset of its ASCII form (RFC 6531 over RFC 5321,
# RFC 3987 over RFC 3986, IDNA over RFC 1123 host names): written as the ASCII form, a subset
ASCII_FORMS = {"idn-email": "email", "iri": "uri", "iri-reference": "uri-reference",
               "idn-hostname": "hostname"}  # fmt: skip


# keywords that leave an object free: "any JSON object" (OpenAI's json_object, a tool whose
# parameters declare nothing)
_ANY_OBJECT_KEYS = {"type", "title", "description", "$schema", "$comment", "properties",
                    "additionalProperties"}  # fmt: skip


def is_any_object(schema: Any) -> bool:
    """Whether `schema` allows any JSON object: the automaton can only write a bounded subset of
    it (free values as scalars), so the compiler builds it with llguidance, as a real recursive
    grammar."""
    return (
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and set(schema) <= _ANY_OBJECT_KEYS
        and not schema.get("properties")
        and schema.get("additionalProperties", True) is True
    )


def normalize(schema: Any, notes: list[str] | None = None) -> Any:
    """The schema with the rewrites of this module applied (a new object; input untouched);
    what they leave unenforced or narrow is appended to `notes`, one sentence each."""
    if not isinstance(schema, dict):
        return schema
    # NOTE: new sub-schemas would change which properties/items count as evaluated; dropping
    # an annotation changes nothing
    structural = not schema_keywords(schema) & {"unevaluatedProperties", "unevaluatedItems"}
    return _Normalizer(schema, structural, notes).node(schema, ())


def is_unknown_format(name: Any) -> bool:
    """Whether `format: name` is an annotation: a name no draft defines and no validator checks."""
    import jsonschema

    return (
        isinstance(name, str)
        and name not in KNOWN_FORMATS
        and name not in jsonschema.FormatChecker.checkers
    )


def format_notes(schema: Any) -> list[str]:
    """The notes `normalize` gives the unknown formats of `schema`, for backends that read the
    schema as submitted (xgrammar ignores an unknown format too)."""
    notes: list[str] = []
    _Normalizer(schema if isinstance(schema, dict) else {}, False, notes).node(schema, ())
    return notes


def pointer(path: tuple[str, ...]) -> str:
    """`path` as a JSON pointer ("/" for the root)."""
    return "/" + "/".join(_escape(p) for p in path)


class _Normalizer:
    """Walks one root schema keyword by keyword; `protected` are the paths $refs point into.
    With `structural` False only annotations are dropped (unknown formats)."""

    def __init__(self, root: dict, structural: bool = True, notes: list[str] | None = None) -> None:
        self.root = root
        self.structural = structural
        self.notes = notes if notes is not None else []
        self.protected = ref_targets(root)
        self.one_of = OneOfRewriter(root, self.notes)
        self._inlined = 0  # oneOf branches copied from $ref targets being rewritten, nested

    def _referenced(self, path: tuple[str, ...], key: str) -> bool:
        """Whether some $ref points at or inside `path/key` (so it must keep its place)."""
        inner = (*path, key)
        return any(p[: len(inner)] == inner for p in self.protected)

    def node(self, schema: Any, path: tuple[str, ...]) -> Any:
        """The rewritten sub-schema at `path`."""
        if not isinstance(schema, dict):
            return schema
        out = dict(schema)
        for key in _SCHEMA_KEYS:
            if key in out:
                out[key] = self.node(out[key], (*path, key))
        if "items" in out:
            items = out["items"]
            if isinstance(items, list):
                out["items"] = [self.node(s, (*path, "items", str(i))) for i, s in enumerate(items)]
            else:
                out["items"] = self.node(items, (*path, "items"))
        for key in _LIST_KEYS:
            if isinstance(out.get(key), list):
                out[key] = [self.node(s, (*path, key, str(i))) for i, s in enumerate(out[key])]
        for key in (*_MAP_KEYS, "dependencies"):
            if isinstance(out.get(key), dict):
                out[key] = {
                    k: self.node(v, (*path, key, k)) if isinstance(v, (dict, bool)) else v
                    for k, v in out[key].items()
                }
        for key, value in out.items():
            if key not in _WALKED and isinstance(value, dict) and self._referenced(path, key):
                out[key] = self._referenced_part(value, (*path, key))
        # NOTE: not at the root, which the backends want as an object (a refusal names it)
        if path and self.structural and never(out) and not self._referenced(path, "not"):
            return False  # `not: {}`: nothing matches (`properties: {x: false}`: x is absent)
        return self._rewrite(out, path)

    def _referenced_part(self, part: dict, path: tuple[str, ...]) -> dict:
        """`part`, under a key no keyword names (`{"paypal": {"definitions": ...}}`), with the
        schemas $refs point at in it rewritten as every other schema is."""
        if path in self.protected:
            return self.node(part, path)
        return {
            k: self._referenced_part(v, (*path, k))
            if isinstance(v, dict) and self._referenced(path, k)
            else v
            for k, v in part.items()
        }

    def _rewrite(self, node: dict, path: tuple[str, ...]) -> dict:
        for key in COUNTS:
            if isinstance(node.get(key), float) and node[key].is_integer():
                node[key] = int(node[key])  # llguidance refuses `minLength: 2.0`
        fmt = node.get("format")
        if is_unknown_format(fmt):
            del node["format"]
            self.notes.append(
                f"format {fmt!r} at {pointer(path)} is not a format JSON Schema defines: it is an "
                "annotation and was not enforced"
            )
        if not self.structural:
            return node
        types = self.one_of.possible_types(node, 0)
        for key in (*_ARRAY_ONLY, *_OBJECT_ONLY):
            kind = "array" if key in _ARRAY_ONLY else "object"
            if key in node and kind not in types and not self._referenced(path, key):
                del node[key]  # vacuous: no instance of this node is of that type
        if node.get("uniqueItems") is False or (
            node.get("uniqueItems") is True and node.get("maxItems", 2) <= 1
        ):
            del node["uniqueItems"]
        elif (
            node.get("uniqueItems") is True
            and node.get("minItems", 0) <= 1
            and not self._referenced(path, "uniqueItems")
        ):
            # NOTE: a sound restriction: an array of at most one item has distinct items
            del node["uniqueItems"]
            node["maxItems"] = 1
            self.notes.append(
                f"uniqueItems at {pointer(path)}: arrays are written with at most one item "
                "(distinct items cannot be tracked; a subset of the valid arrays)"
            )
        if node.get("propertyNames") in (True, {}):
            del node["propertyNames"]
        self._property_names(node, path)
        self._dependencies(node, path)
        self._not(node, path)
        self._min_properties(node, path)
        self._one_of(node, path)
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt in ASCII_FORMS:
            node["format"] = ASCII_FORMS[fmt]
            self.notes.append(
                f"format {fmt!r} at {pointer(path)} is written as {ASCII_FORMS[fmt]!r} (ASCII "
                "only: a subset of the valid values)"
            )
            fmt = node["format"]
        if isinstance(fmt, str) and fmt in EXTRA_FORMATS and "pattern" not in node:
            del node["format"]
            node["pattern"] = f"^{EXTRA_FORMATS[fmt]}$"
        return node

    # -- the rewrites ----------------------------------------------------------------------

    def _property_names(self, node: dict, path: tuple[str, ...]) -> None:
        names = node.get("propertyNames")
        if not isinstance(names, dict) or self._referenced(path, "propertyNames"):
            return
        rest = {k for k in names if k not in ANNOTATIONS}
        if rest != {"pattern"} or node.get("properties") or node.get("patternProperties"):
            return
        if self._referenced(path, "additionalProperties"):
            return
        # NOTE: both keywords test names with an unanchored search, so one pattern serves both
        node["patternProperties"] = {names["pattern"]: node.get("additionalProperties", True)}
        node["additionalProperties"] = False
        del node["propertyNames"]

    def _dependencies(self, node: dict, path: tuple[str, ...]) -> None:
        deps: dict[str, Any] = {}
        keys = [k for k in ("dependencies", "dependentRequired", "dependentSchemas") if k in node]
        for key in keys:
            if not isinstance(node[key], dict) or self._referenced(path, key):
                return
            deps.update(node[key])
        if sum(len(node[k]) for k in keys) != len(deps):
            return  # NOTE: a name under two of them (both must hold): left to the backend
        if not deps or len(deps) > MAX_DEPENDENCY_KEYS:
            return
        branches = dependency_branches(deps)
        if branches is None:
            return
        for key in keys:
            del node[key]
        self._add_any_of(node, branches)

    def _not(self, node: dict, path: tuple[str, ...]) -> None:
        if "not" not in node or self._referenced(path, "not"):
            return
        conjuncts = negated_presence(node["not"])
        if conjuncts is None:
            excluded = excluded_integers(node, node["not"])
            if excluded is None:
                return
            conjuncts = [[*integer_gaps(excluded)]]
        del node["not"]
        for branches in conjuncts:
            self._add_any_of(node, branches)

    def _min_properties(self, node: dict, path: tuple[str, ...]) -> None:
        """`minProperties: 1` (a non-empty object): dropped beside a `required` name (exact);
        else one of the listed properties required, an anyOf (exact where no other name is
        allowed, else a subset, noted)."""
        props = node.get("properties")
        if node.get("minProperties") != 1 or self._referenced(path, "minProperties"):
            return
        if "maxProperties" in node:  # NOTE: the two together are read by the backends as a pair
            return
        if node.get("required"):
            del node["minProperties"]
            return
        if not isinstance(props, dict) or not props or len(props) > MAX_NONEMPTY_BRANCHES:
            return
        del node["minProperties"]
        self._add_any_of(node, [{"required": [name]} for name in props])
        if node.get("additionalProperties") is not False or node.get("patternProperties"):
            self.notes.append(
                f"minProperties at {pointer(path)}: objects are written with one of the listed "
                "properties at least (a subset of the valid objects)"
            )

    def _one_of(self, node: dict, path: tuple[str, ...]) -> None:
        branches = node.get("oneOf")
        if not isinstance(branches, list) or not branches or self._referenced(path, "oneOf"):
            return
        # NOTE: the node's own `type` already rules out the rest
        new = self.one_of.rewrite(branches, declared_types(node), pointer(path))
        if new is None:
            return
        del node["oneOf"]
        # NOTE: a branch the rewrite made from a $ref's target copies the target as submitted;
        # it is rewritten here like the target itself (a few copies deep: a recursive schema
        # would inline itself for ever)
        walked = {id(b) for b in branches}
        if self._inlined < MAX_INLINED:
            self._inlined += 1
            new = [
                b if id(b) in walked else self.node(b, (*path, "oneOf", str(i)))
                for i, b in enumerate(new)
            ]
            self._inlined -= 1
        self._add_any_of(node, new)

    @staticmethod
    def _add_any_of(node: dict, branches: list[Schema]) -> None:
        """`node` AND anyOf(branches), keeping an anyOf it already has."""
        if "anyOf" not in node:
            node["anyOf"] = branches
        else:
            node["allOf"] = [*node.get("allOf", []), {"anyOf": branches}]


def keyword_path(
    schema: Any, keyword: str, test: Callable[[Any], bool] | None = None
) -> str | None:
    """The JSON pointer of the first sub-schema using `keyword` (with a value that passes
    `test`, if given), for refusals that name only the keyword; None if there is none."""
    if not isinstance(schema, dict):
        return None
    if keyword in schema and (test is None or test(schema[keyword])):
        return "/"
    children: list[tuple[str, Any]] = [(k, schema[k]) for k in _SCHEMA_KEYS if k in schema]
    items = schema.get("items")
    if isinstance(items, list):
        children += [(f"items/{i}", s) for i, s in enumerate(items)]
    elif items is not None:
        children.append(("items", items))
    for key in _LIST_KEYS:
        if isinstance(schema.get(key), list):
            children += [(f"{key}/{i}", s) for i, s in enumerate(schema[key])]
    for key in (*_MAP_KEYS, "dependencies"):
        if isinstance(schema.get(key), dict):
            children += [(f"{key}/{_escape(k)}", s) for k, s in schema[key].items()]
    for where, child in children:
        found = keyword_path(child, keyword, test)
        if found is not None:
            return f"/{where}" + ("" if found == "/" else found)
    return None


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def excluded_integers(node: dict, negated: Any) -> set[int] | None:
    """The integers `not: negated` excludes where `node` is `type: integer` and `negated` only
    lists values (`not: {enum: [0]}`: a non-zero exit code); its non-integer values exclude no
    integer (1.0 is 1, `true` is not). None where either says anything else."""
    if node.get("type") != "integer" or literal_set(negated) is None:
        return None
    # NOTE: one of the two: beside each other only their common values are excluded
    if set(negated) - ANNOTATIONS not in ({"enum"}, {"const"}):
        return None
    values = [negated["const"]] if "const" in negated else negated["enum"]
    return {
        int(v)
        for v in values
        if (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    }


def ref_targets(schema: Any) -> set[tuple[str, ...]]:
    """Every local $ref target in `schema`, as a path of keys."""
    out: set[tuple[str, ...]] = set()
    _collect_refs(schema, out)
    return out


def _collect_refs(node: Any, out: set[tuple[str, ...]]) -> None:
    """Every local $ref target in `node`, as a path of keys."""
    if isinstance(node, list):
        for v in node:
            _collect_refs(v, out)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            parts = unquote(ref[1:]).split("/")[1:]
            out.add(tuple(p.replace("~1", "/").replace("~0", "~") for p in parts))
        for k, v in node.items():
            if k not in DATA_KEYS:
                _collect_refs(v, out)
