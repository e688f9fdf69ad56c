"""W5: W1–W3 as `@sgl.function` programs run with `run_batch` on the engine under test.

The programs are what a SGLang user writes; the figure is their wall time over the Engine-API
wall time of the same workload (measured by `bench.sgl_engine`), both from a flushed cache.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import Skipped, validate_json
from bench.workloads import Workloads


def _programs() -> dict[str, Any]:
    try:
        import sgl_lite as sgl
    except Exception as exc:
        raise Skipped(f"import sgl_lite failed: {type(exc).__name__}: {exc}") from exc

    @sgl.function
    def chat(s, system, turns, max_tokens):
        s += sgl.system(system)
        for i, turn in enumerate(turns):
            s += sgl.user(turn)
            s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=max_tokens, temperature=0))

    @sgl.function
    def multiple_choice(s, prompt, choices):
        s += prompt
        s += sgl.select("answer", choices=choices)

    @sgl.function
    def extract(s, instructions, product, schema, max_tokens):
        s += sgl.system(instructions)
        s += sgl.user(product)
        s += sgl.assistant(
            sgl.gen("json", max_tokens=max_tokens, temperature=0, json_schema=schema)
        )

    return {"sgl": sgl, "W1": chat, "W2": multiple_choice, "W3": extract}


class DslRunner:
    """Runs the W5 programs on an EngineBackend wrapping the engine already built."""

    name = "sgl_lite_dsl"

    def __init__(self, engine: Any) -> None:
        self.programs = _programs()
        try:
            self.backend = self.programs["sgl"].EngineBackend(engine=engine)
        except Exception as exc:
            raise Skipped(f"EngineBackend failed: {type(exc).__name__}: {exc}") from exc
        self.engine = engine

    def _run(self, key: str, batch: list[dict]) -> tuple[float, list[Any]]:
        self.engine.flush_cache()
        before = self.engine.get_server_info()
        start = time.perf_counter()
        states = self.programs[key].run_batch(batch, backend=self.backend)
        wall = time.perf_counter() - start
        after = self.engine.get_server_info()
        self.stats = {
            k: after[k] - before[k]
            for k in ("prompt_tokens_submitted", "cache_hit_tokens", "forward_passes")
        }
        errors = [s.error() for s in states if s.error() is not None]
        if errors:
            raise Skipped(f"{len(errors)} of {len(states)} programs failed: {errors[0]}")
        return wall, states

    def w1(self, wl: Workloads) -> dict[str, Any]:
        batch = [
            {"system": wl.system_prompt, "turns": turns, "max_tokens": wl.chat_max_new_tokens}
            for turns in wl.conversations
        ]
        wall, _ = self._run("W1", batch)
        return {"wall_s": wall, **self.stats}

    def w2(self, wl: Workloads) -> dict[str, Any]:
        batch = [
            {"prompt": wl.question_prompt(i), "choices": [" " + o for o in options]}
            for i, (_, options, _) in enumerate(wl.questions)
        ]
        wall, states = self._run("W2", batch)
        decisions = [
            [" " + o for o in options].index(s["answer"])
            for s, (_, options, _) in zip(states, wl.questions)
        ]
        return {"wall_s": wall, "decisions": decisions, **self.stats}

    def w3(self, wl: Workloads) -> dict[str, Any]:
        batch = [
            {
                "instructions": wl.json_system,
                "product": p,
                "schema": wl.json_schema,
                "max_tokens": wl.json_max_new_tokens,
            }
            for p in wl.products
        ]
        wall, states = self._run("W3", batch)
        valid = sum(validate_json(s["json"], wl.json_schema) for s in states)
        return {"wall_s": wall, "valid": valid, "items": len(states), **self.stats}
