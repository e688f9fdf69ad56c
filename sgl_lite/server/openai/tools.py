"""OpenAI tool calling over plain generation: checking `tools`, the prompt, the constraint.

The engine knows nothing about tools. `plan_tools` checks a request's `tools`/`tool_choice` and
decides how the answer is generated:

| tool_choice          | tools in prompt | generation                        | scanned as     |
|----------------------|-----------------|-----------------------------------|----------------|
| "none" (or no tools) | no              | free text                         | -              |
| "auto"               | yes             | free text, calls in its format    | blocks in text |
| "required"           | yes             | regex: a JSON list of calls       | that list      |
| {"function": name}   | yes             | that function's arguments (*)     | the arguments  |

"Its format" is the one the chat template teaches (`tool_formats.py`).
(*) a regex, or for a free-form `parameters` (any JSON object) a real JSON grammar.

So a required or named call always has arguments that match the function's `parameters`.
Tools reach the model through the tokenizer's chat template when it renders `tools`, else
through `DEFAULT_TOOL_PROMPT` in the system message, which teaches the format the answers are
parsed in (`tool_formats.how_to_call`: Hermes/Qwen's `<tool_call>` unless `--tool-call-parser`
names another).
"auto" answers are parsed in the format the template teaches (`tool_formats.py`, or
`--tool-call-parser`); parsing and streaming deltas live in `tool_parser.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel

from sgl_lite.backend.constrained import is_any_object
from sgl_lite.server.openai.tool_formats import (
    FORMATS,
    ToolFormat,
    how_to_call,
    template_text,
    write_calls,
)
from sgl_lite.server.protocol import ApiError

ToolMode = Literal["none", "auto", "required", "named"]

DEFAULT_TOOL_PROMPT = """# Tools

You can call functions to help answer. Their signatures, one JSON object per line:
<tools>
{tools}
</tools>

{how}"""

# Any JSON object inside a required choice's regex, nested at most three deep. NOTE: outlines'
# regex for it takes ~10 s to compile on SmolLM2's vocabulary; this one compiles in ~1 s. Alone
# (json_object, a named free-form function) it is a JSON Schema the engine builds as a grammar.
_WS = r"[ \n]{0,2}"
_STR = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"'
_NUM = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_SCALAR = rf"({_STR}|{_NUM}|true|false|null)"
_ARRAY = rf"\[{_WS}({_SCALAR}({_WS},{_WS}{_SCALAR})*)?{_WS}\]"


def _object(value: str) -> str:
    member = rf"{_STR}{_WS}:{_WS}{value}"
    return rf"\{{{_WS}({member}({_WS},{_WS}{member})*)?{_WS}\}}"


JSON_OBJECT_REGEX = _object(rf"({_SCALAR}|{_ARRAY}|{_object(rf'({_SCALAR}|{_ARRAY})')})")
EMPTY_OBJECT_REGEX = r"\{\}"


@dataclass(frozen=True, kw_only=True)
class ToolPlan:
    """How one chat request uses its tools (see the module's table)."""

    mode: ToolMode
    tools: tuple[dict[str, Any], ...]  # the request's tools as OpenAI dicts
    schemas: dict[str, dict[str, Any]]  # function name -> its parameters schema
    named: str | None = None
    parallel: bool = True
    format: ToolFormat = FORMATS["hermes"]  # how "auto" answers write calls

    @property
    def shown(self) -> bool:
        """Whether the tools are rendered into the prompt."""
        return self.mode != "none"


def plan_tools(
    tools: list[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    fmt: ToolFormat = FORMATS["hermes"],
) -> ToolPlan:
    """Checks `tools` and `tool_choice` (wire models or dicts; 400s name the field) and picks
    the generation mode; `fmt` is the format "auto" answers are read in."""
    tools = [_plain(t) for t in tools or []]
    tool_choice = _plain(tool_choice)
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if fn["name"] in schemas:
            raise ApiError(
                400, f"two tools are named {fn['name']!r}", param=f"tools[{i}].function.name"
            )
        schemas[fn["name"]] = _checked_parameters(fn.get("parameters"), i)
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    # NOTE: each message opens with SGLang's wording (clients match on it), then ours
    if tool_choice != "none" and not tools:
        what = "a specific tool" if isinstance(tool_choice, dict) else repr(tool_choice)
        raise ApiError(
            400,
            f"Tools cannot be empty if tool choice is set to {what}; give tools or "
            "tool_choice 'none'",
            param="tool_choice",
        )
    named = None
    if isinstance(tool_choice, dict):
        named = tool_choice["function"]["name"]
        if named not in schemas:
            raise ApiError(
                400,
                f"Tool '{named}' not found in tools list; tool_choice names it, and the tools "
                f"are {sorted(schemas)}",
                param="tool_choice",
            )
        mode: ToolMode = "named"
    else:
        mode = tool_choice
    return ToolPlan(
        mode=mode,
        tools=tuple(tools),
        schemas=schemas,
        named=named,
        parallel=parallel_tool_calls,
        format=fmt,
    )


def _plain(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value


def _checked_parameters(parameters: dict[str, Any] | None, i: int) -> dict[str, Any]:
    field = f"tools[{i}].function.parameters"
    if parameters is None:  # OpenAI: no parameters is a function of no arguments
        return {"type": "object", "properties": {}, "additionalProperties": False}
    invalid = f"Tool {i} function has invalid 'parameters' schema"  # SGLang's wording
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise ApiError(
            400,
            f"{invalid}: {field} is not a valid JSON Schema at {where}: {exc.message}",
            param=field,
        ) from None
    if parameters.get("type", "object") != "object":
        raise ApiError(
            400, f"{invalid}: {field} must describe a JSON object (type 'object')", param=field
        )
    return parameters


# keywords that do not constrain an object beyond its (absent) properties
_FREE_FORM_KEYS = {
    "type", "title", "description", "properties", "additionalProperties", "$schema",
}  # fmt: skip


def arguments_regex(compiler: Any, schema: dict[str, Any], field: str) -> str:
    """The regex a function's arguments are generated under inside a larger regex (a required
    choice's list of calls; a 400 naming `field` if the engine's JSON-schema support cannot
    express it). NOTE: a free-form object here is bounded (nested at most three deep); alone, as
    a named choice, it is a real grammar (`arguments_constraint`)."""
    if set(schema) <= _FREE_FORM_KEYS and not schema.get("properties"):
        # an object with no declared properties: {} if no others are allowed, else any object
        if schema.get("additionalProperties") is False:
            return EMPTY_OBJECT_REGEX
        if schema.get("additionalProperties", True) is True:
            return JSON_OBJECT_REGEX
    try:
        return compiler.regex_for("json_schema", schema)
    except ValueError as exc:
        raise ApiError(400, f"{field}: {exc}", param=field) from None


def arguments_constraint(compiler: Any, schema: dict[str, Any], field: str) -> dict[str, str]:
    """The sampling param a named function's arguments are generated under: any JSON object as
    a JSON Schema (the engine builds it as a recursive grammar, any depth), else a regex."""
    if is_any_object(schema):
        return {"json_schema": json.dumps(schema)}
    return {"regex": arguments_regex(compiler, schema, field)}


def constraint(plan: ToolPlan, compiler: Any) -> dict[str, str]:
    """The constraint sampling param of a required or named tool choice; {} for free text.

    Named: the function's arguments alone. Required: a regex for a JSON list of
    `{"name": ..., "arguments": ...}` objects (one element unless parallel_tool_calls).
    """
    names = list(plan.schemas)
    field = {name: f"tools[{i}].function.parameters" for i, name in enumerate(names)}
    if plan.mode == "named":
        assert plan.named is not None
        return arguments_constraint(compiler, plan.schemas[plan.named], field[plan.named])
    if plan.mode != "required":
        return {}
    calls = "|".join(
        r"\{"
        + regex_literal(json.dumps({"name": name})[1:-1])
        + r', "arguments": '
        + f"({arguments_regex(compiler, plan.schemas[name], field[name])})"
        + r"\}"
        for name in names
    )
    more = rf"(, ({calls}))*" if plan.parallel else ""
    return {"regex": rf"\[({calls}){more}\]"}


def regex_literal(text: str) -> str:
    """A regex matching exactly `text` in every dialect the grammar backends read."""
    # NOTE: only regex operators: `re.escape` also escapes "-", which not every dialect accepts
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


# --- the prompt ------------------------------------------------------------------------------
def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads a `tools` variable."""
    return "tools" in template_text(tokenizer)


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Wire `ChatMessage`s as template dicts: text content, "developer" as "system"."""
    return [
        {
            **m.model_dump(exclude_none=True, exclude={"content"}),
            "role": "system" if m.role == "developer" else m.role,
            "content": m.text(),
        }
        for m in messages
    ]


def chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    plan: ToolPlan,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
    continue_final_message: bool = False,
) -> str:
    """The prompt text for OpenAI `messages` (with tool calls and results) and the plan's tools.

    A template that renders tools gets them (and the messages' tool fields) as they are;
    otherwise the default block joins the system message and calls/results become text.
    `template_kwargs` (the request's `chat_template_kwargs`) are extra template variables.
    `continue_final_message` (response prefill; the caller checks the last message is the
    assistant's) leaves that message open, as transformers' `apply_chat_template` does: the
    text ends with its content, no end of turn, and the model continues it.
    """
    extra = dict(template_kwargs or {})
    if continue_final_message:
        if not messages[-1].get("content"):
            # NOTE: transformers cuts the render after the last occurrence of the content, so
            # an empty one would keep its end of turn; an empty prefill is a plain new turn
            messages, add_generation_prompt = messages[:-1], True
        else:
            extra["continue_final_message"] = True
    native = template_renders_tools(tokenizer)
    if native:
        kwargs = {"tools": list(plan.tools)} if plan.shown else {}
        if plan.shown and plan.format.name == "phi4_mini":
            messages = _phi_tools(messages, plan.tools)
        return tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **extra,
            **kwargs,
        )
    flat = [_flatten(m, plan.format) for m in messages]
    if plan.shown:
        block = DEFAULT_TOOL_PROMPT.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in plan.tools),
            how=how_to_call(plan.format),
        )
        if flat and flat[0]["role"] == "system":
            flat[0] = {"role": "system", "content": f"{flat[0]['content']}\n\n{block}"}
        else:
            flat.insert(0, {"role": "system", "content": block})
    return tokenizer.apply_chat_template(
        flat, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


def _phi_tools(messages: list[dict[str, Any]], tools: tuple[dict[str, Any], ...]) -> list:
    """Phi-4-mini's template reads the tools as a JSON string on the system message."""
    listed = json.dumps([t["function"] for t in tools], ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": listed}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": listed}, *messages]


def _flatten(message: dict[str, Any], fmt: ToolFormat) -> dict[str, str]:
    """One message as plain role/content for a template that knows no tools (its calls in the
    format the prompt teaches)."""
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = [
        (c["function"]["name"], _loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]
    if not calls:
        return {"role": role, "content": content}
    written = write_calls(fmt, calls)
    return {"role": role, "content": f"{content}\n{written}" if content else written}


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
