"""Runtime: SGLang's `sgl.Runtime`, a handle on a backend chosen by its argument.

`Runtime()` starts the in-process engine on the embedded model, `Runtime(model_path=...)` on
another, `Runtime("http://host:port")` connects to a running server. Extra keyword arguments
go to the Engine (num_threads, max_total_tokens, ...). SGLang's Runtime methods are here too:
`generate` (the server's answer as a JSON string), `async_generate` / `add_request` (streamed
text), `get_tokenizer`, `url`; `encode` and the profiler are refused with what to use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from sgl_lite.frontend import sampling
from sgl_lite.frontend.backends.base import Backend
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.backends.runtime_endpoint import _NO_PROFILER, RuntimeEndpoint
from sgl_lite.frontend.interpreter import ProgramState


class Runtime:
    """A handle on the in-process engine or a remote server (see the module docstring)."""

    def __init__(
        self,
        model_path_or_url: str | None = None,
        *,
        model_path: str | None = None,
        api_key: str | None = None,
        launch_timeout: float | None = None,  # SGLang's; an in-process start has no timeout
        **kwargs: Any,
    ) -> None:
        target = model_path if model_path is not None else model_path_or_url
        if model_path is not None and model_path_or_url is not None:
            raise TypeError("Runtime() takes a model path or a URL once, not both")
        if isinstance(target, str) and target.startswith(("http://", "https://")):
            kwargs.pop("log_level", None)  # SGLang's server option; a client has no log level
            self.backend: Backend = RuntimeEndpoint(target, api_key=api_key, **kwargs)
        else:
            self.backend = EngineBackend(target, **kwargs)

    @property
    def endpoint(self) -> Backend:
        """The backend this runtime wraps (SGLang's name)."""
        return self.backend

    @property
    def engine(self) -> Any:
        """The in-process Engine (None for a remote server)."""
        return getattr(self.backend, "engine", None)

    def run(self, *exprs: Any, **run_kwargs: Any) -> Any:
        """Runs an anonymous program made of `exprs`; returns its state once done."""
        unknown = [
            k for k in run_kwargs if k not in (*sampling.RUN_ARGS, *sampling.REQUEST_OPTIONS)
        ]
        if unknown:
            raise TypeError(
                f"Runtime.run(): unknown argument(s) {unknown}; it takes the "
                f"expressions and run() defaults {list(sampling.RUN_ARGS)}"
            )
        state = ProgramState(self.backend, sampling.run_defaults(run_kwargs), name="run")
        for expr in exprs:
            state += expr
        state.close()
        state.sync()
        return state

    def __getattr__(self, name: str) -> Any:  # generate, select, cache_prefix, chat_template...
        if name == "backend":
            raise AttributeError(name)
        return getattr(self.backend, name)

    def flush_cache(self, empty_cache: bool = True) -> bool:
        """Empties the backend's prefix cache."""
        if isinstance(self.backend, RuntimeEndpoint):
            return self.backend.flush_cache(empty_cache)
        return self.backend.flush_cache()

    # --- SGLang's Runtime API ---------------------------------------------------------------
    @property
    def url(self) -> str:
        """The server's URL (a remote runtime only: the in-process engine serves no HTTP)."""
        if isinstance(self.backend, RuntimeEndpoint):
            return self.backend.base_url
        raise NotImplementedError(
            "Runtime.url: this runtime runs the engine in process and serves no HTTP; start "
            "`python -m sgl_lite.launch_server` and use sgl.Runtime(url) or sgl.RuntimeEndpoint"
        )

    @property
    def generate_url(self) -> str:
        """`url + "/generate"`."""
        return self.url + "/generate"

    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        lora_path: Any = None,
    ) -> str:
        """SGLang's `Runtime.generate`: one /generate call, its answer as a JSON string."""
        if lora_path is not None:
            raise NotImplementedError(
                "lora_path: sgl_lite serves no LoRA adapters; merge the adapter into the "
                "weights and serve the merged model"
            )
        request: dict[str, Any] = {
            "sampling_params": sampling_params,
            "return_logprob": return_logprob,
            "logprob_start_len": -1 if logprob_start_len is None else logprob_start_len,
            "top_logprobs_num": top_logprobs_num or 0,
        }
        if isinstance(self.backend, RuntimeEndpoint):
            out = self.backend._generate({"text": prompt, **request})
        else:
            out = self.engine.generate(prompt=prompt, **request)
        return json.dumps(out)

    async def async_generate(
        self, prompt: str, sampling_params: dict[str, Any] | None = None
    ) -> AsyncIterator[str]:
        """SGLang's `Runtime.async_generate`: the generated text, streamed as new chunks."""
        if isinstance(self.backend, RuntimeEndpoint):
            chunks: Any = _thread_aiter(self.backend.stream_texts(prompt, sampling_params))
        else:
            chunks = _texts(await self.engine.async_generate(prompt, sampling_params, stream=True))
        pos = 0
        async for text in chunks:
            if len(text) > pos:
                yield text[pos:]
                pos = len(text)

    add_request = async_generate

    def cache_prefix(self, prefix: str) -> None:
        """Prefills `prefix` into the prefix cache."""
        self.backend.cache_prefix(prefix)

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer (an in-process runtime; a server tokenizes on /tokenize)."""
        if isinstance(self.backend, RuntimeEndpoint):  # the one backend without an engine
            raise NotImplementedError(
                "Runtime.get_tokenizer: a remote server's tokenizer is not loaded here; POST "
                "/tokenize and /detokenize, or load transformers.AutoTokenizer from "
                f"{self.backend.get_model_name()!r}"
            )
        return self.engine.tokenizer

    def encode(self, prompt: Any) -> str:
        """Refused: SGLang's /encode is embeddings, and sgl_lite serves generation models."""
        raise NotImplementedError(
            "Runtime.encode: sgl_lite serves generation models, not embeddings; for token ids "
            "use Runtime.get_tokenizer().encode(text) or POST /tokenize"
        )

    def start_profile(self) -> None:
        """Refused: there is no profiler endpoint."""
        raise NotImplementedError(_NO_PROFILER)

    def stop_profile(self) -> None:
        """Refused: there is no profiler endpoint."""
        raise NotImplementedError(_NO_PROFILER)

    def get_server_info(self) -> dict[str, Any]:
        """The backend's server info (cache hit rate, config, ...)."""
        return self.backend.get_server_info()

    def shutdown(self) -> None:
        """Stops the engine (or closes the connection)."""
        self.backend.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


async def _texts(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield chunk["text"]


async def _thread_aiter(items: Any) -> AsyncIterator[Any]:
    """A blocking iterator read on a worker thread, one item at a time."""
    done = object()
    while (item := await asyncio.to_thread(next, items, done)) is not done:
        yield item
