"""The Responses API's answer built from the engine's text: output items (a `message`,
`function_call`s), the response object, and the typed stream events between them.

`ResponseDraft` is one response being made: its id, the request fields the answer echoes, and
its `ResponseOutput`, which turns the engine's cumulative text into items as it grows (tool
calls parsed by the chat route's parser) and, when streamed, into the events OpenAI's clients
read (`response.output_item.added`, `response.output_text.delta`, ... `response.completed`).
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sgl_lite.server.bridge import sse
from sgl_lite.server.openai.chat import _shed
from sgl_lite.server.openai.responses_protocol import ResponsesRequest
from sgl_lite.server.openai.tool_parser import new_call_id, scan, shown_content
from sgl_lite.server.openai.tools import ToolPlan


def response_status(result: dict[str, Any]) -> str:
    """The response status a final engine result stands for: an output that failed its
    constraint's final check has failed, whatever ended it."""
    if result["meta_info"].get("constraint_violation") is not None:
        return "failed"
    kind = (result["meta_info"]["finish_reason"] or {}).get("type")
    return {"stop": "completed", "length": "incomplete"}.get(str(kind), "failed")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
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


class ResponseDraft:
    """One response being made: its id, the request fields it echoes, and its output."""

    def __init__(
        self, req: ResponsesRequest, model: str, plan: ToolPlan, shed: tuple[str, ...]
    ) -> None:
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self.req, self.model = req, model
        self.store = req.store is not False
        self.output = ResponseOutput(plan, shed)

    def body(self, result: dict[str, Any] | None) -> dict[str, Any]:
        """The response object: in progress without a `result`, else finished by it."""
        req = self.req
        status = response_status(result) if result is not None else "in_progress"
        meta = result["meta_info"] if result is not None else None
        reason = (meta or {}).get("finish_reason") or {}
        violation = (meta or {}).get("constraint_violation")
        message = (
            f"the output failed its constraint's final check: {violation}"
            if violation is not None
            else reason.get("message") or "generation failed"
        )
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
            "error": ({"code": "server_error", "message": message} if status == "failed" else None),
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
                status = response_status(chunk) if done else "in_progress"
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
