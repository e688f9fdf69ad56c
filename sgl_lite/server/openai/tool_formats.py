"""The tool-call formats of the common chat templates, and which one a tokenizer's template uses.

With `tool_choice: "auto"` the model writes calls in the format its chat template taught it:

| parser      | families           | a call (`C` is `{"name": ..., "arguments": {...}}`) |
|-------------|--------------------|------------------------------------------------------|
| hermes      | Qwen 2.5/3, Hermes | `<tool_call>C</tool_call>`, one block per call       |
| llama3_json | Llama 3.1-3.3      | `<|python_tag|>`? `C` (`"parameters"`; `;` between calls) |
| mistral     | Mistral / Mixtral  | `[TOOL_CALLS] [C, ...]`                              |
| granite     | Granite 3.x        | `<|tool_call|>[C, ...]` (`<|/tool_call|>` optional)  |
| phi4_mini   | Phi-4-mini         | `functools[C, ...]`                                  |

A format is a marker that opens a block of calls, an optional marker that closes it, and JSON
values (call objects, or lists of them) in between. `--tool-call-parser auto` (the default) picks
the format from the markers the chat template mentions, and hermes when it renders no tools
(then the default prompt, which teaches `<tool_call>`, is used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sgl_lite.backend.config import TOOL_CALL_PARSERS


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls: `open` starts a block, `close` (if any) ends it."""

    name: str
    open: str
    close: str | None = None
    bare_json: bool = False  # an answer that starts with "{" is a block too (Llama 3)
    separators: str = " \n\t,;"


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat("hermes", "<tool_call>", "</tool_call>"),
        ToolFormat("llama3_json", "<|python_tag|>", bare_json=True),
        ToolFormat("mistral", "[TOOL_CALLS]"),
        ToolFormat("granite", "<|tool_call|>", "<|/tool_call|>"),
        ToolFormat("phi4_mini", "functools"),
    )
}

# what in a chat template gives its format away, most specific first
_TEMPLATE_HINTS = (
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "granite"),
    ("<|tool|>", "phi4_mini"),
    ("functools", "phi4_mini"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),
    ("<tool_call>", "hermes"),
)


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template source ("" without one; named templates joined)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return template


def detect_format(template: str) -> ToolFormat:
    """The format a chat template's source teaches (hermes when it names none)."""
    for hint, name in _TEMPLATE_HINTS:
        if hint in template:
            return FORMATS[name]
    return FORMATS["hermes"]


def resolve_format(parser: str, tokenizer: Any, renders_tools: bool) -> ToolFormat:
    """The format for `--tool-call-parser NAME`; "auto" reads the template (ValueError on an
    unknown name)."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {parser!r}"
        )
    if parser != "auto":
        return FORMATS[parser]
    if not renders_tools:  # the default prompt teaches hermes' <tool_call>
        return FORMATS["hermes"]
    return detect_format(template_text(tokenizer))


def marker_is_special(fmt: ToolFormat, tokenizer: Any) -> bool:
    """Whether the format's opening marker is one added token, which decoding with
    skip_special_tokens would drop from the text the parser reads."""
    try:
        added = tokenizer.get_added_vocab()
    except AttributeError:
        return False
    return fmt.open in added
