"""What SGLang's own server tests (`test/srt/openai_server/...`) pin, without a model: the real
Engine and HTTP server over the fake runner and byte tokenizer of `tests/support/fakes.py`.

`GET /v1/models/{id}` (the openai client's `models.retrieve`), `matched_stop` of a stop regex
being its pattern, `max_total_num_tokens` in /get_server_info, SGLang's `--tool-call-parser`
names (and the pythonic format), SGLang's tuning flags accepted as logged no-ops, and the first
clause of the context-length and tool errors in SGLang's wording.
"""

from __future__ import annotations

import json
import logging
import os
import re

import httpx
import openai
import pytest

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.server import create_app
from sgl_lite.server.openai.tool_formats import FORMATS, detect_format, parser_for_flag
from sgl_lite.server.openai.tool_parser import ToolDeltas, message, scan
from sgl_lite.server.openai.tools import plan_tools
from sgl_lite.server_args import build_parser, check_args, engine_kwargs, log_ignored_flags
from sgl_lite.sglang_flags import IGNORED_FLAGS, ignored_flags
from tests.support.fakes import ByteTokenizer, FakeRunner
from tests.support.server import sse_events

SERVED = "org/fake-model"  # a hub-style id: the model route must take the slash
CONTEXT = 64
POOL = 512
GREEDY = {"temperature": 0}


class ChatByteTokenizer(ByteTokenizer):
    """The byte tokenizer with a plain chat template (one `role: content` line per message)."""

    chat_template = None  # renders no tools: the server's default tool prompt is used

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")


@pytest.fixture(scope="module")
def engine():
    eng = Engine(
        runner=FakeRunner(num_slots=POOL, context_length=CONTEXT),
        tokenizer=ChatByteTokenizer(),
        device="cpu",
        max_total_tokens=POOL,
        served_model_name=SERVED,
    )
    yield eng
    eng.shutdown()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


# --- 1. GET /v1/models/{model_id} --------------------------------------------------------------
def test_models_retrieve_answers_the_listed_card(client):
    [listed] = client.models.list().data
    card = client.models.retrieve(SERVED)
    assert card.id == SERVED and card.object == "model" and card.root == SERVED
    drop = {"created"}  # the time of each answer
    assert card.model_dump(exclude=drop) == listed.model_dump(exclude=drop)
    assert isinstance(card.created, int) and card.model_dump()["max_model_len"] == CONTEXT
    assert client.models.retrieve("default").id == SERVED  # a name requests may use too


def test_models_retrieve_of_an_unknown_id_is_openai_s_404(client, url):
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["message"].startswith("The model 'no-such-model' does not exist")
    raw = httpx.get(f"{url}/v1/models/a/b", timeout=10)
    assert raw.status_code == 404
    assert raw.json() == {
        "error": {
            "message": f"The model 'a/b' does not exist; this server serves '{SERVED}'",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_the_model_route_is_in_the_openapi_contract(engine):
    spec = create_app(engine).openapi()
    op = spec["paths"]["/v1/models/{model_id}"]["get"]
    card = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert card["title"] == "ModelCard"
    assert {"id", "object", "created", "owned_by"} <= set(card["required"])
    assert {"root", "max_model_len"} <= set(card["properties"])
    assert "404" in op["responses"]


# --- 2. matched_stop of a stop regex is its pattern ---------------------------------------------
def test_a_stop_regex_reports_its_pattern_on_every_endpoint(url):
    body = {"text": "Once", "sampling_params": {**GREEDY, "max_new_tokens": 24}}
    free = post(url, "/generate", body).json()["text"]
    pattern = rf"{re.escape(free[6:8])}|zq{{9}}"  # an alternation, as SGLang's "and|or"
    cut = re.search(pattern, free)
    assert cut is not None
    body["sampling_params"] |= {"stop_regex": [r"\d{5}", pattern]}
    out = post(url, "/generate", body).json()
    assert out["text"] == free[: cut.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}

    completion = {"prompt": "Once", "max_tokens": 24, **GREEDY, "stop_regex": pattern}
    [choice] = post(url, "/v1/completions", completion).json()["choices"]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", pattern)
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**completion, "stream": True}, timeout=60
    ) as response:
        events = [e for e in sse_events(response.iter_lines()) if e != "[DONE]"]
    assert events[-1]["choices"][0]["matched_stop"] == pattern


def test_chat_reports_the_stop_regex_pattern_and_a_stop_string_itself(url):
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24, **GREEDY}
    free = post(url, "/v1/chat/completions", chat).json()["choices"][0]["message"]["content"]
    pattern = f"{free[5]}[a-z]"
    [choice] = post(url, "/v1/chat/completions", {**chat, "stop_regex": pattern}).json()["choices"]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", pattern)
    assert choice["message"]["content"] == free[: re.search(pattern, free).start()]
    stop = free[4:6]
    [choice] = post(url, "/v1/chat/completions", {**chat, "stop": [stop]}).json()["choices"]
    assert choice["matched_stop"] == stop


# --- 3. max_total_num_tokens ---------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/get_server_info", "/server_info"])
def test_server_info_carries_sglang_s_max_total_num_tokens(url, path):
    info = httpx.get(f"{url}{path}", timeout=10).json()
    assert info["max_total_num_tokens"] == POOL
    assert info["max_total_tokens"] == info["max_total_num_tokens"]  # the alias, for now
    assert info["pool_free_tokens"] + info["pool_used_tokens"] == POOL
    # SGLang's per-scheduler states: sglang.bench_serving reads the first one's accept length
    [state] = info["internal_states"]
    assert state["avg_spec_accept_length"] is None
    assert state["num_running_reqs"] == info["num_running_reqs"]


# --- 4. --tool-call-parser: SGLang's names, and the pythonic format ------------------------------
def parse(*argv: str):
    parser = build_parser()
    args = parser.parse_args(list(argv))
    check_args(parser, args)
    return args


@pytest.mark.parametrize(
    ("sglang", "ours"),
    [("llama3", "llama3_json"), ("qwen25", "hermes"), ("qwen", "hermes"), ("hermes", "hermes"),
     ("mistral", "mistral"), ("pythonic", "pythonic")],
)  # fmt: skip
def test_sglang_s_tool_call_parser_names_become_our_formats(sglang, ours):
    args = parse("--tool-call-parser", sglang)
    assert engine_kwargs(args)["tool_call_parser"] == ours
    assert EngineConfig(tool_call_parser=ours, device="cpu").tool_call_parser in FORMATS


@pytest.mark.parametrize("name", ["deepseekv3", "kimi_k2", "gpt-oss", "qwen3_coder", "nope"])
def test_a_tool_call_parser_with_no_equivalent_is_a_start_up_error_naming_the_accepted(
    name, capsys
):
    with pytest.raises(SystemExit) as exc:
        parse("--tool-call-parser", name)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--tool-call-parser {name}: no such tool-call format here" in err
    for accepted in ("hermes", "llama3_json", "pythonic", "llama3 (= llama3_json)", "qwen25"):
        assert accepted in err
    with pytest.raises(ValueError, match="accepted: auto, hermes"):
        parser_for_flag(name)


TOGGLE = {
    "type": "function",
    "function": {
        "name": "set_light",
        "parameters": {
            "type": "object",
            "properties": {"on": {"type": "boolean"}, "room": {"type": "string"},
                           "levels": {"type": "array", "items": {"type": "integer"}}},
            "required": ["on"],
        },
    },
}  # fmt: skip
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def pythonic(parallel: bool = True):
    return plan_tools([TOGGLE, WEATHER], "auto", parallel, FORMATS["pythonic"])


def test_pythonic_calls_are_read_with_their_literal_arguments():
    text = 'Doing it. [set_light(on=True, room="hall", levels=(1, 2)), get_weather(city="Oslo")]'
    result = scan(pythonic(), text, final=True)
    assert result.content == "Doing it. "
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        ("set_light", {"on": True, "room": "hall", "levels": [1, 2]}),
        ("get_weather", {"city": "Oslo"}),
    ]
    [only] = scan(pythonic(parallel=False), text, final=True).calls
    assert only.name == "set_light"
    # JSON's literals, as models often write them, and a "]" inside a string
    [call] = scan(pythonic(), '[set_light(on=true, room="a]b")]', final=True).calls
    assert json.loads(call.arguments) == {"on": True, "room": "a]b"}


@pytest.mark.parametrize(
    "text",
    [
        '[set_light(on=__import__("os").system("x"))]',  # not a literal: never evaluated
        "[set_light(on=1 + 1)]",  # an expression
        "[set_light(True)]",  # a positional argument
        "[set_light(**{'on': True})]",
        "[set_light(on='yes')]",  # against the parameters schema
        "[turn_off(on=True)]",  # not a tool
        "[1, 2, 3] are the levels",  # a plain list
        "[set_light(on=True)",  # never closed
    ],
)
def test_a_pythonic_block_of_anything_but_valid_calls_stays_text(text):
    result = scan(pythonic(), text, final=True)
    assert result.calls == [] and result.content == text


def test_pythonic_streaming_holds_back_only_what_may_open_a_call():
    assert scan(pythonic(), "Levels [1, 2] and", final=False).content == "Levels [1, 2] and"
    assert scan(pythonic(), "Sure. [set_li", final=False).content == "Sure. "
    assert scan(pythonic(), "Sure. [set_light(on=Tr", final=False).content == "Sure. "
    text = 'Sure. [get_weather(city="Rome")] Done.'
    deltas, content, calls = ToolDeltas(), "", []
    for cut in range(1, len(text) + 1):
        final = cut == len(text)
        delta = deltas.delta(scan(pythonic(), text[:cut], final), final)
        content += delta.get("content", "")
        calls += [d["function"] for d in delta.get("tool_calls", [])]
    whole = message(scan(pythonic(), text, True))
    assert content == whole["content"] == "Sure.  Done."
    assert calls == [whole["tool_calls"][0]["function"]]


def test_a_pythonic_chat_template_is_detected():
    template = (
        "If you decide to invoke any of the function(s), you MUST put it in the format of "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
        "func_name2(params)] {{ tools }}"
    )
    assert detect_format(template).name == "pythonic"


# --- 5. SGLang's tuning flags: accepted, logged once, listed apart in --help --------------------
def _argv_of_every_ignored_flag() -> list[str]:
    argv: list[str] = []
    for flag in IGNORED_FLAGS:
        argv.append(flag.flag)
        if flag.takes_value:
            argv += flag.only[:1] or (["1", "2", "4"] if flag.many else ["8"])
    return argv


def test_every_ignored_sglang_flag_parses_and_is_logged_once(caplog):
    args = parse(*_argv_of_every_ignored_flag())
    assert ignored_flags(args) == list(IGNORED_FLAGS)
    with caplog.at_level(logging.WARNING, logger="sgl_lite.server"):
        log_ignored_flags(args)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(IGNORED_FLAGS)
    for flag in IGNORED_FLAGS:
        assert lines.count(f"ignored: {flag.flag} ({flag.why})") == 1
    assert "ignored: --cuda-graph-max-bs (CUDA graphs are captured at fixed batch" in lines[0]
    assert ignored_flags(parse()) == []  # none given, none logged


def test_the_ignored_flags_are_their_own_group_in_help(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    group = help_text[help_text.index("SGLang flags accepted and ignored:") :]
    for flag in IGNORED_FLAGS:
        assert f"  {flag.flag}" in group
    assert "--disable-radix-cache" not in group and "--max-total-tokens" not in group


def test_an_ignored_flag_with_a_value_that_would_matter_is_refused(capsys):
    assert ignored_flags(parse("--kv-cache-dtype", "auto"))[0].flag == "--kv-cache-dtype"
    with pytest.raises(SystemExit) as exc:
        parse("--kv-cache-dtype", "fp8_e5m2")
    assert exc.value.code == 2
    assert "--kv-cache-dtype fp8_e5m2: the KV cache is kept in" in capsys.readouterr().err


def test_flags_we_implement_keep_their_meaning(capsys):
    args = parse("--disable-radix-cache", "--schedule-policy", "fcfs", "--tp-size", "1")
    assert engine_kwargs(args)["disable_radix_cache"] is True
    assert engine_kwargs(args)["schedule_policy"] == "fcfs" and ignored_flags(args) == []
    for argv, needle in (
        (["--tp-size", "2"], "tensor parallelism is not supported"),
        (["--enable-lora"], "--enable-lora is not a flag sgl_lite supports"),
        (["--schedule-policy", "random"], "invalid choice: 'random'"),
    ):
        with pytest.raises(SystemExit):
            parse(*argv)
        assert needle in capsys.readouterr().err


def test_disable_cuda_graph_reaches_the_model_runner_and_no_op_flags_are_logged(
    monkeypatch, caplog
):
    from sgl_lite import launch_server
    from sgl_lite.backend import engine as engine_module
    from sgl_lite.backend.runner.decode_graphs import DISABLE_ENV

    def no_engine(**kwargs):
        raise ValueError("no model in this test")  # main answers a ValueError with exit 2

    monkeypatch.delenv(DISABLE_ENV, raising=False)
    monkeypatch.setattr(engine_module, "Engine", no_engine)
    with caplog.at_level(logging.WARNING, logger="sgl_lite.server"), pytest.raises(SystemExit):
        launch_server.main(["--disable-cuda-graph", "--cuda-graph-max-bs", "16"])
    assert os.environ[DISABLE_ENV] == "1"
    assert [r.getMessage() for r in caplog.records if "ignored:" in r.getMessage()] == [
        f"ignored: --cuda-graph-max-bs ({IGNORED_FLAGS[0].why})"
    ]


# --- 6. error texts open with SGLang's wording ---------------------------------------------------
def test_a_prompt_past_the_context_is_sglang_s_input_error(client, url):
    long = "x" * (CONTEXT + 10)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": long}])
    assert "is longer than the model's context length" in str(err.value)
    assert err.value.body["param"] == "messages" and err.value.body["type"] == "BadRequestError"
    response = post(url, "/generate", {"text": long})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        f"The input ({len(long)} tokens) is longer than the model's context length "
        f"({CONTEXT} tokens)"
    )
    assert response.json()["error"]["param"] == "text"


def test_prompt_plus_max_tokens_past_the_context_is_sglang_s_total_error(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SERVED, prompt="Hi", max_tokens=CONTEXT)
    assert "Requested token count exceeds the model's maximum context" in str(err.value)
    assert err.value.body["param"] == "max_tokens"
    assert f"2 tokens + max_new_tokens {CONTEXT} = {CONTEXT + 2}" in err.value.body["message"]


def test_tool_errors_open_with_sglang_s_wording(client):
    ask = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=SERVED,
            messages=ask,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    assert "Tool 'get_time' not found in tools list" in str(err.value)
    assert err.value.body["param"] == "tool_choice"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SERVED, messages=ask, tools=[WEATHER, bad])
    assert "Tool 1 function has invalid 'parameters' schema" in str(err.value)
    assert err.value.body["param"] == "tools[1].function.parameters"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SERVED, messages=ask, tool_choice="required")
    assert "Tools cannot be empty if tool choice is set to" in str(err.value)
