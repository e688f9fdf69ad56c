"""`/tokenize`, `/detokenize` and `/tokenizer_info` (also under /v1) in the shapes SGLang and
vLLM answer, which remote-tokenizer clients (lm-evaluation-harness) read.

Tokenize takes a `prompt` (a string or a list) or chat `messages` (rendered exactly as
`/v1/chat/completions` renders them, tools included) and answers SGLang's
`{tokens, count, max_model_len}`, plus vLLM's `token_strs` when `return_token_strs` is set.
Detokenize answers both SGLang's `text` and vLLM's `prompt`. Tokenizer info is vLLM's: the
tokenizer's settings, its class, special tokens and the chat template the server renders with.
The tokenizer runs on a worker thread, never on the event loop.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator

from sgl_lite.common.tokenizer import ChatTokenizer, Tokenizer
from sgl_lite.server.bridge import EngineBridge
from sgl_lite.server.openai.tools import chat_messages, chat_prompt, plan_tools
from sgl_lite.server.protocol import (
    ApiError,
    ChatMessage,
    JsonResponse,
    NamedToolChoice,
    Tool,
    _Wire,
    parse,
    read_json,
)


class TokenizeRequest(_Wire):
    """`POST /tokenize`: one of `prompt` and `messages`."""

    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Wire):
    """`POST /detokenize`."""

    model: StrictStr | None = None
    tokens: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True


def add_tokenizer_routes(app: FastAPI, bridge: EngineBridge, *, max_body_bytes: int) -> None:
    """Adds /tokenize, /detokenize, /tokenizer_info and their /v1 aliases to `app`."""
    engine = bridge.engine  # NOTE: its tokenizer is read per request (test fakes have none)

    @app.get("/tokenizer_info")
    @app.get("/v1/tokenizer_info")
    async def get_tokenizer_info() -> JsonResponse:
        return JsonResponse(tokenizer_info(engine.tokenizer, engine.context_length))

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> JsonResponse:
        req = parse(TokenizeRequest, await read_json(request, max_body_bytes))
        tokenizer = engine.tokenizer
        if req.messages is not None:
            texts, single = [await bridge.call(_render, tokenizer, req)], True
            # NOTE: the rendered template already holds its special tokens
            special = bool(req.add_special_tokens)
        else:
            single = isinstance(req.prompt, str)
            texts = [req.prompt] if single else list(req.prompt or [])
            special = req.add_special_tokens is not False
        ids = [await bridge.call(tokenizer.encode, t, add_special_tokens=special) for t in texts]
        body: dict[str, Any] = {
            "tokens": ids[0] if single else ids,
            "count": len(ids[0]) if single else [len(i) for i in ids],
            "max_model_len": engine.context_length,
        }
        if req.return_token_strs:
            strs = [tokenizer.convert_ids_to_tokens(i) for i in ids]
            body["token_strs"] = strs[0] if single else strs
        return JsonResponse(body)

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> JsonResponse:
        req = parse(DetokenizeRequest, await read_json(request, max_body_bytes))
        tokenizer = engine.tokenizer
        tokens = req.tokens
        single = not tokens or not isinstance(tokens[0], list)
        batch: list[list[int]] = [tokens] if single else tokens
        vocab = len(tokenizer)
        for i, ids in enumerate(batch):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                where = "tokens" if single else f"tokens[{i}]"
                raise ApiError(
                    400, f"{where}: token id {bad[0]} is outside [0, {vocab})", param="tokens"
                )
        texts = [
            await bridge.call(tokenizer.decode, ids, skip_special_tokens=req.skip_special_tokens)
            for ids in batch
        ]
        text: str | list[str] = texts[0] if single else texts
        return JsonResponse({"text": text, "prompt": text})


def tokenizer_info(tokenizer: Tokenizer, max_model_len: int) -> dict[str, Any]:
    """vLLM's `GET /tokenizer_info` body: the tokenizer's `init_kwargs` as JSON (file paths left
    out), `tokenizer_class`, the special tokens as text (`eos_token`, `bos_token`, `pad_token`,
    `unk_token`; null when unset), the `chat_template` chat requests are rendered with (null
    without one) and the server's `max_model_len`."""
    settings = getattr(tokenizer, "init_kwargs", None) or {}
    info = {k: _json_value(v) for k, v in settings.items() if not k.endswith("_file")}
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the one apply_chat_template uses
        template = template.get("default")
    for name in ("eos_token", "bos_token", "pad_token", "unk_token"):
        info[name] = _json_value(getattr(tokenizer, name, None))
    return {
        **info,
        "tokenizer_class": type(tokenizer).__name__,
        "chat_template": template,
        "max_model_len": max_model_len,
    }


def _json_value(value: Any) -> Any:
    """A tokenizer setting as JSON: an AddedToken as its text, other objects as their str."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    content = getattr(value, "content", None)  # transformers' AddedToken
    return content if isinstance(content, str) else str(value)


def _render(tokenizer: ChatTokenizer, req: TokenizeRequest) -> str:
    plan = plan_tools(req.tools, req.tool_choice, True)
    try:
        return chat_prompt(
            tokenizer, chat_messages(req.messages or []), plan, req.add_generation_prompt
        )
    except Exception as exc:
        raise ApiError(400, f"chat template failed: {exc}", param="messages") from None
