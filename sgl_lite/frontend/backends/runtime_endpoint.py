"""RuntimeEndpoint: a backend speaking SGLang's native HTTP protocol (`POST /generate`).

Works against an sgl_lite server or a real SGLang server. Connection errors are retried with
exponential backoff, and so is an overloaded server's 429 / 503 (waiting at least its
Retry-After, at most `max_backoff`); every request has a timeout. A step with its own `timeout`
(gen/run timeout=) sends the time it has left as the request's `timeout` field, so the server
aborts it and frees its slots, and bounds the HTTP call and the overload retries by the same
deadline; either way the step raises StepTimeout. The server tokenizes, so select
finds the choice's tokens by comparing the prefix's token ids with the joint tokenization's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sgl_lite.common.sequences import common_prefix_len
from sgl_lite.frontend.backends.base import (
    Backend,
    GenRequest,
    GenResult,
    Prompt,
    StepTimeout,
    timeout_of,
)
from sgl_lite.frontend.chat_template import (
    ChatTemplate,
    get_chat_template,
    get_chat_template_by_model_path,
)
from sgl_lite.frontend.choices import (
    ChoicesDecision,
    ChoicesMethod,
    logprob_values,
)

_WINDOW = 8  # tokens before the prefix's end that a choice's first token may merge into
_ANSWER_GRACE_S = 5.0  # past a step's deadline: time for the server's own abort answer to arrive


_STREAMED_LOGPROB_KEYS = (
    "input_token_logprobs",
    "output_token_logprobs",
    "input_top_logprobs",
    "output_top_logprobs",
)


class RuntimeEndpoint(Backend):
    """`RuntimeEndpoint("http://localhost:30000", api_key=None, verify=None,
    chat_template_name=None)`, SGLang's signature (`verify` is requests' TLS option);
    `timeout` bounds each HTTP read, `retries` / `overload_retries` the resends, `answer_grace`
    how long past a step's own deadline the server's abort answer is awaited."""

    # SGLang's flag for KV-level fork joins; sgl_lite joins forks by appending their text
    support_concate_and_append = False

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: str | bool | None = None,
        chat_template_name: str | None = None,
        *,
        chat_template: ChatTemplate | str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        overload_retries: int = 5,
        max_backoff: float = 30.0,
        answer_grace: float = _ANSWER_GRACE_S,
    ) -> None:
        import requests  # NOTE: on use, so `import sgl_lite` does not load it

        self._requests = requests
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = (connect_timeout, timeout)
        self.retries, self.backoff = retries, backoff
        self.overload_retries, self.max_backoff = overload_retries, max_backoff
        self.answer_grace = answer_grace  # past a step's deadline, for the server's abort answer
        self.model_info = self._call("GET", "/get_model_info")
        if chat_template_name is not None:
            if chat_template is not None:
                raise TypeError("give chat_template_name or chat_template, not both")
            chat_template = chat_template_name
        if isinstance(chat_template, str):
            chat_template = get_chat_template(chat_template)
        self.chat_template = chat_template or get_chat_template_by_model_path(
            self.model_info.get("model_path")
        )

    # --- HTTP ----------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        stream: bool = False,
        step_timeout: float | None = None,
    ) -> Any:
        requests = self._requests
        failures = overloads = 0
        deadline = None if step_timeout is None else time.monotonic() + step_timeout
        while True:
            http_timeout = self.timeout
            if deadline is not None:
                assert step_timeout is not None  # NOTE: a deadline is set only with a step timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StepTimeout(step_timeout, "no answer from the server before the deadline")
                body = {**body, "timeout": left}  # the server aborts it then, freeing its slots
                http_timeout = (self.timeout[0], min(self.timeout[1], left + self.answer_grace))
            try:
                resp = requests.request(
                    method,
                    self.base_url + path,
                    json=body,
                    stream=stream,
                    headers=self._headers(),
                    timeout=http_timeout,
                    **({} if self.verify is None else {"verify": self.verify}),
                )
            except requests.ReadTimeout as exc:
                if step_timeout is None:
                    raise
                raise StepTimeout(step_timeout, "the server did not answer in time") from exc
            except requests.ConnectionError as exc:
                if failures == self.retries:
                    raise ConnectionError(
                        f"cannot reach the server at {self.base_url} ({exc.__class__.__name__}) "
                        f"after {self.retries + 1} tries: start one with `python -m "
                        "sgl_lite.launch_server --port 30000` or check the URL"
                    ) from exc
                time.sleep(self._delay(failures))
                failures += 1
                continue
            if resp.status_code in (429, 503) and overloads < self.overload_retries:
                # The server is overloaded: nothing was queued, so the request is safe to resend.
                wait = min(max(_retry_after(resp), self._delay(overloads)), self.max_backoff)
                resp.close()
                if deadline is not None and time.monotonic() + wait >= deadline:
                    assert step_timeout is not None  # NOTE: as above, the deadline's own timeout
                    raise StepTimeout(
                        step_timeout,
                        f"the server was overloaded (HTTP {resp.status_code}) past the deadline",
                    )
                time.sleep(wait)
                overloads += 1
                continue
            break
        if resp.status_code >= 400:
            raise RuntimeError(
                f"{method} {path} failed with HTTP {resp.status_code}: {_error_message(resp)}"
            )
        return resp

    def _delay(self, attempt: int) -> float:
        """Exponential backoff, capped at `max_backoff`."""
        return min(self.backoff * 2**attempt, self.max_backoff)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return _json(self._send(method, path, body))

    def _generate(self, body: dict[str, Any]) -> Any:
        return self._call("POST", "/generate", body)

    def _body(self, prompt: Prompt, request: GenRequest) -> dict[str, Any]:
        return {
            "text": prompt.text,
            "sampling_params": dict(request.sampling_params),
            "return_logprob": request.return_logprob,
            "logprob_start_len": request.logprob_start_len,
            "top_logprobs_num": request.top_logprobs_num,
            "return_text_in_logprobs": request.return_text_in_logprobs,
        }

    # --- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        body = self._body(prompt, request)
        out = _json(self._send("POST", "/generate", body, step_timeout=request.timeout))
        meta = out.get("meta_info", {})
        if (timed_out := timeout_of(meta, request)) is not None:
            raise timed_out
        return GenResult(out["text"], meta)

    def generate_stream(self, prompt: Prompt, request: GenRequest) -> Iterator[GenResult]:
        body = {**self._body(prompt, request), "stream": True}
        resp = self._send("POST", "/generate", body, stream=True, step_timeout=request.timeout)
        last: GenResult | None = None
        try:
            for last in self._stream_results(resp):
                yield last
        except self._requests.RequestException as exc:  # a read timeout, mid-stream
            if request.timeout is None:
                raise
            raise StepTimeout(request.timeout, f"the stream stalled ({exc})") from exc
        if last is not None and (timed_out := timeout_of(last.meta_info, request)) is not None:
            raise timed_out

    def _stream_results(self, resp: Any) -> Iterator[GenResult]:
        # NOTE: SGLang's server streams only the new entries of each logprob list; the Backend
        # protocol reports them cumulatively (the last result has the full meta).
        seen: dict[str, list] = {}
        for chunk in _sse_chunks(resp):
            meta = dict(chunk.get("meta_info", {}))
            for key in _STREAMED_LOGPROB_KEYS:
                if isinstance(meta.get(key), list):
                    seen[key] = seen.get(key, []) + meta[key]
                    meta[key] = list(seen[key])
            yield GenResult(chunk["text"], meta)

    def stream_texts(self, prompt: str, sampling_params: dict | None) -> Iterator[str]:
        """The cumulative text of one streamed /generate (SGLang's Runtime.async_generate)."""
        body = {"text": prompt, "sampling_params": sampling_params or {}, "stream": True}
        resp = self._send("POST", "/generate", body, stream=True)
        for chunk in _sse_chunks(resp):
            yield chunk["text"]

    def cache_prefix(self, text: str) -> None:
        self._generate({"text": text, "sampling_params": {"max_new_tokens": 0}})

    # --- select -------------------------------------------------------------------------------
    def select(
        self, prompt: Prompt, choices: Sequence[str], method: ChoicesMethod
    ) -> ChoicesDecision:
        # The prefill also tells us the prefix's token ids (the server tokenizes).
        pre = self._generate(
            {
                "text": prompt.text,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": 0,
            }
        )
        prefix_ids = [e[1] for e in pre["meta_info"].get("input_token_logprobs") or []]
        window = max(len(prefix_ids) - _WINDOW, 0)
        outs = self._generate(
            {
                "text": [prompt.text + c for c in choices],
                "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True,
                "logprob_start_len": window,
            }
        )
        scored, choice_ids, choice_entries = [], [], []
        for out in outs:
            entries = out["meta_info"]["input_token_logprobs"]
            ids = [e[1] for e in entries]
            start = common_prefix_len(prefix_ids[window:], ids)
            start = min(start, len(entries) - 1)
            scored.append(logprob_values(entries[start:]))
            choice_ids.append(ids[start:])
            choice_entries.append([list(e) for e in entries[start:]])
        uncond = None
        if method.requires_unconditional_logprobs:
            res = self._generate(
                {
                    "input_ids": choice_ids,
                    "sampling_params": {"max_new_tokens": 0},
                    "return_logprob": True,
                    "logprob_start_len": 0,
                }
            )
            uncond = [logprob_values(r["meta_info"]["input_token_logprobs"]) for r in res]
        decision = method(
            choices=choices, token_logprobs=scored, unconditional_token_logprobs=uncond
        )
        meta = dict(decision.meta_info or {})  # a method may leave it None (SGLang's default)
        meta["prompt_tokens"] = len(prefix_ids)
        meta["cached_tokens"] = [o["meta_info"].get("cached_tokens") for o in outs]
        meta["input_token_logprobs"] = choice_entries  # SGLang's key, with the server's ids
        return ChoicesDecision(decision.decision, meta)

    # --- admin --------------------------------------------------------------------------------
    def flush_cache(self, empty_cache: bool = True) -> bool:
        """Empties the server's prefix cache (`empty_cache` is sent as SGLang's client does)."""
        self._send("POST", "/flush_cache", {"empty_cache": empty_cache})
        return True

    def get_model_name(self) -> str:
        """The served model's path (SGLang's name)."""
        return self.model_info.get("model_path")

    def get_chat_template(self) -> ChatTemplate:
        """The chat template programs are rendered with."""
        return self.chat_template

    def commit_lazy_operations(self, state: Any) -> None:
        """SGLang's prefill of a state's text so far: caches `state.text()` as a prefix."""
        self.cache_prefix(state.text())

    def fill_image(self, state: Any) -> None:
        """Refused: the server serves text-only models."""
        raise NotImplementedError(
            "fill_image: sgl_lite serves text-only models; describe the image in text instead"
        )

    def concatenate_and_append(self, src_rids: Any, dst_rid: Any) -> None:
        """Refused: forks are joined by text (`join("concate_and_append")`), not by KV."""
        raise NotImplementedError(
            "concatenate_and_append: sgl_lite joins forks by their text; use "
            'forks.join("concate_and_append") and the radix cache reuses the shared prefix'
        )

    def start_profile(self) -> None:
        """Refused: the server has no profiler endpoint."""
        raise NotImplementedError(_NO_PROFILER)

    def stop_profile(self) -> None:
        """Refused: the server has no profiler endpoint."""
        raise NotImplementedError(_NO_PROFILER)

    def get_server_info(self) -> dict[str, Any]:
        return self._call("GET", "/get_server_info")

    def get_model_info(self) -> dict[str, Any]:
        """The server's /get_model_info answer (model path, ...), read at connect time."""
        return self.model_info


_NO_PROFILER = (
    "start_profile/stop_profile: sgl_lite has no profiler endpoint; profile the server process "
    "with py-spy or torch.profiler, and read per-request timings from /metrics"
)


def _sse_chunks(resp: Any) -> Iterator[dict]:
    """The JSON objects of a streamed /generate response, up to `data: [DONE]`; a chunk that
    carries an error raises RuntimeError."""
    for line in resp.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"server error while streaming: {chunk['error']}")
        yield chunk


def _json(resp: Any) -> Any:
    """The response's JSON body (its text when it is not JSON)."""
    try:
        return resp.json()
    except ValueError:
        return resp.text


def _retry_after(resp: Any) -> float:
    """The response's Retry-After in seconds (0 when absent or an HTTP date)."""
    value = resp.headers.get("Retry-After", "")
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 0.0


def _error_message(resp: Any) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(body)
