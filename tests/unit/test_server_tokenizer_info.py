"""`GET /tokenizer_info` in vLLM's shape, and the remote-tokenizer protocol of EleutherAI's
lm-evaluation-harness (`lm_eval.utils.RemoteTokenizer`, `tokenizer_backend=remote`) end to end
against the server: the requests it sends and the keys it reads, on a transformers tokenizer
built in the test (a scripted engine: no model)."""

from __future__ import annotations

import httpx
from jinja2 import BaseLoader, Environment, StrictUndefined

from tests.support.tiny import TINY_CHAT_TEMPLATE


def test_tokenizer_info_answers_the_special_tokens_and_the_chat_template(url, engine):
    for path in ("/tokenizer_info", "/v1/tokenizer_info"):
        response = httpx.get(f"{url}{path}", timeout=30)
        assert response.status_code == 200, response.text
        info = response.json()
        assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|im_start|>"
        assert info["pad_token"] is None and "unk_token" in info
        assert info["chat_template"] == TINY_CHAT_TEMPLATE
        assert info["tokenizer_class"] == type(engine.tokenizer).__name__
        assert info["max_model_len"] == engine.context_length
        assert not [k for k in info if k.endswith("_file")]  # no server file paths


def test_tokenizer_info_serves_the_template_chat_requests_use(url, engine):
    """The chat template is the tokenizer's as the server holds it (--chat-template replaces
    it there), not the one saved with the model."""
    original = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = "{{ messages[0]['content'] }}"
    try:
        info = httpx.get(f"{url}/tokenizer_info", timeout=30).json()
    finally:
        engine.tokenizer.chat_template = original
    assert info["chat_template"] == "{{ messages[0]['content'] }}"


class RemoteTokenizerProtocol:
    """What lm-evaluation-harness's RemoteTokenizer (lm_eval/utils.py, 0.4.x) sends and reads,
    request for request: GET /tokenizer_info (its support check needs `eos_token`), POST
    /tokenize `{"prompt", "add_special_tokens": false}` -> `tokens`, POST /detokenize
    `{"tokens"}` -> `prompt`, and the chat template rendered client-side with jinja2."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.replace("/v1/completions", "").rstrip("/")
        self.info = httpx.get(f"{self.base}/tokenizer_info", timeout=30).raise_for_status().json()
        assert isinstance(self.info, dict) and "eos_token" in self.info

    def encode(self, text: str) -> list[int]:
        payload = {"prompt": text, "add_special_tokens": False}
        tokens = httpx.post(f"{self.base}/tokenize", json=payload, timeout=30).json()["tokens"]
        assert isinstance(tokens, list)
        return tokens

    def decode(self, tokens: list[int]) -> str:
        prompt = httpx.post(f"{self.base}/detokenize", json={"tokens": tokens}, timeout=30)
        text = prompt.raise_for_status().json()["prompt"]
        assert isinstance(text, str)
        return text

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool) -> str:
        env = Environment(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)
        template = env.from_string(self.info["chat_template"])
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


def test_lm_eval_remote_tokenizer_works_against_the_server(url, engine):
    tokenizer = engine.tokenizer
    remote = RemoteTokenizerProtocol(f"{url}/v1/completions")
    # eos_token_id and bos_token_id are encode(token)[0]: the special token's own id
    assert remote.encode(remote.info["eos_token"])[0] == tokenizer.eos_token_id
    assert remote.encode(remote.info["bos_token"])[0] == tokenizer.bos_token_id
    text = "The capital of France is Paris."
    ids = remote.encode(text)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert remote.decode(ids) == text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = remote.apply_chat_template(messages, add_generation_prompt=True)
    assert rendered == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    # and the server counts that prompt as its own chat route would
    counted = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=30).json()
    assert counted["tokens"] == remote.encode(rendered)
