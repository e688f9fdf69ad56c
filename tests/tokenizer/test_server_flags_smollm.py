"""SGLang's server flags on SmolLM2's files: weight and KV sizes, the KV pool sized from free
memory, chat-template overrides rendered by its tokenizer (parsing and the sizing rules alone:
tests/unit/test_server_flags.py)."""

from __future__ import annotations

import logging

import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import memory
from sgl_lite.backend.kvcache import sizing
from sgl_lite.backend.runner.tokenizer_overrides import resolve_chat_template
from sgl_lite.frontend.chat_template import TEMPLATES
from sgl_lite.server_args import chat_template_arg

MESSAGES = [{"role": "user", "content": 'Say "hi"\n'}, {"role": "assistant", "content": "hi"}]


def test_weights_and_kv_sizes_of_the_embedded_model(smollm_folder) -> None:
    # SmolLM2-135M's 134,515,008 parameters (its GGUF folder holds no weights: the file's
    # tensor shapes count them)
    fp32 = memory.weight_bytes(smollm_folder, "float32")
    assert fp32 == 4 * 134_515_008
    assert memory.weight_bytes(smollm_folder, "bfloat16") * 2 == fp32
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; K and V in float32.
    assert memory.kv_bytes_per_token(smollm_folder, "float32") == 2 * 30 * 3 * 64 * 4


def test_chat_template_values(tmp_path, smollm_tokenizer) -> None:
    jinja = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    assert resolve_chat_template(jinja) == jinja
    (tmp_path / "t.jinja").write_text(jinja)
    assert resolve_chat_template(str(tmp_path / "t.jinja")) == jinja
    (tmp_path / "t.json").write_text('{"chat_template": "X{{ messages[0].content }}"}')
    assert resolve_chat_template(str(tmp_path / "t.json")) == "X{{ messages[0].content }}"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="no string field 'chat_template'"):
        resolve_chat_template(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="neither Jinja source nor a file"):
        resolve_chat_template("chatml")  # names are launch_server's to resolve
    assert chat_template_arg(str(tmp_path / "t.jinja")) == str(tmp_path / "t.jinja")
    assert chat_template_arg("no-such-template") == "no-such-template"  # the engine rejects it


@pytest.mark.parametrize("name", ["chatml", "smollm2", "llama-3-instruct", "llama-2-chat"])
def test_named_template_renders_like_the_frontend_template(name, smollm_tokenizer) -> None:
    template = resolve_chat_template(chat_template_arg(name))
    for messages, gen in ((MESSAGES, False), (MESSAGES[:1], True)):
        rendered = smollm_tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=gen
        )
        assert rendered == TEMPLATES[name].render(messages, add_generation_prompt=gen)


def test_resolve_mem_fraction_sizes_and_caps_the_pool(smollm_folder) -> None:
    from sgl_lite.backend.engine.memory import resolve_mem_fraction

    assert resolve_mem_fraction({"num_threads": 1}) == {"num_threads": 1}
    # Sizes in the dtype the engine will load (`auto`: bfloat16 on a CPU with a bf16 GEMM).
    dtype = memory.dense_dtype_name(EngineConfig(device="cpu"))
    per_token = memory.kv_bytes_per_token(smollm_folder, dtype)
    weights = memory.weight_bytes(smollm_folder, dtype)
    fraction = (weights + 50_000 * per_token) / sizing.available_cpu_memory()
    sized = resolve_mem_fraction({"mem_fraction_static": fraction, "device": "cpu"})
    assert "mem_fraction_static" not in sized and abs(sized["max_total_tokens"] - 50_000) < 20_000
    capped = resolve_mem_fraction(
        {"mem_fraction_static": fraction, "device": "cpu", "max_total_tokens": 1000}
    )
    assert capped["max_total_tokens"] == 1000


def _sized_with_64_gib_free(monkeypatch, smollm_folder, **kwargs) -> int:
    """The pool resolve_mem_fraction gives SmolLM2 in float32 at 0.5 of 64 GiB free memory."""
    monkeypatch.setattr(memory, "available_memory", lambda device: 64 * 2**30)
    base = {"model_path": str(smollm_folder), "mem_fraction_static": 0.5, "dtype": "float32"}
    return memory.resolve_mem_fraction({**base, **kwargs})["max_total_tokens"]


def test_cpu_pool_is_capped_at_running_requests_times_context(
    monkeypatch, smollm_folder, caplog
) -> None:
    with caplog.at_level(logging.INFO, logger="sgl_lite"):
        small = _sized_with_64_gib_free(
            monkeypatch, smollm_folder, device="cpu", max_running_requests=4, context_length=1024
        )
    assert small == 4 * 1024
    assert "KV pool of 4096 tokens (capped by max_running_requests 4 x context 1024 from" in (
        caplog.text
    )
    assert "committed as it is used; 0.5 of 64.00 GiB free RAM" in caplog.text
    # The defaults: 64 running requests, SmolLM2's own 8192 positions (a longer context_length
    # is cut to what the model takes).
    assert _sized_with_64_gib_free(monkeypatch, smollm_folder, device="cpu") == 64 * 8192
    longer = _sized_with_64_gib_free(monkeypatch, smollm_folder, device="cpu", context_length=10**5)
    assert longer == 64 * 8192
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sgl_lite"):
        given = _sized_with_64_gib_free(
            monkeypatch, smollm_folder, device="cpu", max_total_tokens=1000
        )
    assert (
        given == 1000 and "KV pool of 1000 tokens (capped by max_total_tokens from" in caplog.text
    )


def test_cuda_pool_is_the_fraction_of_free_memory_without_a_context_cap(
    monkeypatch, smollm_folder
) -> None:
    # a slot: its K/V and the prompt logprob entries kept beside it
    per_token = sizing.slot_bytes(memory.kv_bytes_per_token(smollm_folder, "float32"))
    weights = memory.weight_bytes(smollm_folder, "float32")
    fits = sizing.pool_tokens(0.5, 64 * 2**30, weights, per_token)
    assert fits > 64 * 8192  # so a context cap, had CUDA one, would show
    assert _sized_with_64_gib_free(monkeypatch, smollm_folder, device="cuda:0") == fits
