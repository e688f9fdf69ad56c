"""The tool-call formats of the common chat templates, and which one a tokenizer's template uses.

With `tool_choice: "auto"` the model writes calls in the format its chat template taught it:

| parser      | families           | a call (`C` is `{"name": ..., "arguments": {...}}`) |
|-------------|--------------------|------------------------------------------------------|
| hermes      | Qwen 2.5/3, Hermes | `<tool_call>C</tool_call>`, one block per call       |
| llama3_json | Llama 3.1-3.3      | `<|python_tag|>`? `C` (`"parameters"`; `;` between calls) |
| mistral     | Mistral / Mixtral  | `[TOOL_CALLS] [C, ...]`                              |
| granite     | Granite 3.x        | `<|tool_call|>[C, ...]` (`<|/tool_call|>` optional)  |
| phi4_mini   | Phi-4-mini         | `functools[C, ...]`                                  |
| pythonic    | Llama 3.2+ (its pythonic template) | `[add(a=1, b=2), note(t="x")]`       |

A format is a marker that opens a block of calls, an optional marker that closes it, and JSON
values (call objects, or lists of them) in between; pythonic's block is a Python list of calls
with literal keyword arguments instead (`tool_parser` reads it with `ast`, never evaluating it).
`--tool-call-parser auto` (the default) picks the format from the markers the chat template
mentions, and hermes when it renders no tools (then the default prompt, which teaches
`<tool_call>`, is used). SGLang's names for these formats are accepted on the command line too
(`parser_for_flag`: `llama3`, `qwen`, `qwen25`).

When the chat template renders no tools, the default prompt teaches the model the format the
parser reads (`how_to_call`) and writes the history's calls in it (`write_calls`): a prompt that
taught `<tool_call>` under `--tool-call-parser llama3` would get answers that parser never reads.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from sgl_lite.backend.config import TOOL_CALL_PARSERS
from sgl_lite.common.tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls: `open` starts a block, `close` (if any) ends it."""

    name: str
    open: str
    close: str | None = None
    bare_json: bool = False  # an answer that starts with "{" is a block too (Llama 3)
    separators: str = " \n\t,;"
    python: bool = False  # the block is a Python list of calls, `open` to its matching `close`


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat("hermes", "<tool_call>", "</tool_call>"),
        ToolFormat("llama3_json", "<|python_tag|>", bare_json=True),
        ToolFormat("mistral", "[TOOL_CALLS]"),
        ToolFormat("granite", "<|tool_call|>", "<|/tool_call|>"),
        ToolFormat("phi4_mini", "functools"),
        ToolFormat("pythonic", "[", "]", python=True),
    )
}

_CALL = '{{"name": <function name>, "{key}": <arguments as a JSON object>}}'
_JSON_LIST = "a JSON list of call objects, and nothing else:\n"
# the default prompt's instruction for each format (after "To call a function, answer with ")
_HOW_TO_CALL = {
    "hermes": "one block per call, and nothing else in the block:\n"
    f"<tool_call>\n{_CALL.format(key='arguments')}\n</tool_call>",
    "llama3_json": 'only a JSON object per call (several separated by "; "), and nothing '
    f"else:\n{_CALL.format(key='parameters')}",
    "mistral": f"[TOOL_CALLS] and {_JSON_LIST}[TOOL_CALLS] [{_CALL.format(key='arguments')}]",
    "granite": f"<|tool_call|> and {_JSON_LIST}<|tool_call|>[{_CALL.format(key='arguments')}]",
    "phi4_mini": f"functools and {_JSON_LIST}functools[{_CALL.format(key='arguments')}]",
    "pythonic": "a Python list of calls with keyword arguments of literal values, and nothing "
    "else:\n[<function name>(<argument name>=<value>, ...), ...]",
}


def how_to_call(fmt: ToolFormat) -> str:
    """The default prompt's instruction for writing calls in `fmt`."""
    return "To call a function, answer with " + _HOW_TO_CALL[fmt.name]


def write_calls(fmt: ToolFormat, calls: list[tuple[str, Any]]) -> str:
    """(name, arguments) calls written as a model answering in `fmt` writes them (the history's
    calls under the default prompt); `tool_parser.scan` reads this text back as these calls."""
    dump = functools.partial(json.dumps, ensure_ascii=False)
    objects = [{"name": name, "arguments": args} for name, args in calls]
    if fmt.name == "hermes":
        return "\n".join(f"<tool_call>\n{dump(o)}\n</tool_call>" for o in objects)
    if fmt.name == "llama3_json":
        return "; ".join(dump({"name": name, "parameters": args}) for name, args in calls)
    if fmt.python:
        return "[" + ", ".join(_python_call(name, args) for name, args in calls) + "]"
    return f"{fmt.open}{' ' if fmt.name == 'mistral' else ''}{dump(objects)}"


def _python_call(name: str, args: Any) -> str:
    # JSON values are Python literals but for true/false/null, which the parser also reads
    if not isinstance(args, dict):
        return f"{name}()"
    kwargs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"{name}({kwargs})"


# SGLang's --tool-call-parser names of the formats above, where its name differs from ours
SGLANG_PARSER_NAMES = {"llama3": "llama3_json", "qwen": "hermes", "qwen25": "hermes"}

# what in a chat template gives its format away, most specific first
_TEMPLATE_HINTS = (
    ("[func_name1(", "pythonic"),  # the pythonic templates' own example of a call list
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "granite"),
    ("<|tool|>", "phi4_mini"),
    ("functools", "phi4_mini"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),
    ("<tool_call>", "hermes"),
)


def template_text(tokenizer: Tokenizer | None) -> str:
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


def resolve_format(parser: str, tokenizer: Tokenizer | None, renders_tools: bool) -> ToolFormat:
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


def parser_for_flag(value: str) -> str:
    """Our parser name for a `--tool-call-parser` value: one of ours, or SGLang's name of a
    format we implement; a ValueError naming every accepted name for any other (SGLang's
    deepseekv3, kimi_k2, gpt-oss, ... included: those formats are not implemented here)."""
    if value in TOOL_CALL_PARSERS:
        return value
    if value in SGLANG_PARSER_NAMES:
        return SGLANG_PARSER_NAMES[value]
    aliases = [f"{k} (= {v})" for k, v in SGLANG_PARSER_NAMES.items()]
    raise ValueError(
        f"--tool-call-parser {value}: no such tool-call format here; accepted: "
        f"{', '.join(TOOL_CALL_PARSERS)}, and SGLang's {', '.join(aliases)}"
    )


def marker_is_special(fmt: ToolFormat, tokenizer: Any) -> bool:
    """Whether the format's opening marker is one added token, which decoding with
    skip_special_tokens would drop from the text the parser reads."""
    try:
        added = tokenizer.get_added_vocab()
    except AttributeError:
        return False
    return fmt.open in added
