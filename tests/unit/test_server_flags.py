"""SGLang's server flags: parsing, KV pool sizing from free memory, chat-template overrides."""

from __future__ import annotations

import logging

import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import memory
from sgl_lite.backend.kvcache import sizing
from sgl_lite.backend.runner.tokenizer_overrides import resolve_chat_template
from sgl_lite.frontend.chat_template import TEMPLATES
from sgl_lite.server_args import build_parser, chat_template_arg, check_args, engine_kwargs

MESSAGES = [{"role": "user", "content": 'Say "hi"\n'}, {"role": "assistant", "content": "hi"}]


def parse(*argv: str):
    parser = build_parser()
    args = parser.parse_args(list(argv))
    check_args(parser, args)
    return args


def test_sglang_flag_names_and_aliases_parse() -> None:
    args = parse(
        "--model-path", "default", "--host", "0.0.0.0", "--mem-fraction-static", "0.85",
        "--tp", "1", "--dp-size", "1", "--trust-remote-code", "--enable-metrics",
        "--tokenizer-path", "/tmp/tok", "--chat-template", "chatml", "--log-level", "debug",
    )  # fmt: skip
    assert (args.host, args.mem_fraction_static, args.tp_size, args.dp_size) == (
        "0.0.0.0", 0.85, 1, 1,
    )  # fmt: skip
    kwargs = engine_kwargs(args)  # check_args turned the template name into Jinja
    assert kwargs["tokenizer_path"] == "/tmp/tok"
    assert (
        kwargs["chat_template"] == chat_template_arg("chatml") and "{%" in kwargs["chat_template"]
    )
    assert kwargs["trust_remote_code"] is True and kwargs["log_level"] == "debug"
    assert parse("--tensor-parallel-size", "1").tp_size == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--mem-fraction-statc", "0.8"], "closest name sgl_lite has is --mem-fraction-static"),
        (["--tokenizer-mode", "auto"], "--tokenizer-mode is not a flag sgl_lite supports"),
        (["--tp-size", "2"], "sglang_router.launch_router"),
        (["--dp", "100000"], "--dp-size 100000 is larger than the"),
        (["--mem-fraction-static", "1.5"], "must be in (0, 1]"),
        (["--chat-template", "chatml-x"], "--chat-template: chat_template 'chatml-x' is neither"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv, needle, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_pool_tokens_is_free_times_fraction_minus_weights() -> None:
    gib = 2**30
    assert sizing.pool_tokens(0.5, 10 * gib, 1 * gib, 2**20) == 4 * 1024
    with pytest.raises(ValueError, match=r"leaves 0.00 GiB after 2.00 GiB of weights"):
        sizing.pool_tokens(0.1, 10 * gib, 2 * gib, 2**20)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sizing.pool_tokens(0.0, gib, 0, 1)


def test_free_memory_readers(tmp_path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable:   42 kB\n")
    assert sizing._meminfo_available(str(info)) == 42 * 1024
    assert sizing._meminfo_available(str(tmp_path / "missing")) is None
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("5\n")
    assert sizing._cgroup_headroom(str(tmp_path)) is None
    (tmp_path / "memory.max").write_text("1000\n")
    assert sizing._cgroup_headroom(str(tmp_path)) == 995
    assert sizing.available_cpu_memory() > 0


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


def test_worker_argv_replaces_the_per_worker_flags() -> None:
    from sgl_lite.cluster import worker_argv

    argv = ["--dp", "2", "--port=30000", "--host", "0.0.0.0", "--api-key", "k"]
    argv += ["--mem-fraction-static", "0.8", "--num-threads", "4", "--max-total-tokens", "64"]
    cmd = worker_argv(argv, 31000, 1, 0.4)
    assert cmd[1:3] == ["-m", "sgl_lite.launch_server"]
    assert cmd[3:] == [
        "--api-key", "k", "--max-total-tokens", "64", "--host", "127.0.0.1", "--port", "31000",
        "--num-threads", "1", "--mem-fraction-static", "0.400000",
    ]  # fmt: skip


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


def test_pool_cap_is_the_smallest_named_cap_and_running_requests_times_context() -> None:
    assert sizing.capped_pool(1000, []) == sizing.PoolSize(1000, 1000, None)
    assert sizing.capped_pool(1000, [("a", 2000), ("b", None)]) == (1000, 1000, None)
    assert sizing.capped_pool(1000, [("a", 600), ("b", 800)]) == (600, 1000, "a")
    assert sizing.capped_pool(1000, [("a", 800), ("b", 600)]) == (600, 1000, "b")
    assert sizing.usable_tokens(64, 8192) == 64 * 8192
    assert sizing.usable_tokens(1, 8) == sizing.MIN_POOL_TOKENS  # EngineConfig's lower bound


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
    per_token = memory.kv_bytes_per_token(smollm_folder, "float32")
    weights = memory.weight_bytes(smollm_folder, "float32")
    fits = sizing.pool_tokens(0.5, 64 * 2**30, weights, per_token)
    assert fits > 64 * 8192  # so a context cap, had CUDA one, would show
    assert _sized_with_64_gib_free(monkeypatch, smollm_folder, device="cuda:0") == fits
