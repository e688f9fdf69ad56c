"""SGLang's server-test expectations on the embedded model, through `python -m
sgl_lite.launch_server` as a process started with SGLang's flags (tuning no-ops included).

One server for the module: `--context-length 1000` as in SGLang's request-length test, a few
of SGLang's tuning flags (each logged once as ignored), and SGLang's name of a tool-call format.
"""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.support.processes import launch, running

IGNORED = ("--cuda-graph-max-bs", "--enable-torch-compile", "--disable-overlap-schedule")
FLAGS = ("--max-total-tokens", "2048", "--context-length", "1000", "--kv-cache-dtype", "auto")
FLAGS += ("--cuda-graph-max-bs", "8", "--enable-torch-compile", "--disable-overlap-schedule")
FLAGS += ("--tool-call-parser", "qwen25", "--log-level", "info")


@pytest.fixture(scope="module")
def server():
    with running(*FLAGS) as launched:
        yield launched


@pytest.fixture(scope="module")
def url(server):
    """The launched server's base URL (tests/conftest.py's `client` talks to it)."""
    return server.url


def test_sglang_tuning_flags_are_logged_once_as_ignored_and_the_server_serves(server):
    log = server.log.read_text()
    for flag in IGNORED:
        assert len(re.findall(rf"ignored: {flag} \(", log)) == 1, log
    assert "ignored: --kv-cache-dtype" in log  # 'auto' is accepted, and is a no-op too
    info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
    assert info["max_total_num_tokens"] == info["max_total_tokens"] == 2048
    assert info["tool_call_parser"] == "hermes"  # SGLang's qwen25


def test_models_retrieve_and_its_404(client):
    [listed] = client.models.list().data
    assert client.models.retrieve(listed.id).root == listed.id
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("meta-llama/Llama-3.1-8B-Instruct")
    assert "The model 'meta-llama/Llama-3.1-8B-Instruct' does not exist" in str(err.value)


def test_matched_stop_of_a_stop_regex_is_its_pattern(client):
    ask = {"model": "default", "prompt": "The capital of France is", "temperature": 0}
    free = client.completions.create(**ask, max_tokens=12).choices[0].text
    pattern = rf"{re.escape(free[3:5])}|qqqq"  # an alternation that matches the output
    choice = client.completions.create(
        **ask, max_tokens=12, extra_body={"stop_regex": pattern}
    ).choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["matched_stop"] == pattern
    assert choice.text == free[: re.search(pattern, free).start()]


def test_request_length_errors_are_sglang_s(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hello " * 1200}]
        )
    assert "is longer than the model's context length" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hello "}], max_tokens=1200
        )
    assert "Requested token count exceeds the model's maximum context" in str(err.value)


def test_a_tool_call_parser_sglang_has_and_we_do_not_is_a_start_up_error():
    done = launch("--tool-call-parser", "deepseekv3", timeout=120)
    assert done.returncode == 2
    assert "--tool-call-parser deepseekv3: no such tool-call format here" in done.stderr
    assert "qwen25 (= hermes)" in done.stderr


def test_a_stop_token_id_past_the_vocabulary_never_matches_and_is_accepted(server):
    # SGLang's json_constrained kit sends Llama-3's id 119690 to every model (49152 here)
    body = {
        "text": "Introduce the capital of France. Return in a JSON format.",
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": 8,
            "stop_token_ids": [119690],
            "json_schema": '{"type": "object", "properties": {"name": {"type": "string"}}}',
        },
    }
    reply = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    finish = reply.json()["meta_info"]["finish_reason"]
    assert finish["type"] in ("stop", "length") and finish.get("matched") != 119690, finish
    body["sampling_params"]["stop_token_ids"] = [-1]
    refused = httpx.post(f"{server.url}/generate", json=body, timeout=30)
    assert refused.status_code == 400 and "stop_token_ids" in refused.text
