"""Wire models: the JSON bodies the server accepts (pydantic), the error body, and parsing.

Only the shape of a request is checked here (types, ranges the wire format fixes). What a value
means for generation (sampling ranges, prompt length, grammars) is the engine's to judge: its
`InvalidRequest` carries the field, and `error_for` turns it into the same 400 body. HTTP
statuses come from error types, never from message text.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.types import FinishReason
from sgl_lite.common import SAMPLING_PARAM_NAMES

# Seconds a request may wait and run before it is aborted (sgl_lite's extension of both APIs).
Timeout = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


class _Wire(BaseModel):
    # NOTE: unknown fields are ignored here: `compat.py` has already refused or removed each
    # top-level field a model does not read (`user`, `image_data`, ...); wrong types are rejected.
    model_config = ConfigDict(extra="ignore")


# --- native (SGLang) ---------------------------------------------------------------------------
class GenerateRequest(_Wire):
    """`POST /generate`: SGLang's GenerateReqInput, text-only."""

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = Field(-1, ge=-1)
    top_logprobs_num: StrictInt = Field(0, ge=0, le=100)
    # with return_logprob: per output token, these ids' logprobs (`output_token_ids_logprobs`)
    token_ids_logprob: list[StrictInt] | None = None
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    timeout: Timeout | None = None
    # SGLang's CustomLogitProcessor.to_str() (one, or one per prompt); the engine refuses it
    # unless started with --enable-custom-logit-processor
    custom_logit_processor: StrictStr | list[StrictStr | None] | None = None

    def to_input(self) -> GenerateInput:
        """The engine's generate call (raises the engine's InvalidRequest for a bad shape)."""
        return GenerateInput(
            prompt=self.text,
            input_ids=self.input_ids,
            sampling_params=self.sampling_params,
            return_logprob=self.return_logprob,
            logprob_start_len=self.logprob_start_len,
            top_logprobs_num=self.top_logprobs_num,
            token_ids_logprob=self.token_ids_logprob,
            return_text_in_logprobs=self.return_text_in_logprobs,
            stream=self.stream,
            rid=self.rid,
            timeout=self.timeout,
            custom_logit_processor=self.custom_logit_processor,
        )


class AbortRequest(_Wire):
    """`POST /abort_request`."""

    rid: StrictStr


# --- OpenAI ------------------------------------------------------------------------------------
class StreamOptions(_Wire):
    include_usage: StrictBool = False


class StructuredOutputs(_Wire):
    """vLLM's `structured_outputs` object (vLLM 0.12 on, which dropped the `guided_*` fields;
    Outlines' `from_vllm` sends it): one of `json`, `regex`, `choice`, `grammar`,
    `json_object`, and options (openai/guided.py maps and checks them). A key vLLM does not
    define is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    json_: StrictStr | dict[str, Any] | None = Field(None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = Field(None, min_length=1)
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None
    structural_tag: StrictStr | None = None
    whitespace_pattern: StrictStr | None = None
    disable_fallback: StrictBool = False
    disable_any_whitespace: StrictBool = False
    disable_additional_properties: StrictBool = False


class _SamplingFields(_Wire):
    """The sampling fields /v1/completions and /v1/chat/completions share (with SGLang's extras).

    Numbers are strict (an int is a number, `true` is not), as the published spec says."""

    model: StrictStr | None = None
    n: StrictInt = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0, le=2, strict=True)
    top_p: float = Field(1.0, gt=0, le=1, strict=True)
    stop: StrictStr | list[StrictStr] | None = None
    stop_regex: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2, strict=True)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, strict=True)
    # token id (a numeric string, as JSON keys are) -> bias; the engine checks ids and values
    logit_bias: dict[str, Any] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # SGLang's extensions
    top_k: StrictInt = -1
    min_p: float = Field(0.0, ge=0, le=1, strict=True)
    min_tokens: StrictInt = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, strict=True)
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    regex: StrictStr | None = None
    json_schema: StrictStr | dict[str, Any] | None = None
    ebnf: StrictStr | None = None
    # vLLM's legacy guided decoding: aliases of the three above (openai/guided.py)
    guided_json: StrictStr | dict[str, Any] | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = Field(None, min_length=1)
    guided_grammar: StrictStr | None = None
    # vLLM 0.12's replacement of the four above (openai/guided.py)
    structured_outputs: StructuredOutputs | None = None
    rid: StrictStr | None = None
    timeout: Timeout | None = None
    # SGLang's custom logit processor (--enable-custom-logit-processor) and what it reads
    custom_logit_processor: StrictStr | None = None
    custom_params: dict[str, Any] | None = None

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        """SGLang sampling params for the engine (it checks the values)."""
        fields = type(self).model_fields
        params = {name: getattr(self, name) for name in SAMPLING_PARAM_NAMES if name in fields}
        # OpenAI's spellings of SGLang's names
        params |= {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "sampling_seed": self.seed,
        }
        return {k: v for k, v in params.items() if v is not None}


# /v1/completions' max_tokens when the body leaves it out or sends null (OpenAI's default). The
# chat and responses routes default to `omitted_budget`; /generate to SamplingParams'
# DEFAULT_MAX_NEW_TOKENS.
COMPLETIONS_MAX_TOKENS = 16

# The chat and Responses budget when the body names none: OpenAI's "the model's maximum output
# tokens", a bound below the context. SGLang and vLLM give the whole room the context leaves,
# which on a CPU is minutes of decode for one request that never samples EOS (an empty prompt
# on a small model: the OpenAPI fuzz's minimal bodies); an explicit budget up to the room is
# still served. `create_app(default_max_tokens=None)` restores the whole room.
DEFAULT_MAX_TOKENS = 1024


def omitted_budget(room: int, default_max_tokens: int | None) -> int:
    """The max_new_tokens of a chat or Responses request that gave no budget: the room the
    context and the pool leave (`room`), at most `default_max_tokens` (None: no bound)."""
    return room if default_max_tokens is None else min(room, default_max_tokens)


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(COMPLETIONS_MAX_TOKENS, ge=0)
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False
    suffix: StrictStr | None = None


class ContentPart(_Wire):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Wire):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Wire):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None

    def text(self) -> str:
        """The message's content as one string (text parts joined)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class JsonSchemaFormat(_Wire):
    name: StrictStr | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Closed(_Wire):
    # NOTE: a tool's definition is refused, not trimmed, when it carries a field we do not know
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Closed):
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Closed):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Closed):
    name: StrictStr


class NamedToolChoice(_Closed):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_SamplingFields):
    """`POST /v1/chat/completions`."""

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=0)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    # vLLM's and SGLang's response prefill: the last (assistant) message is continued, not
    # closed; `add_generation_prompt` then defaults to false, and true with it is a 400
    continue_final_message: StrictBool = False
    add_generation_prompt: StrictBool | None = None
    # vLLM's and SGLang's extension: extra variables for the chat template
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description='Extra variables for the chat template, e.g. {"enable_thinking": false}.',
    )


# --- errors and parsing ------------------------------------------------------------------------
class ApiError(Exception):
    """An error answered with `error_body` and an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers
        self.type = type or {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            413: "RequestTooLargeError",
            429: "RateLimitError",
            503: "ServiceUnavailableError",
        }.get(status, "InternalServerError" if status >= 500 else "BadRequestError")

    def response(self) -> JSONResponse:
        return JsonResponse(
            error_body(self.message, type=self.type, param=self.param, code=self.status),
            status_code=self.status,
            headers=self.headers,
        )


class JsonResponse(JSONResponse):
    """JSON that allows -inf logprobs (Python's and most clients' parsers accept -Infinity)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_for(exc: InvalidRequest, aliases: dict[str, str] | None = None) -> ApiError:
    """The 400 for an engine refusal, naming its field in the caller's own spelling."""
    field = exc.field if exc.field is None else (aliases or {}).get(exc.field, exc.field)
    return ApiError(400, str(exc), param=field)


def failure_of(reason: FinishReason | None) -> ApiError | None:
    """The error a finished result stands for: None for an ordinary one (a client's own abort
    included); a 400 when the request was at fault (its grammar failed), else a 500."""
    if reason is None or reason.type != "abort" or reason.error is None:
        return None
    if isinstance(reason.error, InvalidRequest):
        return error_for(reason.error)
    return ApiError(500, reason.message or str(reason.error))


def error_body(
    message: str,
    *,
    type: str = "BadRequestError",
    param: str | None = None,
    code: int | str | None = 400,
) -> dict[str, Any]:
    """The error JSON every endpoint answers with: `{"error": {message, type, param, code}}`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_error(exc: ValidationError | RequestValidationError) -> ApiError:
    """A pydantic error as a 400 that names the first offending field."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    # NOTE: unions put the tried type in loc (e.g. text.str); keep the client's path only
    loc = [p for p in loc if not re.fullmatch(r"[a-z]+\[.*\]|str|int|list|dict|bool", p)]
    param = ".".join(loc) or None
    return ApiError(400, f"{param or 'body'}: {err.get('msg', 'invalid value')}", param=param)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object; 413 past `limit` bytes, 400 if it is not a JSON object."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"request body of {length} bytes exceeds the {limit}-byte limit")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(413, f"request body exceeds the {limit}-byte limit")
    data = _loads(body)
    if not isinstance(data, dict):
        raise ApiError(400, "the JSON body must be an object", param="body")
    return data


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _loads(body: bytes | bytearray) -> Any:
    """Decodes a JSON body; every way it can fail is a 400 naming the problem, never a 500."""
    try:
        data = json.loads(body)
    except RecursionError:  # the decoder recurses once per nesting level
        raise ApiError(400, "malformed JSON body: nested too deeply", param="body") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 5000 digits
        raise ApiError(400, f"malformed JSON body: {exc}", param="body") from None
    # NOTE: a lone \ud800 escape decodes to a str that cannot be encoded again; look for one
    # only when the raw body has such an escape at all (pairs decode to one code point).
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(data):
        raise ApiError(400, "malformed JSON body: a string holds a lone surrogate", param="body")
    return data


def _has_lone_surrogate(data: Any) -> bool:
    stack = [data]
    while stack:  # iterative: the value may be nested as deep as the decoder allowed
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= c <= "\udfff" for c in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """Validates `data` as `model`, raising a 400 ApiError that names the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
