"""Runs SGLang's own frontend test programs (`sglang.test.test_programs`) against a server.

Not a pytest module: `test_server_sglang05_client.py` runs it under the interpreter that has
SGLang 0.5's client (a venv of its own, see the Makefile) and reads the JSON it prints, one
outcome per program: "ok", "answer: ..." (the program ran; the 135M model answered differently
than SGLang's check expects), or "error: ..." (anything else, e.g. an HTTP error).
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import sglang as sgl
from sglang.test import test_programs as programs

# (program, kwargs), the quick ones. Left out: test_image_qa (images), test_parallel_encoding
# (KV-cache concatenation: /concate_and_append_request), the two speculative ones (OpenAI
# backends), test_gen_min_new_tokens (its client-side tokenizer import needs torchvision).
PROGRAMS = [
    ("test_few_shot_qa", {}),
    ("test_mt_bench", {}),
    ("test_select", {"check_answer": False}),
    ("test_decode_json", {}),
    ("test_expert_answer", {"check_answer": False}),
    ("test_tool_use", {}),
    ("test_react", {}),
    ("test_stream_logprobs", {}),
    ("test_regex", {}),
    ("test_dtype_gen", {}),
]
# ~2.5 minutes more on one CPU thread (the 135M model rambles in gen_int and the summaries)
SLOW_PROGRAMS = [
    ("test_decode_int", {}),
    ("test_decode_json_regex", {}),
    ("test_parallel_decoding", {}),
    ("test_stream", {}),
]


def main(url: str, slow: bool) -> None:
    """Runs the programs (and the slow ones too if `slow`); prints their outcomes as JSON."""
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    outcomes: dict[str, object] = {"__version__": sgl.__version__}
    for name, kwargs in PROGRAMS + (SLOW_PROGRAMS if slow else []):
        started = time.perf_counter()
        try:
            getattr(programs, name)(**kwargs)
            outcomes[name] = "ok"
        except AssertionError as exc:
            outcomes[name] = f"answer: {str(exc)[:200]}"
        except Exception as exc:
            tail = traceback.format_exc().splitlines()[-3:]
            outcomes[name] = f"error: {type(exc).__name__}: {str(exc)[:300]} | {tail}"
        outcomes[f"{name}_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main(sys.argv[1], slow="--slow" in sys.argv[2:])
