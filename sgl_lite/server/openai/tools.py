"""OpenAI tool calling over plain generation: checking `tools`, the prompt, the constraint.

The engine knows nothing about tools. `plan_tools` checks a request's `tools`/`tool_choice` and
decides how the answer is generated:

| tool_choice          | tools in prompt | generation                        | scanned as     |
|----------------------|-----------------|-----------------------------------|----------------|
| "none" (or no tools) | no              | free text                         | -              |
| "auto"               | yes             | free text, calls in its format    | blocks in text |
| "required"           | yes             | json_schema: a JSON list of calls | that list      |
| {"function": name}   | yes             | json_schema: its `parameters`     | the arguments  |

"Its format" is the one the chat template teaches (`tool_formats.py`). A forced call is one
JSON Schema handed to the engine like any request's `json_schema` (`constraint`): the server
knows nothing of how the engine compiles it.

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
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from sgl_lite.common.tokenizer import ChatTokenizer, Tokenizer
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

# Any JSON object inside a required choice's list of calls, nested at most three deep. NOTE:
# nested in a larger schema, `{"type": "object"}` is not what it is alone: the automaton writes
# a free nested value as a scalar only, llguidance at any depth. This bound says it outright, so
# every backend writes the same calls (an unbounded one would also make the automaton's index
# slow to build). Alone (json_object, a named free-form function) an object schema is built as a
# real recursive grammar.
_SCALAR: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}
_ARRAY: dict[str, Any] = {"type": "array", "items": _SCALAR}
BOUNDED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            _SCALAR,
            _ARRAY,
            {"type": "object", "additionalProperties": {"anyOf": [_SCALAR, _ARRAY]}},
        ]
    },
}


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
    import jsonschema  # NOTE: at first use (~1 s), as in the constraint layer

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
# keywords that name a schema resource or its dialect: meaningful at a root only
_ROOT_KEYS = ("$schema", "$id")
# keywords whose values are data, not schemas: a "$ref" in them is not a reference
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})
# keywords whose values map names to schemas
_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def is_free_form(schema: dict[str, Any]) -> bool:
    """Whether a function's `parameters` allow any JSON object: no properties, nothing but
    annotations, and `additionalProperties` absent or true."""
    return (
        set(schema) <= _FREE_FORM_KEYS
        and not schema.get("properties")
        and schema.get("additionalProperties", True) is True
    )


class ToolConstraint(NamedTuple):
    """A forced tool call's constraint: the engine's sampling param, and the request field an
    engine refusal of it names (the one tool's `parameters`, else `tools`)."""

    params: dict[str, str]  # {"json_schema": ...}, or {} for free text
    field: str | None


def constraint(plan: ToolPlan) -> ToolConstraint:
    """The constraint of a required or named tool choice, as one JSON Schema the engine builds
    like any other `json_schema`; no params for free text.

    Named: the function's `parameters` as they are. Required: a JSON list of
    `{"name": NAME, "arguments": ARGS}` objects, one of each tool's (one element unless
    parallel_tool_calls); the engine writes JSON as `json.dumps` lays it out (", ", ": "), so
    the text is `[{"name": "f", "arguments": {...}}, ...]` exactly (`call_list_schema`).
    """
    names = list(plan.schemas)
    field = {name: f"tools[{i}].function.parameters" for i, name in enumerate(names)}
    if plan.mode == "named":
        assert plan.named is not None
        schema = plan.schemas[plan.named]
        return ToolConstraint({"json_schema": json.dumps(schema)}, field[plan.named])
    if plan.mode != "required":
        return ToolConstraint({}, None)
    schema = call_list_schema(plan.schemas, parallel=plan.parallel)
    return ToolConstraint(
        {"json_schema": json.dumps(schema)}, field[names[0]] if len(names) == 1 else "tools"
    )


def call_list_schema(schemas: dict[str, dict[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """The JSON Schema of a required choice's answer: a non-empty list (of one call unless
    `parallel`) of `{"name": NAME, "arguments": ARGS}` objects, name first, for the functions
    of `schemas` (name -> parameters). Free-form parameters become `BOUNDED_OBJECT_SCHEMA`;
    others are embedded with their local `$ref`s pointing where they now are (and without
    `$schema`/`$id`, which mean something at a root only)."""
    calls = []
    for i, (name, parameters) in enumerate(schemas.items()):
        where = f"/items/anyOf/{i}/properties/arguments"
        arguments = (
            BOUNDED_OBJECT_SCHEMA if is_free_form(parameters) else _embedded(parameters, where)
        )
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _embedded(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """`schema` as a sub-schema at JSON pointer `where` of a larger one."""
    return {k: _rebased(v, where) for k, v in schema.items() if k not in _ROOT_KEYS}


def _rebased(node: Any, where: str, names: bool = False) -> Any:
    """`node` with every local `$ref` ("#...") prefixed by `where`; data keywords untouched
    (`names`: `node` maps names to schemas, as `properties` does, so its keys are not
    keywords)."""
    if isinstance(node, list):
        return [_rebased(v, where) for v in node]
    if not isinstance(node, dict):
        return node
    if names:
        return {name: _rebased(sub, where) for name, sub in node.items()}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = "#" + where + value[1:]
        elif key in _DATA_KEYS:
            out[key] = value
        else:
            out[key] = _rebased(value, where, names=key in _NAME_MAPS)
    return out


def regex_literal(text: str) -> str:
    """A regex matching exactly `text` in every dialect the grammar backends read."""
    # NOTE: only regex operators: `re.escape` also escapes "-", which not every dialect accepts
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


# --- the prompt ------------------------------------------------------------------------------
def template_renders_tools(tokenizer: Tokenizer | None) -> bool:
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
    tokenizer: ChatTokenizer,
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
