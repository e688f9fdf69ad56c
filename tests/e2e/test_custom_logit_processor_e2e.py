"""Custom logit processors on the embedded model, served with
`enable_custom_logit_processor=True`: SGLang's own `DisallowedTokensLogitsProcessor` string on
`/generate` bans the token greedy decoding would pick, and an `sgl_lite.CustomLogitProcessor`
sent through the official `openai` client (in `extra_body`, as SGLang's docs show) forces the
chat answer."""

from __future__ import annotations

import httpx
import openai
import torch

import sgl_lite
from tests.support.server import engine_fixture

engine = engine_fixture(enable_custom_logit_processor=True, dtype="float32")


class ForceToken(sgl_lite.CustomLogitProcessor):
    """Every row to its request's custom_params["token_id"]."""

    def __call__(self, logits, custom_param_list=None):
        ids = torch.tensor([p["token_id"] for p in custom_param_list])
        out = torch.full_like(logits, -float("inf"))
        out[torch.arange(len(ids)), ids] = 0.0
        return out


def generate(url: str, **body) -> dict:
    body = {"text": "The capital of France is", "return_logprob": True, **body}
    response = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def ids_of(result: dict) -> list[int]:
    return [entry[1] for entry in result["meta_info"]["output_token_logprobs"]]


def test_sglangs_disallowed_tokens_processor_bans_the_greedy_token(url):
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    greedy = {"max_new_tokens": 3, "temperature": 0}
    plain = ids_of(generate(url, sampling_params=greedy))
    banned = plain[0]
    result = generate(
        url,
        sampling_params={**greedy, "custom_params": {"token_ids": [banned]}},
        custom_logit_processor=DisallowedTokensLogitsProcessor.to_str(),
    )
    assert banned not in ids_of(result) and len(ids_of(result)) == 3


def test_our_processor_forces_the_chat_answer_through_the_openai_client(url, engine):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    token_id = engine.tokenizer.encode("!", add_special_tokens=False)[0]
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=3,
        extra_body={
            "custom_logit_processor": ForceToken.to_str(),
            "custom_params": {"token_id": token_id},
        },
    )
    assert reply.choices[0].message.content == "!!!"
    assert reply.usage.completion_tokens == 3
