"""`python -m sgl_lite.launch_server --model-path default --port 30000`: the HTTP server.

Parses SGLang's server flags, builds one Engine, and serves `create_app(engine)` under uvicorn.
Binds to loopback unless --host says otherwise. The deployment guide's command lines work as
written: SGLang's common flags are accepted under their names (`--mem-fraction-static`,
`--tp-size 1`, `--trust-remote-code`, ...); SGLang's tuning flags that mean nothing on this
engine (`--cuda-graph-max-bs`, `--enable-torch-compile`, ...) are accepted, logged once as
ignored at start-up and listed apart in --help (`sglang_flags.IGNORED_FLAGS`, the one list of
them); any other SGLang flag sgl_lite does not have is an error that names it and the nearest
flag it does have (the flags and their checks: server_args.py). `--dp N` serves N worker
processes behind sglang-router as one command (`cluster.py`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from sgl_lite.server_args import (
    build_parser,
    check_args,
    default_max_tokens,
    engine_kwargs,
    log_ignored_flags,
)

logger = logging.getLogger("sgl_lite.server")


def main(argv: list[str] | None = None) -> None:
    """Parses `argv`, loads the model and serves until interrupted."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)  # before the heavy imports: a bad flag fails in a blink
    if args.dp_size > 1:
        from sgl_lite.cluster import serve_cluster

        logging.basicConfig(
            level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s"
        )
        log_ignored_flags(args)
        sys.exit(serve_cluster(args, argv))

    import uvicorn

    from sgl_lite.backend.engine import Engine
    from sgl_lite.server import create_app
    from sgl_lite.server.http_server import DEFAULT_MAX_BODY_BYTES
    from sgl_lite.server.lifecycle import DrainingServer

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log_ignored_flags(args)
    if args.disable_cuda_graph:
        from sgl_lite.backend.runner.decode_graphs import DISABLE_ENV

        os.environ[DISABLE_ENV] = "1"  # read by the model runner when it builds the graphs
    started = time.perf_counter()
    kwargs = engine_kwargs(args)
    if args.mem_fraction_static is not None:
        kwargs["mem_fraction_static"] = args.mem_fraction_static  # the engine sizes its pool
    try:
        engine = Engine(model_path=args.model_path, **kwargs)
    except ValueError as exc:  # a bad value, a missing model, no room for a KV pool
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
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
        default_max_tokens=default_max_tokens(args.default_max_tokens),
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.log_level == "debug",
    )
    server = DrainingServer(config, engine, args.shutdown_timeout)
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
