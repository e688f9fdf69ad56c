"""schema_normalize's sound restrictions (`uniqueItems` as `maxItems: 1`, a `oneOf` cut to
its branches disjoint from every other one): every instance the restricted schema accepts is
valid under the schema as submitted (hand-picked and hypothesis-generated values), each
restriction is described in the notes, and a schema no restriction fits is left as it is."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.constrained.schema.schema_normalize import normalize

pytestmark = pytest.mark.unit

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["a", "b", 1.5]))
INSTANCES = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=3),
    st.dictionaries(st.sampled_from(["k", "a", "b", "n"]), _scalar, max_size=3),
)

RESTRICTED: dict[str, tuple[dict, list[Any], list[Any]]] = {  # schema, kept, cut out
    "uniqueItems": (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        [[], [1]],
        [[1, 2]],
    ),
    "oneOf with two overlapping branches": (
        {
            "oneOf": [
                {"type": "string"},
                {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}},
            ]
        },
        ["x"],
        [{"a": 1, "b": "x"}],
    ),
}


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name", sorted(RESTRICTED))
def test_restriction_is_a_subset_and_is_noted(name: str) -> None:
    schema, kept, cut = RESTRICTED[name]
    notes: list[str] = []
    out = normalize(schema, notes)
    assert len(notes) == 1 and notes[0].split()[0] in name, notes
    for value in kept:
        assert _valid(out, value) and _valid(schema, value), value
    for value in cut:  # valid as submitted, no longer written
        assert _valid(schema, value) and not _valid(out, value), value


@pytest.mark.parametrize("name", sorted(RESTRICTED))
@settings(max_examples=150, deadline=None)
@given(value=INSTANCES)
def test_restricted_schema_accepts_only_valid_instances(name: str, value: Any) -> None:
    schema = RESTRICTED[name][0]
    if _valid(normalize(schema), value):
        assert _valid(schema, value), value


def test_no_restriction_fits_leaves_the_keyword_for_a_named_refusal() -> None:
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert normalize(overlapping) == overlapping
    many = {"type": "array", "uniqueItems": True, "minItems": 2}
    assert normalize(many) == many
