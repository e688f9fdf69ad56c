"""bench.jsb_wall's pairing of runs, over a stand-in engine: the unconstrained run decodes each
served request's constrained output length with EOS ignored, and refused requests are in
neither timed run."""

from __future__ import annotations

from typing import Any

from bench import jsb_wall
from sgl_lite.backend.errors import InvalidRequest


class _Tokenizer:
    def apply_chat_template(self, messages: list[dict], **_: Any) -> str:
        return messages[-1]["content"]

    def encode(self, text: str, **_: Any) -> list[int]:
        return [len(text) % 97, 1, 2]


class _Engine:
    """Answers a json_schema request with as many tokens as its schema text is long (mod 50),
    refuses the first schema, and records every batch it is sent."""

    tokenizer = _Tokenizer()

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.refused: str | None = None

    def flush_cache(self) -> bool:
        self.batches.append([])
        return True

    async def async_generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        self.batches[-1].append(sampling_params)
        schema = sampling_params.get("json_schema")
        if schema is not None and (self.refused is None or self.refused == schema):
            self.refused = schema
            raise InvalidRequest("json_schema", "refused for the test")
        n = len(schema) % 50 + 1 if schema else sampling_params["max_new_tokens"]
        return {"meta_info": {"completion_tokens": n}}


def test_the_unconstrained_run_decodes_the_constrained_lengths_without_the_refused():
    engine = _Engine()
    row = jsb_wall.measure(engine, "Glaiveai2K", limit=4, max_new_tokens=512)
    warm, constrained, plain = engine.batches
    assert len(warm) == 4 and len(constrained) == 3 and len(plain) == 3
    assert row["requests"] == 3 and row["refused"] == 1
    lengths = [len(p["json_schema"]) % 50 + 1 for p in constrained]
    assert [p["max_new_tokens"] for p in plain] == lengths
    assert all(p["ignore_eos"] and "json_schema" not in p for p in plain)
    assert row["output_tokens"] == sum(lengths)
    assert row["ratio"] is not None and row["ratio"] > 0
