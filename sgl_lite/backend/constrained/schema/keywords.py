"""The keywords a JSON Schema uses, read from schema positions only.

A keyword is a key of a sub-schema; the names under `properties`, `$defs` and the other maps
of sub-schemas, and the values of `enum`, `const`, `default` and `examples`, are data. So a
property named `"allOf"` or an enum value `"not"` does not count, which a substring test on the
serialised schema got wrong. A dict under a key that is no keyword is read as a sub-schema: a
`$ref` may point into it (OpenAPI's `components`), so its keys count. Pure: no jsonschema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_DATA = frozenset(("enum", "const", "default", "examples"))
# keywords whose value maps names to sub-schemas
_MAPS = frozenset(
    ("$defs", "definitions", "dependentSchemas", "dependencies", "patternProperties", "properties")
)


def schema_nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every sub-schema of `schema` that is an object (boolean schemas and non-schemas are not)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node
        for key, value in node.items():
            if key in _DATA:
                continue
            if isinstance(value, list):
                stack.extend(value)
            elif isinstance(value, dict):
                stack.extend(value.values() if key in _MAPS else (value,))


def schema_keywords(schema: Any) -> frozenset[str]:
    """Every keyword used anywhere in `schema` (boolean schemas and non-schemas use none)."""
    return frozenset(key for node in schema_nodes(schema) for key in node)
