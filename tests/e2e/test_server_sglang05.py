"""SGLang 0.5's wire protocol on /generate (every GenerateReqInput and SamplingParams field is
honoured, a no-op, or refused by name), /tokenize and /detokenize in SGLang's and vLLM's shape,
and /health_generate."""

from __future__ import annotations

import httpx
import pytest

from sgl_lite.server.compat import (
    GENERATE_NOOPS,
    GENERATE_REFUSED,
    SAMPLING_NOOPS,
    SAMPLING_REFUSED,
)
from tests.support.server import flush


def generate(url: str, **body) -> httpx.Response:
    body.setdefault("text", "The capital of France is")
    return httpx.post(f"{url}/generate", json=body, timeout=60)


GREEDY = {"max_new_tokens": 4, "temperature": 0}


def test_what_sglang_05_clients_always_send_is_accepted(url):
    """RuntimeEndpoint 0.5 sends every key of SglSamplingParams, unset ones as null."""
    params = {
        **GREEDY,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": None,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
    }
    plain = generate(url, sampling_params=GREEDY).json()
    response = generate(url, sampling_params=params)
    assert response.status_code == 200, response.text
    assert response.json()["text"] == plain["text"]


def test_no_op_fields_and_params_are_accepted_and_change_nothing(url):
    plain = generate(url, sampling_params=GREEDY).json()
    response = generate(
        url,
        sampling_params={**GREEDY, "custom_params": {"k": 1}, "stream_interval": 4},
        log_metrics=False,
        custom_labels={"team": "a"},
        session_id="s1",
        routed_dp_rank=0,
        return_logprob=[True],
        return_text_in_logprobs=True,
        return_hidden_states=False,
        image_data=None,
        lora_path=None,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text"] == plain["text"]
    assert len(body["meta_info"]["output_token_logprobs"]) == body["meta_info"]["completion_tokens"]
    assert isinstance(body["meta_info"]["output_token_logprobs"][0][2], str)


REFUSED_GENERATE = [
    ("image_data", "data:image/png;base64,AAAA"),
    ("lora_path", "adapter"),
    ("session_params", {"id": "s"}),
    ("return_hidden_states", True),
    ("input_embeds", [[0.0]]),
    ("priority", 0),
    ("custom_logit_processor", "{}"),
    ("bootstrap_host", "h"),
    ("return_logprob", [True, False]),
    ("not_a_field", 1),
]
REFUSED_SAMPLING = [  # `ebnf` was here; it is served now (tests/e2e/test_ebnf_engine.py)
    ("beam_width", 4),
    ("structural_tag", "{}"),
]


@pytest.mark.parametrize(("name", "value"), REFUSED_GENERATE)
def test_refused_generate_fields_name_themselves_then_the_server_serves(url, name, value):
    response = generate(url, **{name: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and name in error["message"]
    assert generate(url, sampling_params=GREEDY).status_code == 200


@pytest.mark.parametrize(("name", "value"), REFUSED_SAMPLING)
def test_refused_sampling_params_name_themselves(url, engine, name, value):
    from dataclasses import fields

    from sgl_lite.backend.sampling_params import SamplingParams

    # a field the engine learns leaves this list (its own test says what it does)
    assert name not in {f.name for f in fields(SamplingParams)}
    response = generate(url, sampling_params={**GREEDY, name: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == f"sampling_params.{name}"
    batch = generate(url, text=["a", "b"], sampling_params=[GREEDY, {**GREEDY, name: value}])
    assert batch.json()["error"]["param"] == f"sampling_params[1].{name}"
    assert generate(url, sampling_params=GREEDY).status_code == 200


def test_every_sglang_05_field_has_a_policy():
    """The field lists of SGLang 0.5.23's GenerateReqInput and SamplingParams (API part)."""
    generate_fields = {
        "rid", "session_id", "text", "input_ids", "input_embeds", "image_data", "video_data",
        "audio_data", "mm_hashes", "mm_content_hashes", "use_audio_in_video", "video_config",
        "sampling_params", "watermark", "return_logprob", "logprob_start_len",
        "top_logprobs_num", "token_ids_logprob", "return_sampling_mask",
        "sampling_logprobs_mode", "return_text_in_logprobs", "return_flat_raw_top_logprobs",
        "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64", "stream",
        "log_metrics", "return_hidden_states", "return_routed_experts",
        "routed_experts_start_len", "return_indexer_topk", "modalities", "session_params",
        "lora_path", "lora_id", "custom_logit_processor", "positional_embed_overrides",
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
        "decode_tp_size", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank",
        "routing_key", "conversation_id", "http_worker_ipc", "background", "require_reasoning",
        "max_thinking_tokens", "priority", "extra_key", "no_logs", "custom_labels",
        "return_bytes", "return_entropy", "return_prompt_token_ids", "external_trace_header",
        "received_time", "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls",
        "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch",
        "video_max_dynamic_patch", "images_config", "mm_processor_kwargs",
        "multi_item_delimiter_indices", "token_indices_to_pool", "cache_salt", "kv_hints",
    }  # fmt: skip
    from sgl_lite.server.compat import GENERATE_IMPLEMENTED

    covered = GENERATE_IMPLEMENTED | GENERATE_NOOPS | set(GENERATE_REFUSED)
    assert generate_fields <= covered, sorted(generate_fields - covered)
    sampling_fields = {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
        "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
        "min_new_tokens", "n", "beam_width", "json_schema", "regex", "ebnf", "structural_tag",
        "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
        "stream_interval", "logit_bias", "sampling_seed", "custom_params", "watermark",
    }  # fmt: skip
    from dataclasses import fields

    from sgl_lite.backend.sampling_params import SamplingParams

    engine_params = {f.name for f in fields(SamplingParams)} | {"stop_regex"}
    covered = engine_params | SAMPLING_NOOPS | set(SAMPLING_REFUSED)
    assert sampling_fields <= covered, sorted(sampling_fields - covered)


def test_token_ids_logprob_reports_those_ids_at_each_output_token(url):
    response = generate(url, sampling_params=GREEDY, return_logprob=True, token_ids_logprob=[1, 2])
    assert response.status_code == 200, response.text
    meta = response.json()["meta_info"]
    entries = meta["output_token_ids_logprobs"]
    assert len(entries) == meta["completion_tokens"]
    assert all([e[1] for e in entry] == [1, 2] for entry in entries), entries[0]


def test_spaces_between_special_tokens_is_accepted(url):
    response = generate(url, sampling_params={**GREEDY, "spaces_between_special_tokens": False})
    assert response.status_code == 200, response.text


def test_logit_bias_passes_through_generate(url, engine):
    token = engine.tokenizer.encode(" banana", add_special_tokens=False)[0]
    biased = {**GREEDY, "logit_bias": {str(token): 100.0}}
    response = generate(url, sampling_params=biased)
    assert response.status_code == 200, response.text
    assert response.json()["output_ids"] == [token] * GREEDY["max_new_tokens"]
    bad = generate(url, sampling_params={**GREEDY, "logit_bias": {str(token): 101}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias"


def test_tokenize_and_detokenize_round_trip_in_both_shapes(url, engine):
    text = "Hello structured world"
    one = httpx.post(f"{url}/tokenize", json={"prompt": text}, timeout=30).json()
    assert one["tokens"] == engine.tokenizer.encode(text)
    assert one["count"] == len(one["tokens"]) and one["max_model_len"] > 0
    many = httpx.post(
        f"{url}/v1/tokenize",
        json={"prompt": [text, "a"], "add_special_tokens": False, "return_token_strs": True},
        timeout=30,
    ).json()
    assert many["count"] == [len(t) for t in many["tokens"]]
    assert ["".join(s).replace("Ġ", " ") for s in many["token_strs"]] == [text, "a"]
    back = httpx.post(f"{url}/detokenize", json={"tokens": one["tokens"]}, timeout=30).json()
    assert back["text"] == text and back["prompt"] == text  # SGLang's and vLLM's key
    batch = httpx.post(f"{url}/v1/detokenize", json={"tokens": many["tokens"]}, timeout=30).json()
    assert batch["text"] == [text, "a"]


def test_tokenize_messages_counts_the_chat_prompt_tokens(url):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    counted = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=30).json()
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 1},
        timeout=60,
    ).json()
    assert counted["count"] == reply["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, None),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, None),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_bad_tokenizer_requests_are_400s(url, path, body, param):
    response = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    if param is not None:
        assert response.json()["error"]["param"] == param


def test_health_generate_runs_a_generation(url):
    before = flush(url)
    response = httpx.get(f"{url}/health_generate", timeout=60)
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert flush(url)["pool_free_tokens"] == before["pool_free_tokens"]


def test_a_set_stop_regex_reaches_the_engine_and_is_never_dropped(url):
    from dataclasses import fields

    from sgl_lite.backend.sampling_params import SamplingParams

    assert "stop_regex" in {f.name for f in fields(SamplingParams)}
    params = {"max_new_tokens": 16, "temperature": 0, "stop_regex": r"[0-9]"}
    response = generate(url, text="Count with me: 1, 2, 3,", sampling_params=params)
    assert response.status_code == 200, response.text
    reason = response.json()["meta_info"]["finish_reason"]
    assert reason["type"] == "length" or reason.get("matched") == r"[0-9]", reason


def test_a_string_rid_for_a_batch_prefixes_each_prompt(url):
    response = generate(url, text=["a", "b"], rid="job", sampling_params=GREEDY)
    assert response.status_code == 200, response.text
    assert [r["meta_info"]["id"] for r in response.json()] == ["job_0", "job_1"]
