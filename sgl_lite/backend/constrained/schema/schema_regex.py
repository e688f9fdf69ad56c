"""JSON Schema → regex, keyword by keyword: every keyword is enforced or refused, never dropped.

Each node compiles to a regex for a subset of the JSON texts the schema accepts (the subset is
what a small model should write: properties in declared order, canonical numbers with bounded
digits, no extra properties), or to None when the subset is empty (an empty range, recursion past
the bound), which optional parents drop and required parents propagate. Keywords in REFUSED, and
combinations the regex cannot express exactly, raise GrammarError naming the keyword and its
path. Annotations and keywords outside JSON Schema are ignored, as `jsonschema` ignores them.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from sgl_lite.backend.constrained.regex_check import (
    GrammarError,
    UnsupportedSchema,
    check_regex,
    pattern_body,
)
from sgl_lite.backend.constrained.schema.formats import STRING_FORMATS
from sgl_lite.backend.constrained.schema.numbers import (
    INT_MAX_DIGITS,
    NUMBER_FRAC_DIGITS,
    NUMBER_INT_DIGITS,
    int_range_pattern,
    number_range_pattern,
)
from sgl_lite.backend.constrained.schema.schema_merge import (
    ANNOTATIONS,
    REFUSED,
    TYPE_HINTS,
    Schema,
    disjoint,
    merge_all,
    numeric_bounds,
    resolve_ref,
    unsupported,
)
from sgl_lite.backend.constrained.schema.string_pattern import json_pattern

MAX_REF_DEPTH = 3  # how many times one $ref may recurse into itself on a path
MAX_REGEX_CHARS = 100_000  # larger regexes take minutes to index: refused instead
# NOTE: a value the schema leaves free is written as a JSON scalar (a valid subset): nested any-
# values multiply the automaton (depth 1 alone takes ~1.5 s to index on SmolLM2's vocabulary).
ANY_VALUE_DEPTH = 0
STRING_CHAR = r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
_META = set(r"\.^$|?*+()[]{}")


def _esc(text: str) -> str:
    """Escapes regex metacharacters (only those: outlines-core rejects needless escapes)."""
    return "".join("\\" + c if c in _META else c for c in text)


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


class SchemaRegex:
    """Compiles one JSON Schema (`root`) into a regex with a fixed whitespace layout.

    `whitespace` None is json.dumps' layout (", " and ": ", nothing else); a pattern puts that
    pattern at every place JSON allows whitespace.
    """

    def __init__(self, root: Schema, *, whitespace: str | None = None) -> None:
        self.root = root
        if whitespace is None:
            w, self._sep = "", (", ", ": ")
        else:
            w, self._sep = f"({whitespace})", (",", ":")
        self.open_obj, self.close_obj = r"\{" + w, w + r"\}"
        self.open_arr, self.close_arr = r"\[" + w, w + r"\]"
        self.comma = w + _esc(",") + (" " if whitespace is None else "") + w
        self.colon = w + ":" + (" " if whitespace is None else "") + w

    def compile(self) -> str:
        """The regex for the whole schema; GrammarError if it admits no value here."""
        regex = self.node(self.root, "", ())
        if regex is None:
            raise UnsupportedSchema(
                "json_schema admits no value the regex backend can produce (an empty range or "
                f"enum, a false sub-schema, or recursion deeper than {MAX_REF_DEPTH})"
            )
        return regex

    # -- dispatch ------------------------------------------------------------------------

    def node(self, schema: Any, path: str, refs: tuple[str, ...]) -> str | None:
        """Regex for `schema` at `path` (None: no value); `refs` is the $ref chain above it."""
        regex = self._node(schema, path, refs)
        if regex is not None and len(regex) > MAX_REGEX_CHARS:
            # NOTE: bottom-up, so this stops the growth (recursive $refs expand exponentially)
            # long before memory runs out.
            raise UnsupportedSchema(
                f"json_schema at {path or '/'} expands to a regex over {MAX_REGEX_CHARS} "
                "characters (recursive $refs or many optional properties); the llguidance "
                "grammar backend compiles it without expansion"
            )
        return regex

    def _node(self, schema: Any, path: str, refs: tuple[str, ...]) -> str | None:
        if schema is True:
            return self.any_value(ANY_VALUE_DEPTH)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise GrammarError(f"json_schema at {path or '/'} must be an object or a boolean")
        for key in schema:
            if key in REFUSED:
                raise unsupported(key, path, REFUSED[key])
        if "$ref" in schema:
            ref = schema["$ref"]
            target, pointer = resolve_ref(self.root, ref, path)
            if refs.count(ref) >= MAX_REF_DEPTH:
                return None
            rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
            merged = merge_all([target, rest], path) if rest else target
            return self.node(merged, pointer, (*refs, ref))
        if "allOf" in schema:
            parts = [self._deref(p, f"{path}/allOf/{i}") for i, p in enumerate(schema["allOf"])]
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.node(merge_all([rest, *parts], f"{path}/allOf"), path, refs)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._alternatives(schema, key, path, refs)
        if "const" in schema or "enum" in schema:
            return self._literals(schema, path)
        types = schema.get("type")
        if types is None:
            hinted = sorted({TYPE_HINTS[k] for k in schema if k in TYPE_HINTS})
            if not hinted:
                return self.any_value(ANY_VALUE_DEPTH)
            types = hinted
        if isinstance(types, list):
            parts = [self._typed(schema, t, path, refs) for t in dict.fromkeys(types)]
            kept = [p for p in parts if p is not None]
            return _alt(kept) if kept else None
        return self._typed(schema, types, path, refs)

    def _deref(self, schema: Any, path: str) -> Any:
        """Inlines a top-level $ref of an allOf part (recursion through allOf is refused)."""
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema and seen <= MAX_REF_DEPTH:
            target, _ = resolve_ref(self.root, schema["$ref"], path)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = merge_all([target, rest], path) if rest else target
            seen += 1
        if seen > MAX_REF_DEPTH:
            raise unsupported("allOf", path, "a recursive $ref inside allOf")
        return schema

    def _alternatives(self, schema: dict, key: str, path: str, refs: tuple[str, ...]) -> str | None:
        branches = schema[key]
        rest = {k: v for k, v in schema.items() if k != key}
        if key == "oneOf":
            resolved = [self._deref(b, f"{path}/oneOf/{i}") for i, b in enumerate(branches)]
            for i, a in enumerate(resolved):
                for j in range(i + 1, len(resolved)):
                    if not disjoint(a, resolved[j]):
                        raise unsupported(
                            "oneOf",
                            path,
                            f"branches {i} and {j} may both match one value, and the regex "
                            "backend cannot exclude the overlap (make them differ in type or "
                            "in a required const/enum property, or use anyOf)",
                        )
        kept = []
        for i, branch in enumerate(branches):
            sub = merge_all([rest, branch], f"{path}/{key}/{i}") if rest else branch
            regex = self.node(sub, f"{path}/{key}/{i}", refs)
            if regex is not None:
                kept.append(regex)
        return _alt(kept) if kept else None

    def _typed(self, schema: dict, t: str, path: str, refs: tuple[str, ...]) -> str | None:
        if t == "null":
            return "null"
        if t == "boolean":
            return "(true|false)"
        if t == "integer":
            return self._integer(schema, path)
        if t == "number":
            return self._number(schema, path)
        if t == "string":
            return self._string(schema, path)
        if t == "array":
            return self._array(schema, path, refs)
        if t == "object":
            return self._object(schema, path, refs)
        raise GrammarError(f"json_schema type {t!r} at {path or '/'} is not a JSON type")

    # -- literals ------------------------------------------------------------------------

    def _literals(self, schema: dict, path: str) -> str | None:
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        # NOTE: every keyword is honoured by keeping only the values the whole node accepts
        # (jsonschema tells `true` from 1, where Python's `==` does not); evolve() keeps the
        # root as the base of any $ref in the node.
        import jsonschema

        root = self.root if isinstance(self.root, dict) else {}
        validator = jsonschema.validators.validator_for(root)(root).evolve(schema=schema)
        kept = [
            _esc(json.dumps(v, ensure_ascii=False, separators=self._sep))
            for v in values
            if validator.is_valid(v)
        ]
        return _alt(list(dict.fromkeys(kept))) if kept else None

    # -- scalars -------------------------------------------------------------------------

    def _integer(self, schema: dict, path: str) -> str | None:
        self._no_multiple_of(schema, path)
        schema = numeric_bounds(schema)
        lo, hi = None, None
        if "minimum" in schema:
            lo = math.ceil(schema["minimum"])
        if "exclusiveMinimum" in schema:
            v = math.floor(schema["exclusiveMinimum"]) + 1
            lo = v if lo is None else max(lo, v)
        if "maximum" in schema:
            hi = math.floor(schema["maximum"])
        if "exclusiveMaximum" in schema:
            v = math.ceil(schema["exclusiveMaximum"]) - 1
            hi = v if hi is None else min(hi, v)
        try:
            return int_range_pattern(lo, hi, max_digits=INT_MAX_DIGITS)
        except ValueError:
            return None  # an empty range

    def _number(self, schema: dict, path: str) -> str | None:
        self._no_multiple_of(schema, path)
        if "multipleOf" in schema:  # multipleOf 1: the integers (1.0 too, not written)
            return self._integer(schema, path)
        schema = numeric_bounds(schema)
        bounds: dict[str, Fraction] = {}
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if key in schema:
                value = Fraction(str(schema[key]))
                if value.denominator != 1:
                    raise unsupported(key, path, f"a fractional bound ({schema[key]}) on a number")
                bounds[key] = value
        lo_ex = "exclusiveMinimum" in bounds and (
            "minimum" not in bounds or bounds["exclusiveMinimum"] >= bounds["minimum"]
        )
        hi_ex = "exclusiveMaximum" in bounds and (
            "maximum" not in bounds or bounds["exclusiveMaximum"] <= bounds["maximum"]
        )
        lo = bounds.get("exclusiveMinimum" if lo_ex else "minimum")
        hi = bounds.get("exclusiveMaximum" if hi_ex else "maximum")
        try:
            return number_range_pattern(
                lo,
                hi,
                lo_exclusive=lo_ex,
                hi_exclusive=hi_ex,
                int_digits=NUMBER_INT_DIGITS,
                frac_digits=NUMBER_FRAC_DIGITS,
            )
        except ValueError:
            return None

    @staticmethod
    def _no_multiple_of(schema: dict, path: str) -> None:
        if "multipleOf" in schema and schema["multipleOf"] != 1:
            raise unsupported("multipleOf", path, "only multipleOf 1 (any integer) is compiled")

    def _string(self, schema: dict, path: str) -> str | None:
        fmt, pattern = schema.get("format"), schema.get("pattern")
        lengths = "minLength" in schema or "maxLength" in schema
        if fmt is not None and (pattern is not None or lengths):
            raise unsupported("format", path, "format together with pattern/minLength/maxLength")
        if pattern is not None and lengths:
            raise unsupported("pattern", path, "pattern together with minLength/maxLength")
        if fmt is not None:
            if fmt not in STRING_FORMATS:
                known = ", ".join(sorted(STRING_FORMATS))
                raise unsupported("format", path, f"format {fmt!r} (compiled: {known})")
            return f'"{STRING_FORMATS[fmt]}"'
        if pattern is not None:
            body = pattern_body(pattern)
            check_regex(body, what="json_schema pattern")
            return f'"({json_pattern(body, path)})"'
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        if hi is not None and lo > hi:
            return None
        reps = ("*" if lo == 0 else f"{{{lo},}}") if hi is None else f"{{{lo},{hi}}}"
        return f'"{STRING_CHAR}{reps}"'

    # -- containers ----------------------------------------------------------------------

    def _repeat(self, item: str | None, lo: int, hi: int | None) -> str | None:
        """`lo`..`hi` comma-separated copies of `item` (None: unbounded), or None if none fit."""
        if item is None or hi == 0:
            return "" if lo == 0 else None
        tail_hi = "" if hi is None else str(hi - 1)
        body = f"{item}({self.comma}{item}){{{max(lo - 1, 0)},{tail_hi}}}"
        return f"({body})?" if lo == 0 else body

    def _array(self, schema: dict, path: str, refs: tuple[str, ...]) -> str | None:
        if schema.get("uniqueItems") and schema.get("maxItems", 2) > 1:
            raise unsupported("uniqueItems", path, "distinct items cannot be tracked by a regex")
        items = schema.get("items", True)
        if isinstance(items, list):
            raise unsupported("items", path, "items as a list (draft 2019 tuples); use prefixItems")
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        prefix = schema.get("prefixItems") or []
        head = []
        for i, sub in enumerate(prefix):
            regex = self.node(sub, f"{path}/prefixItems/{i}", refs)
            if regex is None:  # no value fits item i: the array has fewer items
                hi = i if hi is None else min(hi, i)
                break
            head.append(regex)
        # NOTE: every prefix item is written (a subset: shorter arrays would also be valid).
        if hi is not None and hi < len(head):
            return None
        item = self.node(items, f"{path}/items", refs)
        more_lo, more_hi = max(lo - len(head), 0), None if hi is None else hi - len(head)
        if not head:
            rest = self._repeat(item, more_lo, more_hi)
            return None if rest is None else self.open_arr + rest + self.close_arr
        if item is None or more_hi == 0:
            if more_lo > 0:
                return None
            tail = ""
        else:
            tail = f"({self.comma}{item}){{{more_lo},{'' if more_hi is None else more_hi}}}"
        return self.open_arr + self.comma.join(head) + tail + self.close_arr

    def _object(self, schema: dict, path: str, refs: tuple[str, ...]) -> str | None:
        props = dict(schema.get("properties") or {})
        required = list(dict.fromkeys(schema.get("required") or []))
        extra = schema.get("additionalProperties", True)
        for name in required:
            if name not in props:
                props[name] = extra  # a required name only additionalProperties describes
        lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
        if not props:
            return self._map(extra, lo, hi, path, refs)
        if lo > len(required) or (hi is not None and hi < len(props)):
            raise unsupported(
                "minProperties" if lo > len(required) else "maxProperties",
                path,
                "a property count that the declared properties do not fix",
            )
        entries: list[tuple[str, bool]] = []  # (regex of '"name": value', required)
        for name, sub in props.items():
            value = self.node(sub, f"{path}/properties/{name}", refs)
            if value is None:
                if name in required:
                    return None
                continue
            key = _esc(json.dumps(name, ensure_ascii=False))
            entries.append((key + self.colon + value, name in required))
        return self.open_obj + self._sequence(entries) + self.close_obj

    def _sequence(self, entries: list[tuple[str, bool]]) -> str:
        """Entries in order, comma-separated, the optional ones optional."""
        after: str = ""  # the rest once something was written (each entry then needs a comma)
        first: str = ""  # the rest while nothing has been written yet
        for entry, req in reversed(entries):
            with_entry = entry + after
            if req:
                first = with_entry
                after = self.comma + with_entry
            else:
                first = f"({with_entry}|{first})" if first else f"({with_entry})?"
                after = f"({self.comma}{entry})?{after}"
        return first

    def _map(self, values: Any, lo: int, hi: int | None, path: str, refs) -> str | None:
        value = self.node(values, f"{path}/additionalProperties", refs)
        if value is not None and lo > 1:  # NOTE: `{"a": 1, "a": 2}` has one property, not two
            raise unsupported("minProperties", path, "distinct free names cannot be tracked")
        entry = None if value is None else f'"{STRING_CHAR}*"{self.colon}{value}'
        rest = self._repeat(entry, lo, hi)
        return None if rest is None else self.open_obj + rest + self.close_obj

    def any_value(self, depth: int) -> str:
        """Any JSON value with arrays/objects nested at most `depth` deep."""
        number = number_range_pattern(None, None)
        parts = ["null", "(true|false)", number, f'"{STRING_CHAR}*"']
        if depth > 0:
            inner = self.any_value(depth - 1)
            # NOTE: zero copies always fit, so _repeat gives a pattern here, never None
            items = self._repeat(inner, 0, None) or ""
            parts.append(self.open_arr + items + self.close_arr)
            entry = f'"{STRING_CHAR}*"{self.colon}{inner}'
            parts.append(self.open_obj + (self._repeat(entry, 0, None) or "") + self.close_obj)
        return _alt(parts)


def schema_to_regex(schema: Schema, *, whitespace: str | None = None) -> str:
    """The regex for `schema` (see SchemaRegex); GrammarError names any unsupported keyword."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    return SchemaRegex(schema, whitespace=whitespace).compile()
