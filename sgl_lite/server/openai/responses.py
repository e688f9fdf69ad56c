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

import contextlib
import copy
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter

from sgl_lite.server.bridge import EngineBridge, sse
from sgl_lite.server.openai.chat import ANY_OBJECT_SCHEMA, ToolSetup, _shed, tool_setup
from sgl_lite.server.openai.completions import model_checker
from sgl_lite.server.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ResponsesRequest,
    parse_request,
)
from sgl_lite.server.openai.tool_parser import new_call_id, scan, shown_content
from sgl_lite.server.openai.tools import (
    ToolPlan,
    chat_messages,
    chat_prompt,
    constraint,
    plan_tools,
)
from sgl_lite.server.protocol import (
    ApiError,
    ChatMessage,
    FunctionCall,
    JsonResponse,
    ToolCall,
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
    "json_schema": "text.format.schema",
    "regex": "tool_choice",
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
) -> ResponseStore:
    """Adds `POST /v1/responses` and `GET`/`DELETE /v1/responses/{id}` to `app`; returns the
    store (also `app.state.responses`)."""
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
        if max_tokens is None:  # until EOS: whatever room the context and the pool leave
            max_tokens = engine.max_new_tokens_room(len(ids))
        params: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            **req.sampling_extras(),
            **_constraint(req, plan, engine),
        }
        raw = plan.mode == "auto" and setup.keep_special
        if raw:
            params["skip_special_tokens"] = False
        draft = _Draft(req, served_model_name, plan, setup.ending if raw else ())
        sub = await bridge.submit(
            input_ids=ids,
            sampling_params=params,
            rid=draft.id,
            aliases=_ALIASES,
            overload_status=429,
        )
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
        draft.output.update(result["text"], final=True, status=_status(result))
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


def _constraint(req: ResponsesRequest, plan: ToolPlan, engine: Any) -> dict[str, str]:
    """The regex / json_schema sampling param from text.format or a forced tool call."""
    fmt = req.text.format if req.text is not None else None
    forced = plan.mode in ("required", "named")
    if forced and fmt is not None and fmt.type != "text":
        raise ApiError(
            400,
            "give one of text.format and a required or named tool_choice: each sets the "
            "output's format",
            param="text.format",
        )
    if forced:
        try:
            return constraint(plan, engine.builder.compiler)
        except ApiError as exc:
            raise _respelled(exc) from None
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":  # any object, any depth (see chat's json_object)
        return {"json_schema": ANY_OBJECT_SCHEMA}
    return {"json_schema": json.dumps(fmt.schema_)}


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


def _status(result: dict[str, Any]) -> str:
    """The response status a final engine result stands for."""
    kind = (result["meta_info"]["finish_reason"] or {}).get("type")
    return {"stop": "completed", "length": "incomplete"}.get(str(kind), "failed")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Output:
    """One response's output items, built from the engine's cumulative text.

    Each `update` returns the stream events the new text implies (without sequence numbers).
    Items open and close in order: a function call closes the message before it, and text
    after the calls opens a new message. NOTE: the non-streamed answer is one final update, so
    there all text is one message before the calls; a stream orders them as they came.
    """

    def __init__(self, plan: ToolPlan, shed: tuple[str, ...]) -> None:
        self.plan, self.shed = plan, shed
        self.items: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the open message item
        self.text_sent = 0  # content characters put in messages so far
        self.calls: list[int] = []  # per call: the index of its item
        self.closed: set[int] = set()  # indices of the items that are done

    def update(self, text: str, *, final: bool, status: str) -> list[dict[str, Any]]:
        """Events for what `text` (all the output so far) adds; `final` closes every item with
        the response's `status`."""
        if self.plan.mode == "none":
            content, calls = text, []
        else:
            result = scan(self.plan, _shed(text, self.shed if final else ()), final)
            content, calls = shown_content(result, final) or "", result.calls
        events = self._text(content)
        item_status = "completed" if status in ("completed", "in_progress") else "incomplete"
        for i, call in enumerate(calls):
            if i == len(self.calls):
                events += self._close_message("completed")
                item = {
                    "id": _new_id("fc"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": new_call_id(),
                    "name": call.name,
                    "arguments": "",
                }
                self.calls.append(len(self.items))
                self.items.append(item)
                events.append(_event("response.output_item.added", item, len(self.items) - 1))
            index = self.calls[i]
            item = self.items[index]
            if len(call.arguments) > len(item["arguments"]):
                delta = call.arguments[len(item["arguments"]) :]
                item["arguments"] = call.arguments
                events.append(
                    _event(
                        "response.function_call_arguments.delta",
                        None,
                        index,
                        item_id=item["id"],
                        delta=delta,
                    )
                )
            if (call.done or final) and index not in self.closed:
                events += self._close_call(index, item_status)
        if final:
            events += self._close_message(item_status)
        return events

    def _text(self, content: str) -> list[dict[str, Any]]:
        if len(content) <= self.text_sent:
            return []
        delta = content[self.text_sent :]
        self.text_sent = len(content)
        events = []
        if self.message is None:
            self.message = {
                "id": _new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.items.append(self.message)
            events.append(_event("response.output_item.added", self.message, len(self.items) - 1))
            self.message["content"].append(_text_part(""))
            events.append(self._part_event("response.content_part.added", part=_text_part("")))
        self.message["content"][0]["text"] += delta
        events.append(self._part_event("response.output_text.delta", delta=delta, logprobs=[]))
        return events

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self.message is None:
            return []
        text = self.message["content"][0]["text"]
        self.message["status"] = status
        index = self.items.index(self.message)
        events = [
            self._part_event("response.output_text.done", text=text, logprobs=[]),
            self._part_event("response.content_part.done", part=_text_part(text)),
            _event("response.output_item.done", self.message, index),
        ]
        self.closed.add(index)
        self.message = None
        return events

    def _close_call(self, index: int, status: str) -> list[dict[str, Any]]:
        self.closed.add(index)
        item = self.items[index]
        item["status"] = status
        return [
            _event(
                "response.function_call_arguments.done",
                None,
                index,
                item_id=item["id"],
                name=item["name"],
                arguments=item["arguments"],
            ),
            _event("response.output_item.done", item, index),
        ]

    def _part_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event of the open message's one text part."""
        assert self.message is not None
        index = self.items.index(self.message)
        return _event(kind, None, index, item_id=self.message["id"], content_index=0, **fields)


def _event(kind: str, item: dict[str, Any] | None, index: int, **fields: Any) -> dict[str, Any]:
    """A stream event about the output item at `index` (`item`: a snapshot of it goes along,
    since the item goes on changing after the event is sent)."""
    event: dict[str, Any] = {"type": kind, "output_index": index, **fields}
    if item is not None:
        event["item"] = copy.deepcopy(item)
    return event


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _Draft:
    """One response being made: its id, the request fields it echoes, and its output."""

    def __init__(
        self, req: ResponsesRequest, model: str, plan: ToolPlan, shed: tuple[str, ...]
    ) -> None:
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self.req, self.model = req, model
        self.store = req.store is not False
        self.output = _Output(plan, shed)

    def body(self, result: dict[str, Any] | None) -> dict[str, Any]:
        """The response object: in progress without a `result`, else finished by it."""
        req = self.req
        status = _status(result) if result is not None else "in_progress"
        meta = result["meta_info"] if result is not None else None
        reason = (meta or {}).get("finish_reason") or {}
        tool_choice: Any = req.tool_choice or "auto"
        if not isinstance(tool_choice, str):
            tool_choice = tool_choice.model_dump()
        fmt = req.text.format if req.text is not None and req.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": (
                {"code": "server_error", "message": reason.get("message") or "generation failed"}
                if status == "failed"
                else None
            ),
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": copy.deepcopy(self.output.items) if result is not None else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": self.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {
                "format": fmt.model_dump(by_alias=True) if fmt else {"type": "text"},
                "verbosity": "medium",
            },
            "tool_choice": tool_choice,
            "tools": [t.model_dump() for t in req.tools or []],
            "top_logprobs": 0,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": _usage(meta) if meta is not None else None,
            "user": req.user,
            "metadata": dict(req.metadata or {}),
        }

    async def events(self, chunks: Any, keep: Any) -> AsyncIterator[str]:
        """The SSE stream: created, in_progress, each item's events, then the final state."""
        sequence = 0

        def frame(kind: str, **fields: Any) -> str:
            nonlocal sequence
            event = {"type": kind, **fields, "sequence_number": sequence}
            sequence += 1
            return f"event: {kind}\n{sse(event)}"

        yield frame("response.created", response=self.body(None))
        yield frame("response.in_progress", response=self.body(None))
        final: dict[str, Any] | None = None
        async with contextlib.aclosing(chunks) as stream:
            async for chunk in stream:
                done = chunk["meta_info"]["finish_reason"] is not None
                status = _status(chunk) if done else "in_progress"
                if done:
                    final = chunk
                for event in self.output.update(chunk["text"], final=done, status=status):
                    kind = event.pop("type")
                    yield frame(kind, **event)
        if final is None:  # the engine's stream ended early: nothing more will come
            return
        body = self.body(final)
        keep(body)
        yield frame(f"response.{body['status']}", response=body)


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "input_tokens": prompt,
        # NOTE: cache_write_tokens counts OpenAI's explicitly cached prefixes; the radix cache
        # caches implicitly, and that costs nothing extra, so none are reported
        "input_tokens_details": {"cached_tokens": meta["cached_tokens"], "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
        # SGLang's names of the same counts (its Responses usage is chat's), for its clients
        "prompt_tokens": prompt,
        "completion_tokens": completion,
    }
