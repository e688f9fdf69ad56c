"""The server's command line: SGLang's flag names (`build_parser`), the values sgl_lite cannot
honour refused with what to do instead (`check_args`), the no-op tuning flags logged
(`log_ignored_flags`, `sglang_flags.IGNORED_FLAGS`), and the Engine's keyword arguments from
them (`engine_kwargs`). Read by launch_server.main before any heavy import, so a bad flag fails
at once."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
import sys
from typing import NoReturn

from sgl_lite.sglang_flags import IGNORED_FLAGS, ignored_dest, ignored_flags

logger = logging.getLogger("sgl_lite.server")

ROUTER_HINT = (
    "sgl_lite runs one model replica per process; to use more cores or machines start one "
    "server per port and put sglang-router in front: `pip install sglang-router`, then "
    "`python -m sglang_router.launch_router --worker-urls http://127.0.0.1:30001 "
    "http://127.0.0.1:30002 --policy cache_aware`"
)


# SGLang's `--chunked-prefill-size -1` (never split a prompt): a prefill pass then takes up to
# this many tokens, SGLang's --max-prefill-tokens default, longer than any context we serve
UNCHUNKED_PREFILL_TOKENS = 16384


class _SGLangParser(argparse.ArgumentParser):
    """argparse that answers an unknown flag with the nearest flag we have (difflib)."""

    # NOTE: argparse's own (overloaded) signature, so no annotations that would narrow it
    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.describe_unknown(extras))
        return parsed

    def describe_unknown(self, extras: list[str]) -> str:
        """The error for arguments the parser does not know."""
        flags = [f.split("=", 1)[0] for f in extras if f.startswith("--")]
        if not flags:
            return f"unrecognized arguments: {' '.join(extras)}"
        ours = sorted({o for a in self._actions for o in a.option_strings if o.startswith("--")})
        parts = []
        for flag in flags:
            near = difflib.get_close_matches(flag, ours, n=1, cutoff=0.6)
            hint = f"the closest name sgl_lite has is {near[0]}" if near else "no similar flag"
            parts.append(f"{flag} is not a flag sgl_lite supports ({hint})")
        return "; ".join(parts) + "; see --help for every flag"

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line (SGLang's flag names)."""
    p = _SGLangParser(
        prog="python -m sgl_lite.launch_server",
        usage="%(prog)s [--model-path PATH] [--host HOST] [--port PORT] [flags] (see --help)",
        description="Serve a model over SGLang's and OpenAI's HTTP APIs.",
    )
    p.add_argument(
        "--model-path",
        default="default",
        help="local HF folder, .gguf file, hub id, or 'default' (embedded SmolLM2)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name /v1 clients use (default: the model path)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health",
    )
    p.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--schedule-policy", choices=["lpm", "fcfs"], default=None)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--grammar-backend", default=None)
    p.add_argument(
        "--tool-call-parser",
        default=None,
        help="how tool_choice 'auto' answers are read: auto (from the chat template), hermes, "
        "llama3_json, mistral, granite, phi4_mini or pythonic; SGLang's llama3, qwen and "
        "qwen25 name the same formats as llama3_json, hermes and hermes",
    )
    p.add_argument("--constrained-json-whitespace-pattern", default=None)
    p.add_argument("--disable-jump-forward", action="store_true")
    p.add_argument(
        "--disable-overlap-masks",
        action="store_true",
        help="compute grammar masks after the forward pass instead of beside it",
    )
    p.add_argument("--grammar-compile-timeout", type=float, default=None)
    p.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="run CUDA decode steps eagerly instead of replaying captured graphs",
    )
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["auto", "float32", "float16", "bfloat16"],
        help="dense weight dtype (auto: bf16 where the CPU has a bf16 GEMM or on CUDA, else f32)",
    )
    p.add_argument(
        "--quantization",
        default=None,
        choices=["auto", "none", "int8", "int4"],
        help="int kernels for decode and short passes (default auto: the file's own 4/8-bit "
        "codes, none for a float checkpoint; none: dense weights only)",
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="batch- and pass-invariant numerics: greedy output identical with the radix "
        "cache on and off, alone and batched (slower: int kernels on every pass, float64 "
        "attention)",
    )
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted (default 32 MiB); larger gets 413",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="most tokens a chat or Responses request with no budget may generate (default "
        "1024; 0: the whole room the context leaves, as SGLang and vLLM do)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="past this many waiting requests, new ones get 503 (native) / 429 (OpenAI)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="abort a request that waits and runs longer than this many seconds",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds in-flight requests get to finish before they are aborted",
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    # --- SGLang's flags for the same things ---------------------------------------------------
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="size the KV pool from free memory: free x FRACTION - weights (CPU: available RAM); "
        "--max-total-tokens, if given too, caps it",
    )
    p.add_argument(
        "--tp-size",
        "--tp",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="only 1",
    )
    p.add_argument(
        "--dp-size",
        "--dp",
        "--data-parallel-size",
        dest="dp_size",
        type=int,
        default=1,
        help="N > 1: N workers (a share of the cores each) behind sglang-router on --port",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the tokenizer run its repository's code (the model always runs our own code)",
    )
    p.add_argument("--tokenizer-path", default=None, help="tokenizer folder (default: the model's)")
    p.add_argument(
        "--chat-template",
        default=None,
        help="a .jinja/.json file, Jinja source, or a template name (chatml, llama-3-instruct...)",
    )
    p.add_argument(
        "--enable-custom-logit-processor",
        action="store_true",
        help="accept requests' custom_logit_processor (SGLang's dill-pickled class: code this "
        "server runs; needs the dill package)",
    )
    ignored = p.add_argument_group(
        "SGLang flags accepted and ignored",
        "Tuning knobs with nothing to tune on this engine; each one given is logged at start-up.",
    )
    for flag in IGNORED_FLAGS:
        kwargs: dict = {"dest": ignored_dest(flag), "default": None, "help": flag.why}
        if flag.takes_value:
            kwargs |= {"metavar": "VALUE", "nargs": "+" if flag.many else None}
        else:
            kwargs["action"] = "store_true"
        ignored.add_argument(flag.flag, **kwargs)
    return p


def log_ignored_flags(args: argparse.Namespace) -> None:
    """Logs each no-op flag given, once, with why it changes nothing."""
    for flag in ignored_flags(args):
        logger.warning("ignored: %s (%s)", flag.flag, flag.why)
    if getattr(args, "unchunked_prefill", False):
        logger.info(
            "--chunked-prefill-size -1: prompts are not split; a prefill pass takes up to %d "
            "tokens",
            args.chunked_prefill_size,
        )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects SGLang flag values sgl_lite cannot honour, with what to do instead (exit 2)."""
    if args.tp_size < 1 or args.dp_size < 1:
        parser.error("--tp-size and --dp-size must be >= 1")
    if args.default_max_tokens is not None and args.default_max_tokens < 0:
        parser.error(f"--default-max-tokens must be >= 0, got {args.default_max_tokens}")
    if args.tp_size > 1:
        parser.error(
            f"--tp-size {args.tp_size}: tensor parallelism is not supported. {ROUTER_HINT}"
        )
    if args.dp_size > 1:
        cores = os.cpu_count() or 1
        if args.dp_size > cores:
            parser.error(
                f"--dp-size {args.dp_size} is larger than the {cores} CPU cores here: each "
                "worker needs a core of its own; on several machines, run one server on each "
                "behind sglang-router (docs/server.md: Scale-out)"
            )
        if importlib.util.find_spec("sglang_router") is None:
            parser.error(
                f"--dp-size {args.dp_size} runs workers behind sglang-router, which is not "
                "installed: pip install 'sgl_lite[cluster]' (or: pip install sglang-router)"
            )
    if args.chat_template is not None:
        from sgl_lite.backend.runner.tokenizer_overrides import resolve_chat_template

        args.chat_template = chat_template_arg(args.chat_template)
        try:
            resolve_chat_template(args.chat_template)
        except ValueError as exc:
            from sgl_lite.frontend.chat_template import TEMPLATES

            parser.error(f"--chat-template: {exc}; SGLang names: {', '.join(sorted(TEMPLATES))}")
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static <= 1:
        parser.error(f"--mem-fraction-static must be in (0, 1], got {args.mem_fraction_static}")
    if args.tool_call_parser is not None:
        from sgl_lite.server.openai.tool_formats import parser_for_flag

        try:
            args.tool_call_parser = parser_for_flag(args.tool_call_parser)
        except ValueError as exc:
            parser.error(str(exc))
    for flag in ignored_flags(args):
        value = getattr(args, ignored_dest(flag))
        if flag.only and value not in flag.only:
            parser.error(f"{flag.flag} {value}: {flag.why}")
    if args.chunked_prefill_size == -1:
        args.chunked_prefill_size = max(UNCHUNKED_PREFILL_TOKENS, args.context_length or 0)
        args.unchunked_prefill = True  # logged with the ignored flags, once logging is set up


_ENGINE_FLAGS = (
    "served_model_name",
    "max_total_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "schedule_policy",
    "context_length",
    "grammar_backend",
    "constrained_json_whitespace_pattern",
    "grammar_compile_timeout",
    "num_threads",
    "device",
    "dtype",
    "quantization",
    "random_seed",
    "max_queued_requests",
    "request_timeout",
    "tokenizer_path",
    "chat_template",
    "tool_call_parser",
)


def chat_template_arg(value: str) -> str:
    """--chat-template: SGLang's template names become Jinja; files and Jinja pass through."""
    from pathlib import Path

    from sgl_lite.frontend.chat_template import TEMPLATES

    named = TEMPLATES.get(value)
    if named is None or Path(value).expanduser().exists():
        return value
    from sgl_lite.backend.runner.tokenizer_overrides import jinja_from_roles

    return jinja_from_roles(
        named.role_prefix_and_suffix, named.default_system_prompt, named.begin_text
    )


def default_max_tokens(flag: int | None) -> int | None:
    """The app's bound on a chat or Responses request with no budget, from
    --default-max-tokens: unset, the server's default; 0, none (the whole room)."""
    from sgl_lite.server.protocol import DEFAULT_MAX_TOKENS

    if flag is None:
        return DEFAULT_MAX_TOKENS
    return flag or None


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from parsed flags (unset flags keep the config defaults)."""
    kwargs = {
        name: getattr(args, name) for name in _ENGINE_FLAGS if getattr(args, name) is not None
    }
    for flag in (
        "disable_radix_cache",
        "disable_jump_forward",
        "trust_remote_code",
        "enable_deterministic_inference",
        "enable_custom_logit_processor",
    ):
        if getattr(args, flag):
            kwargs[flag] = True
    if args.disable_overlap_masks:
        kwargs["overlap_masks"] = False
    kwargs["log_level"] = args.log_level
    return kwargs
