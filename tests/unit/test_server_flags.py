"""SGLang's server flags: parsing and the KV pool's sizing rules (applied to SmolLM2's files, and
chat-template overrides rendered by its tokenizer: tests/tokenizer/test_server_flags_smollm.py)."""

from __future__ import annotations

import pytest

from sgl_lite.backend.kvcache import sizing
from sgl_lite.server_args import build_parser, chat_template_arg, check_args, engine_kwargs


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


def test_pool_cap_is_the_smallest_named_cap_and_running_requests_times_context() -> None:
    assert sizing.capped_pool(1000, []) == sizing.PoolSize(1000, 1000, None)
    assert sizing.capped_pool(1000, [("a", 2000), ("b", None)]) == (1000, 1000, None)
    assert sizing.capped_pool(1000, [("a", 600), ("b", 800)]) == (600, 1000, "a")
    assert sizing.capped_pool(1000, [("a", 800), ("b", 600)]) == (600, 1000, "b")
    assert sizing.usable_tokens(64, 8192) == 64 * 8192
    assert sizing.usable_tokens(1, 8) == sizing.MIN_POOL_TOKENS  # EngineConfig's lower bound
