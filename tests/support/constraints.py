"""Schemas and grammars that several constrained-decoding test modules share (data only)."""

from __future__ import annotations

import re

# The fidelity matrix: one schema per JSON Schema keyword the compilers enforce (fidelity,
# llguidance, xgrammar tests); a recursive comment tree among them.
COMMENT_TREE = {
    "$defs": {
        "comment": {
            "type": "object",
            "properties": {
                "author": {"type": "string", "maxLength": 8},
                "replies": {"type": "array", "items": {"$ref": "#/$defs/comment"}, "maxItems": 2},
            },
            "required": ["author", "replies"],
        }
    },
    "$ref": "#/$defs/comment",
}
ENFORCED = {
    "int_range": {"type": "integer", "minimum": 1, "maximum": 5},
    "int_exclusive": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 120},
    "int_min_only": {"type": "integer", "minimum": 1000},
    "number_range": {"type": "number", "minimum": 0, "maximum": 1},
    "number_exclusive": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    "string_lengths": {"type": "string", "minLength": 3, "maxLength": 5},
    "string_pattern": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f}
            for f in ("date", "time", "date-time", "email", "uuid", "ipv4", "uri")
        },
        "required": ["date", "time", "date-time", "email", "uuid", "ipv4", "uri"],
    },
    "enum_const": {
        "type": "object",
        "properties": {"e": {"enum": ["a", 2, None, [1]]}, "c": {"const": {"k": True}}},
        "required": ["e", "c"],
    },
    "enum_filtered_by_type": {"type": "integer", "enum": [1, "x", 2.5, 7]},
    "items_bounds": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4},
    "prefix_items": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer"}],
        "items": False,
    },
    "closed_object": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "map": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "any_of": {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 4}]},
    "one_of_discriminated": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                "required": ["kind", "good"],
            },
        ]
    },
    "all_of": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 3}, "b": {"type": "string"}}, "required": ["b"]},
        ]
    },
    "type_list": {"type": ["integer", "null"], "minimum": -2, "maximum": 2},
    "comment_tree": COMMENT_TREE,
    "true_items": {"type": "array", "items": True, "maxItems": 3},
    # Github_trivial/o91408: `body` or `bodyValue`, never both (schema_normalize's `not` rewrite)
    "negated_presence": {
        "type": "object",
        "properties": {"body": {"type": "string"}, "bodyValue": {"type": "integer"}},
        "required": ["body"],
        "not": {"required": ["body", "bodyValue"]},
    },
    # JsonSchemaStore/winget: exit codes other than 0 (schema_normalize's `not` of values)
    "integer_except_values": {
        "type": "array",
        "items": {"type": "integer", "not": {"enum": [0, 2]}, "minimum": -3, "maximum": 3},
        "maxItems": 4,
    },
    # JsonSchemaStore/embrace-config: a non-empty object (one listed property required)
    "min_properties_one": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "minProperties": 1,
    },
    # Github_ultra/o17072: branches told apart by `type`, one's target negating a presence
    "negated_presence_in_a_discriminated_one_of": {
        "type": "object",
        "properties": {"m": {"oneOf": [{"$ref": "#/$defs/add"}, {"$ref": "#/$defs/cut"}]}},
        "required": ["m"],
        "$defs": {
            "add": {
                "type": "object",
                "properties": {"type": {"const": "add"}, "x": {"type": "integer"}},
                "not": {"allOf": [{"required": ["type"]}, {"required": ["x"]}]},
            },
            "cut": {"type": "object", "properties": {"type": {"const": "cut"}}},
        },
    },
}
# Schemas the model-free decode loops validate against (decode, guide, budget tests).
W3_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "price": {"type": "number"},
        "category": {"type": "string", "enum": ["electronics", "books", "toys", "food"]},
    },
    "required": ["name", "price", "category"],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}
SCHEMAS = {
    "w3": W3_SCHEMA,
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["id", "tags"],
            }
        },
        "required": ["user"],
    },
    "array_of_numbers": {
        "type": "array",
        "items": {"type": "number"},
        "minItems": 1,
        "maxItems": 4,
    },
    "mixed_enum": {"enum": ["red", 1, None, True]},
    "optional_fields": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "string"}},
        "required": ["a"],
    },
    "ref": {
        "$defs": {"point": POINT},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "any_of": {
        "anyOf": [
            {"type": "integer"},
            {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
        ]
    },
    "numbers": {
        "type": "object",
        "properties": {"i": {"type": "integer"}, "f": {"type": "number"}},
        "required": ["i", "f"],
    },
    "bool_null": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "nothing": {"type": "null"}},
        "required": ["ok", "nothing"],
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": r"[A-Z]{3}-\d{2}"}},
        "required": ["code"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "qty": {"type": "integer"}},
            "required": ["kind", "qty"],
        },
        "maxItems": 3,
    },
    "const": {"type": "object", "properties": {"v": {"const": "1.0"}}, "required": ["v"]},
}
# Schemas with free text whose outputs a token budget must still close (budget tests).
STR = {"type": "string"}
BUDGET_SCHEMAS = {
    "ticket": {
        "type": "object",
        "properties": {
            "title": STR,
            "tags": {"type": "array", "items": STR},
            "priority": {"enum": ["low", "normal", "high"]},
        },
        "required": ["title", "tags", "priority"],
    },
    "invoice": {
        "type": "object",
        "properties": {
            "customer": STR,
            "total": {"type": "number"},
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"item": STR, "qty": {"type": "integer"}},
                    "required": ["item", "qty"],
                },
            },
            "note": STR,
        },
        "required": ["customer", "total", "lines"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": STR,
                    "address": {
                        "type": "object",
                        "properties": {"city": STR, "street": STR},
                        "required": ["city", "street"],
                    },
                },
                "required": ["name", "address"],
            }
        },
        "required": ["user"],
    },
    "profile": {
        "type": "object",
        "properties": {"age": {"type": "integer"}, "bio": STR, "nickname": STR},
        "required": ["age"],
    },
    "numbers": {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "mean": {"type": "number"},
            "ratios": {"type": "array", "items": {"type": "number"}},
        },
        "required": ["count", "mean", "ratios"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"enum": ["S", "M", "L", "XL"]},
            "in_stock": {"type": "boolean"},
        },
        "required": ["color", "size", "in_stock"],
    },
    "names": {"type": "array", "items": STR, "minItems": 1},
    "review": {
        "type": "object",
        "properties": {"summary": STR, "pros": {"type": "array", "items": STR}, "text": STR},
        "required": ["summary", "pros", "text"],
    },
}
# A bounded rating and a recursive comment tree, through the engine (fidelity tests).
STARS = {
    "type": "object",
    "properties": {
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "comment": {"type": "string", "maxLength": 30},
    },
    "required": ["stars", "comment"],
}
COMMENTS = {
    "$defs": {
        "comment": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 20},
                "replies": {"type": "array", "items": {"$ref": "#/$defs/comment"}, "maxItems": 2},
            },
            "required": ["text", "replies"],
        }
    },
    "$ref": "#/$defs/comment",
}
# EBNF grammars, and the reference the SQL outputs must match (grammar backend tests).
ARITHMETIC = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
"""
SQL = r"""
root ::= "SELECT " cols " FROM " name where?
cols ::= "*" | name (", " name)*
where ::= " WHERE " name " " op " " value
op ::= "=" | "<" | ">"
value ::= [0-9]{1,4} | "'" [a-z]{1,8} "'"
name ::= [a-z]{1,8}
"""
SQL_REFERENCE = re.compile(
    r"SELECT (\*|[a-z]{1,8}(, [a-z]{1,8})*) FROM [a-z]{1,8}"
    r"( WHERE [a-z]{1,8} [=<>] ([0-9]{1,4}|'[a-z]{1,8}'))?"
)
