"""`python -m sgl_lite.launch_server --model-path default --port 30000`: the HTTP server.

Parses SGLang's server flags, builds one Engine, and serves `create_app(engine)` under uvicorn.
Binds to loopback unless --host says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

logger = logging.getLogger("sgl_lite.server")


def build_parser() -> argparse.ArgumentParser:
    """The command line (SGLang's flag names)."""
    p = argparse.ArgumentParser(
        prog="python -m sgl_lite.launch_server",
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
    p.add_argument("--constrained-json-whitespace-pattern", default=None)
    p.add_argument("--disable-jump-forward", action="store_true")
    p.add_argument("--grammar-compile-timeout", type=float, default=None)
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
        help="int kernels for small batches (default none; auto: the GGUF's own 4-bit codes)",
    )
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted (default 32 MiB); larger gets 413",
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    return p


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
)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from parsed flags (unset flags keep the config defaults)."""
    kwargs = {
        name: getattr(args, name) for name in _ENGINE_FLAGS if getattr(args, name) is not None
    }
    for flag in ("disable_radix_cache", "disable_jump_forward"):
        if getattr(args, flag):
            kwargs[flag] = True
    kwargs["log_level"] = args.log_level
    return kwargs


def main(argv: list[str] | None = None) -> None:
    """Parses `argv`, loads the model and serves until interrupted."""
    import uvicorn

    from sgl_lite.backend.engine import Engine
    from sgl_lite.backend.server import create_app
    from sgl_lite.backend.server.http_server import DEFAULT_MAX_BODY_BYTES

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    started = time.perf_counter()
    engine = Engine(model_path=args.model_path, **engine_kwargs(args))
    info = engine.get_server_info()
    pool_tokens = info["pool_free_tokens"] + info["pool_used_tokens"]
    logger.info(
        "model %s (%s), device %s, dtype %s, %d threads, KV pool %d tokens (%.1f MiB), "
        "max running requests %d, loaded in %.1f s",
        args.model_path,
        info["model_path"],
        info["device"],
        info["dtype"],
        info["num_threads"],
        pool_tokens,
        info["kv_pool_bytes"] / 2**20,
        info["max_running_requests"],
        time.perf_counter() - started,
    )
    app = create_app(
        engine,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=args.log_level == "debug",
            timeout_graceful_shutdown=5,
        )
    )
    url = f"http://{args.host}:{args.port}"

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            logger.info(
                "ready: serving %s at %s (OpenAI API at %s/v1)",
                app.state.served_model_name,
                url,
                url,
            )

    threading.Thread(target=announce, name="sgl_lite-ready", daemon=True).start()
    try:
        server.run()
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
