"""SGLang 0.5 DSL parity: every public name exists and has a row in docs/sglang_parity.md, and
the refused ones raise NotImplementedError saying what to use instead. The behaviours are in
test_frontend_parity_{state,gen,meta,backends}.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sgl_lite as sgl
from tests.support.mock_backend import MockBackend

PARITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang_parity.md"


# --- refusals and the parity table ----------------------------------------------------------
@pytest.mark.parametrize(
    "call, instead",
    [
        (lambda: sgl.image("cat.png"), "text-only"),
        (lambda: sgl.video("cat.mp4", 4), "text-only"),
        (lambda: sgl.separate_reasoning(sgl.gen("x")), "stop='</think>'"),
        (lambda: sgl.Anthropic("claude"), "sgl.OpenAI"),
        (lambda: sgl.LiteLLM("x"), "sgl.OpenAI"),
        (lambda: sgl.VertexAI("x"), "sgl.OpenAI"),
        (lambda: sgl.Crusoe("x"), "sgl.OpenAI"),
        (lambda: sgl.ServerArgs(model_path="m"), "sgl.Runtime"),
        (lambda: setattr(sgl.global_config, "verbosity", 2), "fixed at 0"),
        (lambda: sgl.global_config.no_such_switch, "default_backend"),
    ],
)
def test_refused_names_raise_not_implemented_saying_what_to_use(call, instead):
    with pytest.raises(NotImplementedError, match=re.escape(instead)):
        call()


def test_global_config_default_backend_is_the_default_backend():
    backend = MockBackend()
    sgl.global_config.default_backend = backend
    try:
        assert sgl.global_config.default_backend is backend
        assert sgl.function(lambda s: s.__iadd__(sgl.gen("x"))).run()["x"] == "ok"
        sgl.global_config.verbosity = 0  # the fixed value is accepted
        assert sgl.global_config.enable_parallel_encoding is False
    finally:
        sgl.set_default_backend(None)


# SGLang 0.5's public surface: `sglang.__all__` (the frontend's part), ProgramState,
# ProgramStateGroup and SglFunction. Each must exist here and have a row in the table.
SGLANG_TOP = [
    "Anthropic", "Crusoe", "Engine", "LiteLLM", "OpenAI", "Runtime", "RuntimeEndpoint",
    "ServerArgs", "VertexAI", "__version__", "assistant", "assistant_begin", "assistant_end",
    "flush_cache", "function", "gen", "gen_int", "gen_string", "get_server_info",
    "global_config", "greedy_token_selection", "image", "select", "separate_reasoning",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]  # fmt: skip
SGLANG_STATE = [
    "system", "user", "assistant", "var_scope", "fork", "copy", "text", "messages", "sync",
    "error", "text_iter", "text_async_iter", "get_var", "set_var", "get_meta_info",
    "__iadd__", "__getitem__", "__setitem__", "__contains__", "__repr__", "ret_value",
    "stream_executor",
]  # fmt: skip
SGLANG_GROUP = ["join", "__getitem__", "__setitem__", "__iadd__", "states", "src_state"]
SGLANG_FUNCTION = [
    "bind", "run", "run_batch", "trace", "cache", "compile", "__call__", "func",
    "num_api_spec_tokens", "bind_arguments", "pin_prefix_rid", "arg_names", "arg_defaults",
]  # fmt: skip
# sglang/lang/backend/runtime_endpoint.py: RuntimeEndpoint's and Runtime's public methods
SGLANG_ENDPOINT = [
    "get_model_name", "flush_cache", "get_server_info", "get_chat_template", "cache_prefix",
    "start_profile", "stop_profile", "commit_lazy_operations", "fill_image", "generate",
    "generate_stream", "select", "concatenate_and_append", "base_url", "api_key", "verify",
    "model_info", "chat_template", "support_concate_and_append",
]  # fmt: skip
SGLANG_RUNTIME = [
    "url", "generate_url", "endpoint", "shutdown", "start_profile", "stop_profile",
    "cache_prefix", "get_tokenizer", "async_generate", "add_request", "generate", "encode",
    "get_server_info",
]  # fmt: skip


def test_every_sglang_public_name_exists_and_has_a_row_in_the_parity_table():
    assert all(hasattr(sgl, name) for name in SGLANG_TOP if name != "Engine")
    state = sgl.function(lambda s: None).run(backend=MockBackend())
    assert all(hasattr(type(state), n) or n in vars(state) for n in SGLANG_STATE)
    group = state.fork(2)
    assert all(hasattr(group, n) for n in SGLANG_GROUP)
    func = sgl.function(lambda s: None)
    assert all(hasattr(func, n) for n in SGLANG_FUNCTION)
    endpoint_names = {n for n in dir(sgl.RuntimeEndpoint)} | {
        "base_url",
        "api_key",
        "verify",
        "model_info",
        "chat_template",
    }  # fmt: skip  (instance attributes, set in __init__)
    assert not [n for n in SGLANG_ENDPOINT if n not in endpoint_names]
    assert not [n for n in SGLANG_RUNTIME if not hasattr(sgl.Runtime, n)]
    doc = PARITY_DOC.read_text()
    rows = set()
    for cell in re.findall(r"^\| (`[^|]+`) \|", doc, flags=re.M):
        names = re.findall(r"`([^`]+)`", cell)  # `X.a` / `b` is X.a and X.b
        owner = names[0].rsplit(".", 1)[0] + "." if "." in names[0] else ""
        rows.update(n if "." in n else owner + n for n in names)
    for prefix, names in [
        ("sgl.", SGLANG_TOP),
        ("ProgramState.", SGLANG_STATE),
        ("ProgramStateGroup.", SGLANG_GROUP),
        ("SglFunction.", SGLANG_FUNCTION),
        ("RuntimeEndpoint.", SGLANG_ENDPOINT),
        ("Runtime.", SGLANG_RUNTIME),
    ]:
        missing = [n for n in names if not any(r.startswith(prefix + n) for r in rows)]
        assert not missing, f"docs/sglang_parity.md has no row for {prefix}{missing}"
