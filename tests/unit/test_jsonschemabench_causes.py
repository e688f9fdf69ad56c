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


def test_rescore_judges_whole_outputs_again_and_keeps_cut_ones() -> None:
    from bench.jsonschemabench_eval import rescore

    schema = {"type": "object", "properties": {"t": {"type": "string", "format": "time"}}}
    record = {"sub": "S", "schema": "a.json", "backend": "auto", "declared": True}
    result = {
        "records": [
            {**record, "status": "violation", "text": '{"t": "20:00:00Z"}'},
            {**record, "schema": "b.json", "status": "violation", "text": "x" * 2000},
            {**record, "schema": "c.json", "status": "refused", "text": None},
        ],
        "summary": {"auto": {"S": {}}},
    }
    schemas = {f"S/{n}": schema for n in ("a.json", "b.json", "c.json")}
    assert rescore(result, schemas) == 1
    assert [r["status"] for r in result["records"]] == ["valid", "violation", "refused"]
    assert result["summary"]["auto"]["S"]["empirical"] == 1 / 3
