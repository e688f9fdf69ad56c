"""`/v1/responses`: OpenAI's Responses API on the chat machinery, with a bounded response store.

A request becomes chat messages (`instructions` as the system message, then the conversation
of `previous_response_id`, then `input`), and from there the same prompt, tool plan and
constraint /v1/chat/completions builds (`tools.py`, `tool_parser.py`). The engine's text comes
back as output items (a `message`, `function_call`s) whole or as the typed stream events of
the Responses API. A stored response keeps its conversation as chat messages, so the next turn's
prompt starts with exactly the previous prompt and answer and the radix cache serves it.
The store lives in this process: it is lost on restart and is not shared between workers.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter

from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.server.bridge import EngineBridge
from sgl_lite.server.openai.chat import ANY_OBJECT_SCHEMA, ToolSetup, tool_setup
from sgl_lite.server.openai.completions import model_checker
from sgl_lite.server.openai.guided import NO_CONSTRAINT, Constraint
from sgl_lite.server.openai.responses_output import ResponseDraft, response_status
from sgl_lite.server.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ResponsesRequest,
    parse_request,
)
from sgl_lite.server.openai.tools import (
    ToolPlan,
    chat_messages,
    chat_prompt,
    constraint,
    plan_tools,
)
from sgl_lite.server.protocol import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChatMessage,
    FunctionCall,
    JsonResponse,
    ToolCall,
    omitted_budget,
    read_json,
)

# NOTE: each stored response keeps its whole conversation as text, up to a context's worth
# (~4 bytes a token), so the store is bounded: 1024 conversations of an 8k-token context are
# ~32 MB at worst, and a client continues from its latest responses, so the oldest can go.
DEFAULT_STORE_SIZE = 1024

# engine field names as a Responses client spells them, for an error's `param`
_ALIASES = {
    "max_new_tokens": "max_output_tokens",
    "input_ids": "input",
    "text": "input",
    "json_schema": "text.format.schema",  # a forced tool call's names its tools instead
}
_ITEMS: TypeAdapter[Any] = TypeAdapter(InputItem)


class Stored(NamedTuple):
    """A stored response: its body, and its conversation (input and output as chat messages,
    without its instructions: OpenAI does not carry them over to the next response)."""

    body: dict[str, Any]
    conversation: tuple[ChatMessage, ...]


class ResponseStore:
    """The last `capacity` stored responses, least recently used evicted first.

    NOTE: used only from the event loop, so it needs no lock."""

    def __init__(self, capacity: int = DEFAULT_STORE_SIZE) -> None:
        if capacity < 1:
            raise ValueError(f"the response store needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, Stored] = OrderedDict()

    def put(self, entry: Stored) -> None:
        """Stores `entry` under its response id, evicting the least recently used past
        `capacity`."""
        self._entries[entry.body["id"]] = entry
        self._entries.move_to_end(entry.body["id"])
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        """The stored response (now the most recently used), or None."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Removes a stored response; whether there was one."""
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)


def add_responses_routes(
    app: FastAPI,
    bridge: EngineBridge,
    *,
    served_model_name: str,
    accepted_names: set[str],
    max_body_bytes: int,
    store_size: int = DEFAULT_STORE_SIZE,
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
) -> ResponseStore:
    """Adds `POST /v1/responses` and `GET`/`DELETE /v1/responses/{id}` to `app`; returns the
    store (also `app.state.responses`). A body without `max_output_tokens` gets at most
    `default_max_tokens` (None: the whole room)."""
    engine = bridge.engine
    check_model = model_checker(served_model_name, accepted_names)
    setup = tool_setup(engine)
    store = ResponseStore(store_size)
    app.state.responses = store

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Any:
        req = parse_request(await read_json(request, max_body_bytes))
        check_model(req.model)
        prior: tuple[ChatMessage, ...] = ()
        if req.previous_response_id is not None:
            entry = store.get(req.previous_response_id)
            if entry is None:
                raise ApiError(
                    400,
                    f"previous response with id {req.previous_response_id!r} not found "
                    "(it was not stored, was deleted, or left the store)",
                    param="previous_response_id",
                )
            prior = entry.conversation
        turn = input_messages(req.input)
        system = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
        if not (system or prior or turn):
            raise ApiError(400, "input has no messages", param="input")
        plan = _plan(req, setup)
        try:
            text = chat_prompt(engine.tokenizer, chat_messages([*system, *prior, *turn]), plan)
        except ApiError as exc:
            raise _respelled(exc) from None
        except Exception as exc:
            raise ApiError(400, f"chat template failed: {exc}", param="input") from None
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        max_tokens = req.max_output_tokens
        if max_tokens is None:  # until EOS, within the room left and the server's default
            max_tokens = omitted_budget(engine.max_new_tokens_room(len(ids)), default_max_tokens)
        output_format = _constraint(req, plan)
        params: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            **req.sampling_extras(),
            **output_format.params,
        }
        raw = plan.mode == "auto" and setup.keep_special
        if raw:
            params["skip_special_tokens"] = False
        draft = ResponseDraft(req, served_model_name, plan, setup.ending if raw else ())
        with bridge.refusals({**_ALIASES, **output_format.aliases}):
            inp = GenerateInput(input_ids=ids, sampling_params=params, rid=draft.id)
            sub = await bridge.submit(inp, overload_status=429)
        conversation = (*prior, *turn)

        def keep(body: dict[str, Any]) -> None:
            if draft.store:
                output = input_messages([_ITEMS.validate_python(i) for i in body["output"]])
                store.put(Stored(body, (*conversation, *output)))

        if req.stream:
            try:
                chunks = await bridge.open_stream(sub)
            except ApiError as exc:
                raise _respelled(exc) from None
            return StreamingResponse(draft.events(chunks, keep), media_type="text/event-stream")
        try:
            result = (await bridge.collect(sub, request))[0]
        except ApiError as exc:
            raise _respelled(exc) from None
        draft.output.update(result["text"], final=True, status=response_status(result))
        body = draft.body(result)
        keep(body)
        return JsonResponse(body)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Any:
        for key, value in request.query_params.items():
            if not (key == "stream" and value.lower() == "false"):
                raise ApiError(400, f"query parameter {key} is not supported", param=key)
        entry = store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return JsonResponse(entry.body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Any:
        if not store.delete(response_id):
            raise _not_found(response_id)
        return JsonResponse({"id": response_id, "object": "response", "deleted": True})

    return store


def input_messages(items: str | list[Any]) -> list[ChatMessage]:
    """Input items as chat messages: consecutive function calls join the assistant message
    before them (one turn with `tool_calls`), a call's output is a `tool` message."""
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    out: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
    return out


def _plan(req: ResponsesRequest, setup: ToolSetup) -> ToolPlan:
    """The chat tool plan of the request's flat function tools and tool_choice."""
    tools = [
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
        for t in req.tools or []
    ]
    choice: Any = req.tool_choice
    if choice == "auto" and not tools:  # the default, echoed by every response: no tools, no calls
        choice = None
    elif choice is not None and not isinstance(choice, str):
        choice = {"type": "function", "function": {"name": choice.name}}
    parallel = True if req.parallel_tool_calls is None else req.parallel_tool_calls
    try:
        return plan_tools(tools, choice, parallel, setup.fmt)
    except ApiError as exc:
        raise _respelled(exc) from None


def _constraint(req: ResponsesRequest, plan: ToolPlan) -> Constraint:
    """The json_schema sampling param from text.format or a forced tool call, and the field an
    engine refusal of it names. A required or named tool_choice beside a text.format is the
    tool call, as on the chat route: the format is for an answer in text, which a forced call
    leaves out (the Agents SDK sends both for an agent with an output_type and a forced tool)."""
    fmt = req.text.format if req.text is not None else None
    forced = plan.mode in ("required", "named")
    if forced:
        tool = constraint(plan)
        field = tool.field and _CHAT_TOOL_FIELD.sub(r"tools[\1].", tool.field)
        return Constraint(tool.params, {"json_schema": field} if field else {})
    if fmt is None or fmt.type == "text":
        return NO_CONSTRAINT
    if fmt.type == "json_object":  # any object, any depth (see chat's json_object)
        return Constraint({"json_schema": ANY_OBJECT_SCHEMA}, {})
    return Constraint({"json_schema": json.dumps(fmt.schema_)}, {})


_CHAT_TOOL_FIELD = re.compile(r"tools\[(\d+)\]\.function\.")


def _respelled(exc: ApiError) -> ApiError:
    """A chat-layer error naming its field as the Responses API spells it."""
    param = exc.param and _ALIASES.get(exc.param, exc.param)
    param = param and _CHAT_TOOL_FIELD.sub(r"tools[\1].", param)
    message = _CHAT_TOOL_FIELD.sub(r"tools[\1].", exc.message)
    return ApiError(exc.status, message, param=param, type=exc.type, headers=exc.headers)


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"response with id {response_id!r} not found",
        param="response_id",
        type="NotFoundError",
    )
