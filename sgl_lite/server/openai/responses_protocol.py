"""The wire of `POST /v1/responses`: its pydantic models and what happens to each field.

As `compat.py` does for chat, every top-level field of OpenAI's Responses body is honoured (a
field of `ResponsesRequest`), accepted as a no-op (labels and cache hints that cannot change
one in-process engine's output), or refused with a 400 naming it when set to anything but its
default; an unknown field is refused too. Input items and tools are closed models: a field we do
not read is an error, never dropped. Errors name the field as OpenAI does (`input[0].content`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictBool, StrictInt, StrictStr, Tag, ValidationError

from sgl_lite.server.compat import _refuse
from sgl_lite.server.protocol import ApiError, _Closed, _Wire

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputText(_Closed):
    """A text part of an input message or tool output."""

    type: Literal["input_text"]
    text: StrictStr


class OutputText(_Closed):
    """An `output_text` part: a client sending an earlier response's message back as input."""

    type: Literal["output_text"]
    text: StrictStr
    annotations: list[Any] | None = None  # ours are always empty; a client's are only context
    logprobs: list[Any] | None = None


ContentPart = Annotated[
    InputText | OutputText,
    Discriminator(
        "type",
        custom_error_type="content_part",
        custom_error_message="a content part is input_text or output_text (text-only model)",
    ),
]


class MessageItem(_Closed):
    """A message: `{"role": "user", "content": "..."}` or the typed form with parts."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[ContentPart]
    id: StrictStr | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        """The content as one string (parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Closed):
    """A call the model made (an earlier response's output item, sent back)."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Closed):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | list[InputText]
    id: StrictStr | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        """The output as one string."""
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


def _item_type(value: Any) -> str:
    # NOTE: OpenAI's "easy" message has no type; an item without one is a message
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind or "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="input_item",
        custom_error_message=(
            "an input item is a message, a function_call or a function_call_output "
            "(text-only model, function tools only)"
        ),
    ),
]


class FunctionTool(_Closed):
    """A function the model may call (the Responses API's flat form)."""

    type: Literal["function"]
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionChoice(_Closed):
    """`tool_choice` naming one function."""

    type: Literal["function"]
    name: StrictStr


class FormatText(_Closed):
    type: Literal["text"]


class FormatJsonObject(_Closed):
    type: Literal["json_object"]


class FormatJsonSchema(_Closed):
    type: Literal["json_schema"]
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextConfig(_Closed):
    """`text`: the output's format."""

    format: (
        Annotated[FormatText | FormatJsonObject | FormatJsonSchema, Field(discriminator="type")]
        | None
    ) = None


class ResponsesRequest(_Wire):
    """`POST /v1/responses`: the fields of OpenAI's body this server honours."""

    model: StrictStr | None = None
    input: StrictStr | list[InputItem]
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, strict=True)
    top_p: float | None = Field(None, gt=0, le=1, strict=True)
    stream: StrictBool | None = None
    store: StrictBool | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = Field(None, max_length=16)  # echoed back
    user: StrictStr | None = None  # echoed back
    # SGLang's extensions of the body (its ResponsesRequest), as on /v1/chat/completions
    frequency_penalty: float = Field(0.0, ge=-2, le=2, strict=True)
    presence_penalty: float = Field(0.0, ge=-2, le=2, strict=True)
    repetition_penalty: float = Field(1.0, strict=True)
    top_k: StrictInt = -1
    min_p: float = Field(0.0, ge=0, le=1, strict=True)
    stop: StrictStr | list[StrictStr] | None = None

    def sampling_extras(self) -> dict[str, Any]:
        """SGLang's sampling extensions the request sets (the engine checks their values)."""
        extras = ("frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p")
        out = {k: getattr(self, k) for k in extras if k in self.model_fields_set}
        if self.stop is not None:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return out


_IMPLEMENTED = frozenset(ResponsesRequest.model_fields)
RESPONSES_NOOPS = frozenset(
    {"safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"}
    # applies to built-in tools only, and those are refused
    | {"max_tool_calls"}
    # include_obfuscation: the stream is never padded
    | {"stream_options"}
)
RESPONSES_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((None, False), "background responses are not implemented"),
    "conversation": ((None,), "conversations are not implemented; use previous_response_id"),
    "context_management": ((None, []), "context management (compaction) is not implemented"),
    # the encrypted content of reasoning items: there are none to include (a non-reasoning
    # model), so asking for it changes nothing; BFCL's reasoning-model entries send it
    "include": (
        (None, [], ["reasoning.encrypted_content"]),
        "no extra output data (logprobs, tool results) can be included",
    ),
    "prompt": ((None,), "stored prompt templates are not implemented"),
    "moderation": ((None,), "moderation is not available"),
    "top_logprobs": ((None, 0), "logprobs are not returned here; use /v1/chat/completions"),
    "truncation": ((None, "disabled"), "the input is never truncated: it must fit the context"),
    "service_tier": ((None, "auto", "default"), "there are no service tiers"),
}
_NOT_REASONING = "the model is not a reasoning model"
_TAG = re.compile(r"[a-z-]+\[.*\]|str|int|float|bool|list|dict")
_ITEM_TAGS = frozenset({"message", "function_call", "function_call_output"})


def parse_request(data: dict[str, Any]) -> ResponsesRequest:
    """The request in `data`; a 400 naming the field for a refused, unknown or invalid one."""
    _refuse(data, RESPONSES_REFUSED, _IMPLEMENTED | RESPONSES_NOOPS | {"reasoning"}, "")
    reasoning = data.get("reasoning")
    if reasoning is not None:  # {"effort": null} and the like say nothing: accepted
        # `summary` shapes reasoning items, and there are none: accepted as it changes nothing
        given = (
            [k for k, v in reasoning.items() if v is not None and k != "summary"]
            if isinstance(reasoning, dict)
            else []
        )
        if given or not isinstance(reasoning, dict):
            param = f"reasoning.{given[0]}" if given else "reasoning"
            raise ApiError(400, f"{param} is not supported: {_NOT_REASONING}", param=param)
    text = data.get("text")
    if isinstance(text, dict) and text.get("verbosity") is not None:
        raise ApiError(
            400,
            "text.verbosity is not supported: verbosity control is not implemented",
            param="text.verbosity",
        )
    for i, tool in enumerate(data.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise ApiError(
                400,
                f"tools[{i}].type {kind!r} is not supported: only function tools run here "
                "(built-in tools need OpenAI's servers)",
                param=f"tools[{i}].type",
            )
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise ApiError(
            400,
            f"tool_choice of type {choice.get('type')!r} is not supported: give none, auto, "
            'required or {"type": "function", "name": ...}',
            param="tool_choice",
        )
    body = {k: v for k, v in data.items() if k in _IMPLEMENTED}
    if isinstance(text, dict):
        body["text"] = {k: v for k, v in text.items() if k != "verbosity"}
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> ApiError:
    """The most specific error (the deepest location: a union's other branches are shallower),
    naming its field as OpenAI spells it."""
    err = max(exc.errors(), key=lambda e: len(e.get("loc", ())))
    param = ""
    loc = list(err.get("loc", ()))
    for k, part in enumerate(loc):
        if isinstance(part, int):
            param += f"[{part}]"
        elif _TAG.fullmatch(str(part)) or (
            part in _ITEM_TAGS and k > 0 and isinstance(loc[k - 1], int)
        ):
            continue  # a union's branch, not the client's path
        else:
            param += f".{part}" if param else str(part)
    return ApiError(
        400, f"{param or 'body'}: {err.get('msg', 'invalid value')}", param=param or None
    )
