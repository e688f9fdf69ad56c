"""A model-free slice of bench.jsonschemabench: the smallest vendored schemas of each
JSONSchemaBench sub-dataset (two under llguidance, one under the default "auto") go through the
harness's declared-coverage path (the engine's GrammarCompiler on SmolLM2's tokenizer) and come
back compiled or refused with a named reason within the timeout, and the scoring counts a
violating output as a violation, never as a success."""

from __future__ import annotations

import json
import time

import pytest

from bench.jsonschemabench import BACKENDS, DATA, SUB_DATASETS, Item, declare, new_compiler
from bench.jsonschemabench_eval import coverage, judge, refusal_keyword
from tests.support.smollm import smollm2_tokenizer

TIMEOUT_S = 10.0  # the engine's default and the paper's compile timeout


def _slice(per_sub: int = 2) -> list[Item]:
    items = []
    for sub in SUB_DATASETS:
        files = sorted((DATA / sub).glob("*.json"), key=lambda p: (p.stat().st_size, p.name))
        items += [Item(sub, p.name, p.read_text(encoding="utf-8")) for p in files[:per_sub]]
    return items


def test_vendored_sample_has_every_sub_dataset_as_bare_schemas() -> None:
    for sub in SUB_DATASETS:
        files = sorted((DATA / sub).glob("*.json"))
        assert len(files) >= 20, sub
        assert all(isinstance(json.loads(p.read_text(encoding="utf-8")), dict) for p in files)


@pytest.mark.parametrize("backend", ["auto", "llguidance"])
def test_slice_compiles_or_is_refused_by_name_within_the_timeout(backend: str) -> None:
    compiler = new_compiler(smollm2_tokenizer(), backend, TIMEOUT_S)
    outcomes = []
    for item in _slice(1 if backend == "auto" else 2):
        start = time.perf_counter()
        decl = declare(compiler, item.text)
        assert time.perf_counter() - start < TIMEOUT_S + 5, item.id  # no hang
        if decl.ok:
            assert decl.chosen in BACKENDS and decl.reason is None, item.id
        else:  # a GrammarError about the json_schema that names the keyword (or a timeout)
            assert decl.reason is not None and "json_schema" in decl.reason, (item.id, decl)
            assert refusal_keyword(decl.reason) != "(other)", (item.id, decl.reason)
        outcomes.append(decl.ok)
    assert sum(outcomes) >= len(outcomes) // 2, outcomes  # most of the small ones compile


def test_refused_schema_reports_the_keyword_it_names() -> None:
    schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    decl = declare(new_compiler(smollm2_tokenizer(), "llguidance", TIMEOUT_S), json.dumps(schema))
    assert not decl.ok and not decl.timed_out
    assert refusal_keyword(decl.reason or "") == "not"


def test_violating_and_unparsable_outputs_score_zero() -> None:
    item = next(i for i in _slice() if i.sub == "Glaiveai2K")
    schema = item.schema
    required = schema["required"]
    assert required  # the Glaiveai2K sample's smallest schema has required properties
    valid = {k: _example(schema["properties"][k]) for k in required}
    assert judge(json.dumps(valid), schema).ok
    missing = judge(json.dumps({k: v for k, v in valid.items() if k != required[0]}), schema)
    assert missing.status == "violation" and required[0] in (missing.reason or "")
    assert judge(json.dumps(valid)[:-1], schema).status == "invalid_json"
    records = [
        {"declared": True, "status": "violation"},
        {"declared": True, "status": "valid"},
        {"declared": False, "status": "refused"},
    ]
    figures = coverage(records)
    assert figures["empirical"] == pytest.approx(1 / 3)
    assert figures["compliance"] == pytest.approx(1 / 2)
    assert figures["declared"] == pytest.approx(2 / 3)


def test_formats_are_checked_and_valid_addresses_pass() -> None:
    for fmt, good, bad in (
        ("ipv4", "10.0.0.1", "10.0.0.300"),
        ("ipv6", "::1", "::g"),
        ("uuid", "12345678-1234-5678-1234-567812345678", "1234"),
        # Draft 2020-12's time is RFC 3339's full-time: the offset is required (a plain
        # FormatChecker applies Draft 3's HH:MM:SS and fails every RFC 3339 time)
        ("time", "20:00:00.000000-01:00", "20:00:00"),
    ):
        schema = {"type": "string", "format": fmt}
        assert judge(json.dumps(good), schema).ok, fmt
        assert judge(json.dumps(bad), schema).status == "violation", fmt


def test_schema_invalid_under_draft_2020_12_scores_zero_as_in_the_paper() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 3}
    schema["exclusiveMaximum"] = True  # draft-04's boolean form, a number in 2020-12
    assert judge("2", schema).status == "schema_invalid"


def _example(prop: dict) -> object:
    examples: dict[str, object] = {"string": "x", "number": 1.5, "integer": 1, "boolean": True}
    return examples[prop["type"]]
