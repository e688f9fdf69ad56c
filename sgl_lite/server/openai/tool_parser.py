"""Generated text → OpenAI tool calls, whole or as streaming deltas.

A scan reads the cumulative text of one choice and returns what is settled so far: content and
calls whose `arguments` text only ever grows. Streaming diffs successive scans (`ToolDeltas`);
a non-streamed answer is the scan of the final text, so the deltas of a stream concatenate to
exactly the non-streamed message.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sgl_lite.server.openai.tool_formats import ToolFormat
from sgl_lite.server.openai.tools import ToolPlan

_CALL_HEAD = re.compile(r'\s*\{"name": "([A-Za-z0-9_.-]+)", "arguments": ')


class Call(NamedTuple):
    """One call as far as it is generated: `arguments` is raw JSON text (complete once done)."""

    name: str
    arguments: str
    done: bool


class Scan(NamedTuple):
    """What a choice's text settles so far."""

    content: str
    calls: list[Call]


def scan(plan: ToolPlan, text: str, final: bool) -> Scan:
    """Scans `text` the way the plan generated it."""
    if plan.mode == "named":
        assert plan.named is not None
        return Scan("", [Call(plan.named, text, final)])
    if plan.mode == "required":
        return _scan_calls(text)
    return _scan_auto(plan, text, final)


def _scan_calls(text: str) -> Scan:
    """A constrained JSON list of `{"name": ..., "arguments": ...}` (see tools.constraint)."""
    calls: list[Call] = []
    pos = 1 if text.startswith("[") else len(text)
    while pos < len(text):
        head = _CALL_HEAD.match(text, pos)
        if head is None:  # the name is not complete yet
            break
        start = head.end()
        end = json_value_end(text, start)
        if end is None:
            calls.append(Call(head[1], text[start:], False))
            break
        calls.append(Call(head[1], text[start:end], True))
        pos = end + 1  # past the call object's "}"
        while pos < len(text) and text[pos] in ", \n":
            pos += 1
    return Scan("", calls)


def json_value_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array opening at `start`; None if unclosed."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _scan_auto(plan: ToolPlan, text: str, final: bool) -> Scan:
    """Free text with blocks of calls in the plan's format (tool_formats.py).

    A block holding anything but known functions with valid arguments stays in the content, as
    text. While streaming, a tail that may become an opening marker and an unfinished block (no
    close marker yet, or none in this format) are held back, so each call is sent whole.
    """
    fmt = plan.format
    if fmt.python:
        return _scan_pythonic(plan, text, final)
    content: list[str] = []
    calls: list[Call] = []
    pos = 0
    while True:
        opened, body = _find_open(fmt, text, pos)
        if opened < 0:
            tail = text[pos:]
            content.append(tail if final else tail[: _safe_len(tail, fmt.open)])
            break
        content.append(text[pos:opened])
        closed = text.find(fmt.close, body) if fmt.close else -1
        if closed < 0 and not final:
            break
        end = len(text) if closed < 0 else closed + len(fmt.close or "")
        found = _parse_values(plan, fmt, text[body : closed if closed >= 0 else len(text)])
        room = len(found or []) if plan.parallel else max(0, 1 - len(calls))
        if found and room:
            calls.extend(found[:room])
        else:
            content.append(text[opened:end])
        pos = end
    return Scan("".join(content), calls)


def _find_open(fmt: ToolFormat, text: str, pos: int) -> tuple[int, int]:
    """(where a block opens, where its calls start) at or after `pos`; (-1, -1) if none."""
    opened = text.find(fmt.open, pos)
    if fmt.bare_json and pos == 0:
        brace = len(text) - len(text.lstrip())
        if text[brace : brace + 1] == "{" and (opened < 0 or brace < opened):
            return brace, brace
    return (opened, opened + len(fmt.open)) if opened >= 0 else (-1, -1)


def _parse_values(plan: ToolPlan, fmt: ToolFormat, body: str) -> list[Call] | None:
    """The calls in a block: JSON call objects or lists of them, between separators; None
    unless every value is a valid call."""
    decoder = json.JSONDecoder()
    calls: list[Call] = []
    pos = 0
    while True:
        while pos < len(body) and body[pos] in fmt.separators:
            pos += 1
        if pos == len(body):
            return calls or None
        try:
            value, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return None
        for obj in value if isinstance(value, list) else [value]:
            call = _call_from(plan, obj)
            if call is None:
                return None
            calls.append(call)


def _call_from(plan: ToolPlan, obj: Any) -> Call | None:
    """A call object (`arguments` or Llama's `parameters`) of a known function, else None."""
    if not isinstance(obj, dict) or obj.get("name") not in plan.schemas:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some templates write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    import jsonschema  # NOTE: at first use (~1 s), as in the constraint layer

    schema = plan.schemas[obj["name"]]
    if not isinstance(args, dict) or not jsonschema.validators.validator_for(schema)(
        schema
    ).is_valid(args):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False), True)


# A pythonic block opens as `[name(`; while streaming, a tail that may still grow into that waits.
_PY_OPEN = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PY_MAYBE_OPEN = re.compile(r"\[\s*([A-Za-z_][\w.]*\s*)?")
_JSON_NAMES = {"true": True, "false": False, "null": None}  # models often write JSON's literals


def _scan_pythonic(plan: ToolPlan, text: str, final: bool) -> Scan:
    """Free text with `[f(a=1), g()]` blocks (see `_scan_auto`: same holding back, same rule
    that a block of anything but valid calls of known functions stays text)."""
    content: list[str] = []
    calls: list[Call] = []
    pos = 0
    while True:
        opened = text.find("[", pos)
        while opened >= 0 and not _PY_OPEN.match(text, opened):
            if not final and _PY_MAYBE_OPEN.fullmatch(text, opened):
                break  # the tail may yet open a block: hold it back
            opened = text.find("[", opened + 1)
        if opened < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:opened])
        end = _python_list_end(text, opened)
        if end is None and not final:
            break
        end = len(text) if end is None else end
        found = _python_calls(plan, text[opened:end])
        room = len(found or []) if plan.parallel else max(0, 1 - len(calls))
        if found and room:
            calls.extend(found[:room])
        else:
            content.append(text[opened:end])
        pos = end
    return Scan("".join(content), calls)


def _python_list_end(text: str, start: int) -> int | None:
    """The index just past the `]` that closes the `[` at `start` (brackets inside Python
    string literals do not count); None if it is not closed yet."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1 if ch == "]" else None
    return None


def _python_calls(plan: ToolPlan, block: str) -> list[Call] | None:
    """The calls of a `[f(a=1, b="x"), g()]` block, read with `ast` (parsed, never evaluated:
    each argument must be a literal); None unless every element is a valid call."""
    try:
        tree = ast.parse(block, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[Call] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call):
            return None
        name = _dotted_name(node.func)
        if name is None or node.args or any(kw.arg is None for kw in node.keywords):
            return None  # not a named function, a positional argument, or **kwargs
        try:
            args = {kw.arg: _literal(kw.value) for kw in node.keywords}
            # through JSON: tuples become lists; sets, bytes and NaN are refused
            args = json.loads(json.dumps(args, allow_nan=False))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        call = _call_from(plan, {"name": name, "arguments": args})
        if call is None:
            return None
        calls.append(call)
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr) -> Any:
    """A Python literal (`ast.literal_eval`), JSON's true/false/null accepted as names."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values):
            if key is None:  # {**other}
                raise ValueError("not a literal")
            out[_literal(key)] = _literal(value)
        return out
    return ast.literal_eval(node)


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


def shown_content(result: Scan, final: bool) -> str | None:
    """The content a message shows: whitespace around calls is not content."""
    if result.content.strip() or (final and not result.calls):
        return result.content
    return None


def message(result: Scan) -> dict[str, Any]:
    """The non-streamed assistant message for a final scan."""
    out: dict[str, Any] = {"role": "assistant", "content": shown_content(result, True)}
    if result.calls:
        out["tool_calls"] = [
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in result.calls
        ]
    return out


@dataclass(eq=False)
class ToolDeltas:
    """Turns successive scans of one choice into OpenAI chat-chunk deltas."""

    content_sent: int = 0
    ids: list[str] = field(default_factory=list)
    args_sent: list[int] = field(default_factory=list)

    def delta(self, result: Scan, final: bool) -> dict[str, Any]:
        """What is new since the last scan: `content` and/or `tool_calls` entries."""
        out: dict[str, Any] = {}
        content = shown_content(result, final) or ""
        if len(content) > self.content_sent:
            out["content"] = content[self.content_sent :]
            self.content_sent = len(content)
        entries = []
        for i, call in enumerate(result.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(len(call.arguments))
                entries.append(
                    {
                        "index": i,
                        "id": self.ids[i],
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                )
            elif len(call.arguments) > self.args_sent[i]:
                entries.append(
                    {"index": i, "function": {"arguments": call.arguments[self.args_sent[i] :]}}
                )
                self.args_sent[i] = len(call.arguments)
        if entries:
            out["tool_calls"] = entries
        return out


def _safe_len(text: str, marker: str) -> int:
    """How much of `text` can be streamed as content: not a tail that may grow into `marker`."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return len(text) - k
    return len(text)
