"""SGLang 0.5 parity of the backends: `RuntimeEndpoint`'s and `Runtime`'s public methods (over a
fake HTTP layer, and an engine with a fake model), `sgl.flush_cache(empty_cache=...)` and the
refusals (`compile`, profiler, `encode`, KV concatenation, images) that say what to use."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

import sgl_lite as sgl
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from tests.support.fakes import ByteTokenizer, FakeRunner


class FakeResponse:
    def __init__(self, body=None, lines=()) -> None:
        self.status_code, self.headers, self._body, self._lines = 200, {}, body, lines

    def json(self):
        return self._body

    def iter_lines(self, decode_unicode=True):
        return iter(self._lines)


@pytest.fixture
def http(monkeypatch):
    """requests.request replaced: records (method, path, json, kwargs), answers like a server."""
    import requests

    calls = []

    def request(method, url, json=None, stream=False, **kwargs):
        path = url.removeprefix("http://srv:1")
        calls.append((method, path, json, kwargs))
        if path == "/get_model_info":
            return FakeResponse({"model_path": "org/model-x"})
        if path == "/generate" and stream:
            chunks = [{"text": "he"}, {"text": "hello"}]
            return FakeResponse(lines=[f"data: {_dumps(c)}" for c in chunks] + ["data: [DONE]"])
        if path == "/generate":
            return FakeResponse({"text": "hi", "meta_info": {"prompt_tokens": 2}})
        return FakeResponse({"success": True})

    monkeypatch.setattr(requests, "request", request)
    return calls


def _dumps(value) -> str:
    return json.dumps(value)


def test_runtime_endpoint_takes_sglangs_arguments_and_methods(http):
    ep = sgl.RuntimeEndpoint("http://srv:1", "key", False, "chatml")
    assert ep.verify is False and http[0][3]["verify"] is False
    assert ep.get_model_name() == "org/model-x"
    assert ep.get_chat_template() is ep.chat_template and ep.chat_template.name == "chatml"
    assert ep.support_concate_and_append is False
    assert ep.flush_cache(empty_cache=False) is True
    assert http[-1][:3] == ("POST", "/flush_cache", {"empty_cache": False})
    assert sgl.flush_cache(ep) is True and http[-1][2] == {"empty_cache": True}

    class State:
        def text(self):
            return "a prefix"

    ep.commit_lazy_operations(State())
    assert http[-1][1:3] == (
        "/generate",
        {"text": "a prefix", "sampling_params": {"max_new_tokens": 0}},
    )
    assert list(ep.stream_texts("q", {"max_new_tokens": 2})) == ["he", "hello"]


@pytest.mark.parametrize(
    ("call", "instead"),
    [
        (lambda ep: ep.start_profile(), "py-spy"),
        (lambda ep: ep.stop_profile(), "py-spy"),
        (lambda ep: ep.fill_image(None), "text-only"),
        (lambda ep: ep.concatenate_and_append(["a"], "b"), 'join("concate_and_append")'),
        (lambda ep: sgl.Runtime("http://srv:1").encode("x"), "/tokenize"),
        (lambda ep: sgl.Runtime("http://srv:1").get_tokenizer(), "org/model-x"),
        (lambda ep: sgl.function(lambda s: None).compile(), "run_batch"),
    ],
)
def test_refused_backend_methods_say_what_to_use(http, call, instead):
    ep = sgl.RuntimeEndpoint("http://srv:1")
    with pytest.raises(NotImplementedError, match=re.escape(instead)):
        call(ep)


def test_remote_runtime_generate_async_generate_and_url(http):
    rt = sgl.Runtime("http://srv:1", log_level="error", launch_timeout=60)
    assert rt.url == "http://srv:1" and rt.generate_url == "http://srv:1/generate"
    out = json.loads(rt.generate("Hi", {"max_new_tokens": 3}, return_logprob=True))
    assert out == {"text": "hi", "meta_info": {"prompt_tokens": 2}}
    assert http[-1][2]["text"] == "Hi" and http[-1][2]["return_logprob"] is True

    async def consume():
        return [chunk async for chunk in rt.add_request("Hi", {"max_new_tokens": 3})]

    assert asyncio.run(consume()) == ["he", "llo"]


@pytest.fixture(scope="module")
def local():
    config = EngineConfig(device="cpu", max_total_tokens=256)
    engine = Engine(config, runner=FakeRunner(256), tokenizer=ByteTokenizer())
    yield sgl.Runtime(engine=engine)
    engine.shutdown()


def test_local_runtime_generate_is_the_engines_answer_as_json(local):
    out = json.loads(local.generate("abc", {"max_new_tokens": 3, "temperature": 0}))
    direct = local.engine.generate("abc", {"max_new_tokens": 3, "temperature": 0})
    assert out["text"] == direct["text"] and out["meta_info"]["completion_tokens"] == 3
    with pytest.raises(NotImplementedError, match="LoRA"):
        local.generate("abc", lora_path="adapter")


def test_local_runtime_async_generate_streams_the_same_text(local):
    params = {"max_new_tokens": 5, "temperature": 0}

    async def consume():
        return [chunk async for chunk in local.async_generate("abc", params)]

    chunks = asyncio.run(consume())
    assert chunks and all(chunks)
    assert "".join(chunks) == local.engine.generate("abc", params)["text"]
    assert local.get_tokenizer() is local.engine.tokenizer
    assert local.flush_cache(empty_cache=True) is True
    with pytest.raises(NotImplementedError, match="launch_server"):
        _ = local.url
