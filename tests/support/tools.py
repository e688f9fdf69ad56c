"""Tool definitions (OpenAI's function-tool shape) that the tool-calling tests share."""

from __future__ import annotations

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NOTE = {"type": "function", "function": {"name": "note-it", "parameters": {"type": "object"}}}
