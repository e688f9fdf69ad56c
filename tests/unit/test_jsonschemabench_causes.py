"""bench.jsonschemabench_eval.miss_cause: every output that scored 0 is put on the engine,
the budget or the benchmark, and one the engine passed as valid that the judge fails is named
a bug (the compliance check of the JSONSchemaBench table in docs/constraints.md)."""

from __future__ import annotations

from bench.jsonschemabench_eval import miss_cause, miss_causes


def test_each_miss_is_put_on_what_caused_it() -> None:
    cut = "output is cut after 512 tokens before the grammar completes (0 tokens left); ..."
    records = [
        {"status": "valid", "engine_violation": None},
        {"status": "refused", "reason": "json_schema keyword 'not' at /a is not supported"},
        {"status": "refused", "reason": "json_schema compile timed out after 10 s"},
        {"status": "invalid_json", "engine_violation": cut},
        {"status": "violation", "engine_violation": "output fails the schema at a: ..."},
        {"status": "violation", "engine_violation": None},
        {"status": "schema_invalid", "engine_violation": None},
        {"status": "prompt_too_long"},
    ]
    causes = [miss_cause(r) for r in records]
    assert causes == [
        None,
        "engine: refused",
        "engine: compile timeout",
        "budget: cut at max_new_tokens",
        "engine: violation reported",
        "BUG: passed as valid",
        "benchmark: schema fails Draft 2020-12",
        "benchmark: prompt over the context",
    ]
    assert sum(miss_causes(records).values()) == len(records) - 1
