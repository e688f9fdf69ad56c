"""OpenAI: a backend for any OpenAI-compatible server (sgl_lite, SGLang, vLLM, OpenAI).

With a chat model, gen() must come right after assistant_begin(): the closed messages go to
chat completions. `regex` / `json_schema` travel as extra body fields (sgl_lite and SGLang
understand them). select scores choices with echoed prompt logprobs from /v1/completions
where the server gives them; otherwise it fails with an error that says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from sgl_lite.common.sampling_names import OPENAI_SPELLINGS, SAMPLING_PARAM_NAMES
from sgl_lite.frontend.backends.base import Backend, GenRequest, GenResult, Prompt, StepTimeout
from sgl_lite.frontend.chat_template import ChatTemplate, get_chat_template_by_model_path
from sgl_lite.frontend.choices import ChoicesDecision, ChoicesMethod

if TYPE_CHECKING:  # NOTE: only for the types; `import sgl_lite` must not load openai
    from openai.types.chat import ChatCompletionMessageParam

# The SGLang sampling params OpenAI's API has too, under OpenAI's names.
_STANDARD = {
    name: OPENAI_SPELLINGS.get(name, name)
    for name in (
        "max_new_tokens",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stop",
    )
}
# Every other SGLang sampling param travels in the extra body (sgl_lite and SGLang read it).
_EXTRA = tuple(name for name in SAMPLING_PARAM_NAMES if name not in _STANDARD)
_COMPLETION_MODELS = ("gpt-3.5-turbo-instruct", "davinci", "babbage")
_NEUTRAL = {"top_k": -1, "min_p": 0.0, "ignore_eos": False, "stop_token_ids": []}


class OpenAI(Backend):
    """`OpenAI(model_name, base_url=..., api_key=...)`."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        **client_kwargs: Any,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ImportError(
                "the OpenAI backend needs the `openai` package: pip install openai"
            ) from exc
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
            **client_kwargs,
        )
        self.model_name = model_name
        if is_chat_model is None:  # OpenAI's own completion-only models; others are chat
            is_chat_model = not any(k in model_name for k in _COMPLETION_MODELS)
        self.is_chat_model = is_chat_model
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)

    def _args(self, request: GenRequest) -> dict[str, Any]:
        sp = request.sampling_params
        args = {_STANDARD[k]: v for k, v in sp.items() if k in _STANDARD}
        if isinstance(args.get("stop"), list) and not args["stop"]:
            args.pop("stop")
        extra = {k: sp[k] for k in _EXTRA if k in sp and sp[k] != _NEUTRAL.get(k, object())}
        if extra:
            args["extra_body"] = extra
        if request.return_logprob:
            args["logprobs"] = True if self.is_chat_model else max(request.top_logprobs_num, 1)
        if request.timeout is not None:  # the client's per-request timeout (OpenAI has no field)
            args["timeout"] = request.timeout
        return args

    def _use_chat(self, prompt: Prompt) -> bool:
        if not self.is_chat_model:
            return False
        if prompt.open_role != "assistant" or prompt.open_content:
            raise ValueError(
                f"OpenAI backend with chat model {self.model_name!r}: gen() must come right "
                "after assistant_begin() (or be the whole content of assistant(...)), since "
                "chat completions continue whole messages; pass is_chat_model=False to use "
                "text completions"
            )
        return True

    def generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        with _step_timeout(request):
            return self._generate(prompt, request)

    def _generate(self, prompt: Prompt, request: GenRequest) -> GenResult:
        args = self._args(request)
        if self._use_chat(prompt):
            resp = self.client.chat.completions.create(
                model=self.model_name, messages=_messages(prompt), **args
            )
            text = resp.choices[0].message.content or ""
        else:
            resp = self.client.completions.create(model=self.model_name, prompt=prompt.text, **args)
            text = resp.choices[0].text
        return GenResult(text, _meta(resp))

    def generate_stream(self, prompt: Prompt, request: GenRequest) -> Iterator[GenResult]:
        with _step_timeout(request):
            yield from self._generate_stream(prompt, request)

    def _generate_stream(self, prompt: Prompt, request: GenRequest) -> Iterator[GenResult]:
        args = self._args(request)
        text = ""
        # Two loops: chat chunks carry a delta, completion chunks the text itself.
        if self._use_chat(prompt):
            chat_chunks = self.client.chat.completions.create(
                model=self.model_name, messages=_messages(prompt), stream=True, **args
            )
            for chat_chunk in chat_chunks:
                if chat_chunk.choices:
                    choice = chat_chunk.choices[0]
                    text += choice.delta.content or ""
                    yield GenResult(text, {"finish_reason": choice.finish_reason})
        else:
            chunks = self.client.completions.create(
                model=self.model_name, prompt=prompt.text, stream=True, **args
            )
            for chunk in chunks:
                if chunk.choices:
                    c = chunk.choices[0]
                    text += c.text or ""
                    yield GenResult(text, {"finish_reason": c.finish_reason})

    def select(
        self, prompt: Prompt, choices: Sequence[str], method: ChoicesMethod
    ) -> ChoicesDecision:
        if method.requires_unconditional_logprobs:
            raise NotImplementedError(
                "unconditional_likelihood_normalized is not supported by the OpenAI backend; "
                "use token_length_normalized or the RuntimeEndpoint backend"
            )
        try:
            resp = self.client.completions.create(
                model=self.model_name,
                prompt=[prompt.text + c for c in choices],
                max_tokens=0,
                echo=True,
                logprobs=1,
                temperature=0,
            )
        except Exception as exc:  # the server's own error, restated
            raise NotImplementedError(
                f"select needs prompt logprobs (/v1/completions with echo=True, logprobs=1), "
                f"which {self.model_name!r} at this server does not provide ({exc}); use "
                "RuntimeEndpoint, or gen(regex='(a|b)') to choose by constrained generation"
            ) from exc
        by_index = sorted(resp.choices, key=lambda c: c.index)
        scored = []
        for c in by_index:
            lp = c.logprobs
            if lp is None or not lp.token_logprobs or lp.tokens is None or lp.text_offset is None:
                raise NotImplementedError(
                    f"the server returned no prompt logprobs for select with {self.model_name!r}"
                )
            # A token belongs to the choice when it ends past the prefix (it may straddle).
            scored.append(
                [
                    v
                    for tok, off, v in zip(lp.tokens, lp.text_offset, lp.token_logprobs)
                    if off + len(tok) > len(prompt.text) and v is not None
                ]
            )
        return method(choices=choices, token_logprobs=scored)

    def get_server_info(self) -> dict[str, Any]:
        return {"model": self.model_name, "base_url": str(self.client.base_url)}


def _messages(prompt: Prompt) -> list[ChatCompletionMessageParam]:
    # The closed messages are {"role", "content"} dicts of the roles OpenAI's API has.
    return cast("list[ChatCompletionMessageParam]", list(prompt.messages))


def _meta(resp: Any) -> dict[str, Any]:
    usage = getattr(resp, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    reason = resp.choices[0].finish_reason if resp.choices else None
    return {
        "id": getattr(resp, "id", None),
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "cached_tokens": getattr(details, "cached_tokens", None) or 0,
        "finish_reason": {"type": reason} if reason else None,
    }


@contextlib.contextmanager
def _step_timeout(request: GenRequest) -> Iterator[None]:
    """The openai client's timeout error as the frontend's StepTimeout."""
    try:
        yield
    except Exception as exc:
        if request.timeout is not None and type(exc).__name__ == "APITimeoutError":
            raise StepTimeout(request.timeout, str(exc)) from exc
        raise
