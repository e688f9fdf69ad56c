"""The tool-call formats of the common chat templates, without a model: each format's calls are
read from the text (content around them kept), bad blocks stay text, streaming deltas at any
split concatenate to the final message, and the format is picked from the chat template."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.config import TOOL_CALL_PARSERS, EngineConfig
from sgl_lite.server.openai.tool_formats import (
    FORMATS,
    detect_format,
    how_to_call,
    marker_is_special,
    resolve_format,
    write_calls,
)
from sgl_lite.server.openai.tool_parser import ToolDeltas, message, scan
from sgl_lite.server.openai.tools import chat_prompt, plan_tools
from tests.support.tools import ADD, NOTE

A12 = {"name": "add", "arguments": {"a": 1, "b": 2}}
N = {"name": "note-it", "arguments": {"t": "x]}"}}
L12 = {"name": "add", "parameters": {"a": 1, "b": 2}}


def plan(name: str, parallel: bool = True):
    return plan_tools([ADD, NOTE], "auto", parallel, FORMATS[name])


def dumps(value) -> str:
    return json.dumps(value)


# format -> (text with two calls and content before them, the content that remains)
TWO_CALLS = {
    "hermes": (
        f"Adding. <tool_call>{dumps(A12)}</tool_call><tool_call>{dumps(N)}</tool_call>",
        "Adding. ",
    ),
    "llama3_json": (f"{dumps(L12)}; {dumps(N)}", ""),
    "mistral": (f"Adding. [TOOL_CALLS] [{dumps(A12)}, {dumps(N)}]", "Adding. "),
    "granite": (f"Adding. <|tool_call|>[{dumps(A12)}, {dumps(N)}]", "Adding. "),
    "phi4_mini": (f"Adding. functools[{dumps(A12)}, {dumps(N)}]", "Adding. "),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
def test_each_format_reads_its_calls_and_keeps_the_content_before(name):
    text, content = TWO_CALLS[name]
    result = scan(plan(name), text, final=True)
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        ("add", {"a": 1, "b": 2}),
        ("note-it", {"t": "x]}"}),
    ]
    assert result.content == content
    assert message(result)["content"] == (content or None)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("llama3_json", f"<|python_tag|>{dumps(L12)}"),
        ("granite", f"<|tool_call|>[{dumps(A12)}]<|/tool_call|>"),
        ("granite", f"<|tool_call|>{dumps(A12)}"),  # one object, no list
        ("mistral", f"[TOOL_CALLS]{dumps([A12])}"),
        ("phi4_mini", f"functools{dumps([A12])}"),
    ],
)
def test_format_variants(name, text):
    [call] = scan(plan(name), text, final=True).calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_plain_text_is_content_in_every_format(name):
    text = "The sum of 1 and 2 is 3."
    result = scan(plan(name), text, final=True)
    assert result.calls == [] and message(result)["content"] == text


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("llama3_json", '{"name": "add", "parameters": {"a": "one", "b": 2}}'),  # invalid args
        ("llama3_json", '{"answer": 3}'),  # JSON, but not a call
        ("mistral", '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]'),  # not a tool
        ("granite", '<|tool_call|>[{"name": "add", "arguments": {"a": 1'),  # cut JSON
        ("phi4_mini", f"functools[{dumps(A12)}] and then some words"),  # text after the list
    ],
)
def test_a_bad_block_stays_text(name, text):
    result = scan(plan(name), text, final=True)
    assert result.calls == [] and result.content == text


@pytest.mark.parametrize("name", ["mistral", "granite", "phi4_mini", "llama3_json"])
def test_parallel_tool_calls_false_keeps_the_first_call(name):
    text, _ = TWO_CALLS[name]
    [call] = scan(plan(name, parallel=False), text, final=True).calls
    assert call.name == "add"


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
@settings(deadline=None)  # NOTE: a shared, loaded CPU; no per-example timing
@given(cuts=st.lists(st.integers(min_value=0, max_value=160), max_size=12))
def test_streamed_deltas_concatenate_to_the_final_message(name, cuts):
    text = TWO_CALLS[name][0] + (" Done." if name == "hermes" else "")
    tools = plan(name)
    deltas, content, calls = ToolDeltas(), "", {}
    for cut in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        final = cut == len(text)
        delta = deltas.delta(scan(tools, text[:cut], final), final)
        content += delta.get("content", "")
        for d in delta.get("tool_calls", []):
            entry = calls.setdefault(d["index"], ["", ""])
            entry[0] += d["function"].get("name", "")
            entry[1] += d["function"]["arguments"]
    whole = message(scan(tools, text, True))
    assert content == (whole["content"] or "")
    assert [tuple(v) for v in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]
    ]


def test_streaming_holds_back_a_tail_that_may_become_the_marker():
    result = scan(plan("mistral"), "Sure [TOOL_CA", final=False)
    assert result.content == "Sure " and result.calls == []
    result = scan(plan("llama3_json"), '  {"name": "ad', final=False)
    assert result.content.strip() == "" and result.calls == []


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{% if tools %}<|im_start|>... <tool_call>\n{{ t }}</tool_call>{% endif %}", "hermes"),
        ("{{- '<|python_tag|>' + tool_call.name }}{% if tools %}{% endif %}", "llama3_json"),
        ('Respond in the format {"name": function name, "parameters": dictionary of argument '
         'name and its value}. {{ tools }}', "llama3_json"),
        ("{{ '[AVAILABLE_TOOLS] ' + tools|tojson }}{{ '[TOOL_CALLS] ' }}", "mistral"),
        ("{{ '<|tool_call|>' + message.tool_calls|tojson }}{{ tools }}", "granite"),
        ("{{ '<|tool|>' + message['tools'] + '<|/tool|>' }}", "phi4_mini"),
        ("{{ messages }}", "hermes"),
    ],
)  # fmt: skip
def test_the_format_is_detected_from_the_chat_template(template, name):
    assert detect_format(template).name == name


class _Tok:
    def __init__(self, template: str, added: dict[str, int] | None = None) -> None:
        self.chat_template = template
        self._added = added or {}
        self.seen: list = []

    def get_added_vocab(self):
        return self._added

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        self.seen.append((messages, kwargs))
        return "prompt"


def test_resolve_format_reads_the_flag_then_the_template():
    mistral = _Tok("[TOOL_CALLS] {{ tools }}", {"[TOOL_CALLS]": 5})
    assert resolve_format("auto", mistral, renders_tools=True).name == "mistral"
    assert resolve_format("auto", mistral, renders_tools=False).name == "hermes"  # our prompt
    assert resolve_format("granite", mistral, renders_tools=True).name == "granite"
    with pytest.raises(ValueError, match="tool_call_parser"):
        resolve_format("qwen", mistral, renders_tools=True)
    assert marker_is_special(FORMATS["mistral"], mistral)
    assert not marker_is_special(FORMATS["hermes"], mistral)


def test_the_parser_names_are_the_config_s_and_it_refuses_others():
    assert set(TOOL_CALL_PARSERS) == {"auto", *FORMATS}
    with pytest.raises(ValueError, match="tool_call_parser"):
        EngineConfig(tool_call_parser="qwen")


def test_phi4_mini_tools_go_on_the_system_message():
    tok = _Tok("{{ '<|tool|>' + message['tools'] + '<|/tool|>' }} tools")
    chat_prompt(tok, [{"role": "user", "content": "1+2?"}], plan("phi4_mini"))
    [(messages, kwargs)] = tok.seen
    assert messages[0]["role"] == "system"
    assert json.loads(messages[0]["tools"])[0]["name"] == "add"
    assert kwargs["tools"][0]["function"]["name"] == "add"


def test_the_tool_call_parser_flag_reaches_the_engine_config():
    from sgl_lite.server_args import build_parser, engine_kwargs

    args = build_parser().parse_args(["--tool-call-parser", "mistral"])
    assert engine_kwargs(args)["tool_call_parser"] == "mistral"
    assert "tool_call_parser" not in engine_kwargs(build_parser().parse_args([]))


class _NoToolsTemplate:
    """A chat template that renders no tools: the default prompt carries them."""

    chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"[{m['role']}] {m['content']}\n" for m in messages)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_default_prompt_teaches_and_writes_the_format_the_parser_reads(name):
    fmt = FORMATS[name]
    calls = [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": -4})]
    if not fmt.python:  # a Python call cannot be named note-it
        calls.append(("note-it", {"t": "x]}", "ok": True, "none": None}))
    written = write_calls(fmt, calls)
    got = scan(plan(name), written, final=True)
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == calls
    assert got.content.strip() == ""
    history = [
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls],
        },
    ]
    text = chat_prompt(_NoToolsTemplate(), history, plan(name))
    assert how_to_call(fmt) in text and written in text
    others = {how_to_call(f) for f in FORMATS.values() if f.name != name}
    assert not any(o in text for o in others)  # one format taught, not two
