"""Helpers the test modules share; no tests here. A test module imports from this package or
uses a conftest fixture, never another test module.

- `tiers`: a test's tier is its folder; what it needs must fit it (tests/conftest.py).
- `tiny`: the tokenizer trained in code and the tiny Llama shapes (unit, model tiers).
- `fakes`: a byte tokenizer and fake model runners for the real `Engine` (no model files),
  and the two engine doubles: `ScriptedEngine` (canned outcomes for the server's error paths)
  and `ReplyEngine` (scripted replies checked against their constraints).
- `mock_backend`: a scripted frontend `Backend`.
- `server`: the HTTP app served in process on loopback, and small HTTP helpers.
- `processes`: `python -m sgl_lite.launch_server` as a child process (the `process` tier).
- `smollm`: SmolLM2's tokenizer outside a fixture, chat prompts.
- `constrained`, `constraints`: model-free decode loops on SmolLM2's tokenizer, and the
  schemas and grammars several constrained-decoding test modules share.
- `tools`, `chat_templates`, `gguf_files`: tool definitions, real chat templates, GGUF writing
  and the GGUF tests' tiny models (`TINY_GGUF`; their `private_cache` is a conftest fixture).
- `tiny_gemma`: tiny random Gemma configs; `runner_logits`: a runner's logits fed in chunks.
- `vllm_peer`, `fake_vllm_worker`: the vLLM bench peer over a stand-in `vllm` module.
- `engine_checks`: an engine shared by tests is left whole (`assert_engine_whole`).
"""

from __future__ import annotations

import os

# The thread count every engine in the tests runs with (`SGL_LITE_NUM_THREADS`, default 2).
NUM_THREADS = int(os.environ.get("SGL_LITE_NUM_THREADS", "2"))


def examples(n: int) -> int:
    """A property test's example count: `n` under the CI profile (tests/conftest.py: 200
    examples by default), a quarter of it (at least 10) under `dev`, where `make test-fast`
    stays quick. The profile is loaded by tests/conftest.py before any test module imports."""
    from hypothesis import settings

    return n if settings.default.max_examples >= 200 else max(10, n // 4)
