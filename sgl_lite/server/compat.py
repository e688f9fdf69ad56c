"""Every field of the foreign request bodies we serve: honoured, accepted as a no-op, or refused.

A field a client sets is never dropped silently. Each one of SGLang 0.5's `GenerateReqInput`
and `SamplingParams` and of OpenAI's chat-completions and completions bodies (with vLLM's guided
decoding fields) is in one of three groups:

- implemented: passed on (the pydantic models in `protocol.py` and the engine check the values);
- no-ops: labels, telemetry and routing hints that cannot change the output of one in-process
  engine (`log_metrics`, `user`, `routed_dp_rank`, ...), removed here;
- refused: a 400 naming the field when it is set to anything but its default, with the reason.

A field in no group at all is refused as unknown. These checks run on the raw JSON body, before
pydantic, so the client's own spelling is what the error names.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sgl_lite.backend.engine import GenerateInput
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.server.protocol import ApiError

_MULTIMODAL = "this server runs a text-only model"
_DISAGG = "this server is one in-process engine (no disaggregation, no data parallelism)"

# --- SGLang 0.5 GenerateReqInput ----------------------------------------------------------------
# GenerateInput's fields under SGLang's names where ours differ
_GENERATE_WIRE_NAMES = {"prompt": "text"}
# what the engine's generate call takes is what /generate passes on (protocol.GenerateRequest
# reads each of them: tests/unit/test_server_compat.py); "timeout" is sgl_lite's deadline in
# seconds, custom_logit_processor needs --enable-custom-logit-processor (the engine checks)
GENERATE_IMPLEMENTED = frozenset(
    _GENERATE_WIRE_NAMES.get(f.name, f.name) for f in fields(GenerateInput) if f.init
)
GENERATE_NOOPS = frozenset(
    {
        "session_id",  # an identity only; SGLang documents it does not alter the prompt
        "log_metrics",
        "custom_labels",
        "conversation_id",
        "routing_key",
        "routed_dp_rank",
        "data_parallel_rank",
        "disagg_prefill_dp_rank",
        "http_worker_ipc",
        "external_trace_header",
        "received_time",
        "no_logs",
        "model",  # sglang-router names the model it routed the request by
    }
)
# field -> (the values that mean "off", why anything else is refused)
GENERATE_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    **{
        name: ((None,), _MULTIMODAL)
        for name in (
            "input_embeds",
            "image_data",
            "video_data",
            "audio_data",
            "mm_hashes",
            "mm_content_hashes",
            "video_config",
            "modalities",
            "max_dynamic_patch",
            "min_dynamic_patch",
            "image_max_dynamic_patch",
            "video_max_dynamic_patch",
            "images_config",
            "mm_processor_kwargs",
            "need_wait_for_mm_inputs",
            "num_items_assigned",
            "encoder_urls",
            "positional_embed_overrides",
        )
    },
    "use_audio_in_video": ((False, None), _MULTIMODAL),
    **{
        name: ((None,), _DISAGG)
        for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key")
    },
    "decode_tp_size": ((None,), _DISAGG),
    "kv_hints": ((None,), "there is no hierarchical cache storage backend"),
    "watermark": ((None,), "watermarking is not implemented"),
    "return_sampling_mask": ((None, False), "sampling masks are not returned"),
    "sampling_logprobs_mode": ((None,), "sampling masks are not returned"),
    "return_flat_raw_top_logprobs": ((False, None), "top logprobs come as nested lists only"),
    "return_flat_raw_output_top_logprobs": (
        (False, None),
        "top logprobs come as nested lists only",
    ),
    "return_flat_raw_top_logprobs_b64": ((False, None), "top logprobs come as nested lists only"),
    "return_hidden_states": ((False, None), "hidden states are not returned"),
    "return_routed_experts": ((False, None), "the model has no experts"),
    "routed_experts_start_len": ((0, None), "the model has no experts"),
    "return_indexer_topk": ((False, None), "the model has no sparse-attention indexer"),
    "session_params": ((None,), "sessions (continual prompting) are not implemented"),
    "lora_path": ((None,), "LoRA adapters are not supported"),
    "lora_id": ((None,), "LoRA adapters are not supported"),
    "background": ((False, None), "background responses are not implemented"),
    "require_reasoning": ((False, None), "the model is not a reasoning model"),
    "max_thinking_tokens": ((None,), "the model is not a reasoning model"),
    "priority": ((None,), "the scheduler has no request priorities"),
    "extra_key": ((None,), "extra prefix-cache keys are not implemented"),
    "cache_salt": ((None,), "prefix-cache namespaces are not implemented"),
    "return_bytes": ((False, None), "the model generates text, not images"),
    "return_entropy": ((False, None), "entropy is not returned"),
    "return_prompt_token_ids": ((False, None), "prompt token ids are not returned; see /tokenize"),
    "multi_item_delimiter_indices": ((None,), "multi-item scoring is not implemented"),
    "token_indices_to_pool": ((None,), "pooling readouts are not implemented"),
}
# SGLang accepts a list for these (one per prompt); one value for all prompts is what we run
_PER_PROMPT = ("return_logprob", "logprob_start_len", "top_logprobs_num")

# --- SGLang 0.5 SamplingParams ------------------------------------------------------------------
# every SamplingParams field is implemented (the engine checks the values); the names below are
# SGLang's that it lacks (tests/unit/test_server_compat.py keeps the groups apart)
SAMPLING_IMPLEMENTED = frozenset(f.name for f in fields(SamplingParams) if f.init)
SAMPLING_NOOPS = frozenset(
    {
        "stream_interval",  # chunk cadence only: every token is streamed
    }
)
SAMPLING_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "beam_width": ((None, 1), "beam search is not implemented"),
    "structural_tag": ((None,), "structural tags are not supported; use regex or json_schema"),
    "watermark": ((None,), "watermarking is not implemented"),
}


def generate_body(data: dict[str, Any]) -> dict[str, Any]:
    """A `/generate` body with its no-ops removed; a 400 for a refused or unknown field."""
    known = GENERATE_IMPLEMENTED | GENERATE_NOOPS | set(GENERATE_REFUSED)
    _refuse(data, GENERATE_REFUSED, known, "")
    body = {k: v for k, v in data.items() if k in GENERATE_IMPLEMENTED}
    batch = body.get("text", body.get("input_ids"))
    is_batch = isinstance(batch, list) and bool(batch) and isinstance(batch[0], (str, list))
    if is_batch and isinstance(body.get("rid"), str):  # SGLang 0.5: a prefix for each prompt
        body["rid"] = [f"{body['rid']}_{i}" for i in range(len(batch or ()))]
    for name in _PER_PROMPT:
        value = body.get(name)
        if isinstance(value, list):
            if value and any(v != value[0] for v in value):
                raise ApiError(
                    400, f"{name}: different values per prompt are not supported", param=name
                )
            body[name] = value[0] if value else None
        if body.get(name) is None:
            body.pop(name, None)
    params = body.get("sampling_params")
    if isinstance(params, list):
        body["sampling_params"] = [
            sampling_params(p, f"sampling_params[{i}]") for i, p in enumerate(params)
        ]
    elif isinstance(params, dict):
        body["sampling_params"] = sampling_params(params, "sampling_params")
    return body


def sglang05_meta(result: dict[str, Any]) -> dict[str, Any]:
    """Adds the meta keys SGLang 0.5 returns beside 0.4's: `output_token_logprobs_length`,
    the number of output logprob entries so far (a stream sends only the new entries)."""
    meta = result["meta_info"]
    if "output_token_logprobs" in meta:
        meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return result


def sampling_params(params: Any, where: str) -> Any:
    """SGLang sampling params with the no-ops removed; a 400 for a refused one.

    Unknown names are left for the engine, whose error lists the names it knows.
    """
    if not isinstance(params, dict):
        return params
    for name, (defaults, why) in SAMPLING_REFUSED.items():
        if name in params and not _is_default(params[name], defaults):
            raise ApiError(400, f"{where}.{name} is not supported: {why}", param=f"{where}.{name}")
    out = {k: v for k, v in params.items() if k not in SAMPLING_NOOPS and k not in SAMPLING_REFUSED}
    if out.get("stop_regex") in (None, [], ""):  # SGLang's clients always send the key
        out.pop("stop_regex", None)
    return out


# --- vLLM's legacy guided decoding (both OpenAI routes) ------------------------------------------
# guided_json, guided_regex, guided_choice and guided_grammar are implemented (openai/guided.py).
# Which grammar library builds a constraint does not change what it allows: the server's
# --grammar-backend builds it whatever backend a request names.
GUIDED_NOOPS = frozenset({"guided_decoding_backend"})
GUIDED_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "guided_whitespace_pattern": (
        (None,),
        "JSON whitespace is set for every request by the server's "
        "--constrained-json-whitespace-pattern, not per request",
    ),
}

# --- OpenAI chat completions ----------------------------------------------------------------------
CHAT_NOOPS = (
    frozenset(
        {"user", "metadata", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"}
    )
    # SGLang's reasoning switches (sglang-router sends them on every request): a no-op, as in
    # SGLang, while no reasoning parser is configured
    | {"separate_reasoning", "stream_reasoning"}
    | GUIDED_NOOPS
)
CHAT_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": ((None, []), "the legacy functions API is not implemented; use tools"),
    "function_call": ((None,), "the legacy functions API is not implemented; use tool_choice"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "prediction": ((None,), "predicted outputs are not implemented"),
    "reasoning_effort": ((None,), "the model is not a reasoning model"),
    "verbosity": ((None,), "verbosity control is not implemented"),
    "web_search_options": ((None,), "web search is not available"),
    "store": ((None, False), "completions are not stored"),
    "service_tier": ((None, "auto", "default"), "there are no service tiers"),
    # SGLang / vLLM extensions that sglang-router sends with their defaults
    "return_hidden_states": ((None, False), "hidden states are not returned"),
    **GUIDED_REFUSED,
}
COMPLETION_NOOPS = frozenset({"user"}) | GUIDED_NOOPS
COMPLETION_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "best_of is not implemented; use n and rank the samples"),
    **GUIDED_REFUSED,
}
MESSAGE_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "audio": ((None,), "audio is not supported"),
    "function_call": ((None,), "the legacy functions API is not implemented; use tool_calls"),
    "refusal": ((None, ""), "refusals are not a message input"),
}


def chat_body(data: dict[str, Any], implemented: set[str]) -> dict[str, Any]:
    """A chat-completions body with its no-ops removed; a 400 for a refused or unknown field
    (`implemented`: the fields the request model reads)."""
    _refuse(data, CHAT_REFUSED, implemented | CHAT_NOOPS | set(CHAT_REFUSED), "")
    body = {k: v for k, v in data.items() if k in implemented}
    messages = body.get("messages")
    if isinstance(messages, list):
        allowed = {"role", "content", "name", "tool_calls", "tool_call_id"}
        for i, m in enumerate(messages):
            if isinstance(m, dict):
                _refuse(m, MESSAGE_REFUSED, allowed | set(MESSAGE_REFUSED), f"messages[{i}].")
        body["messages"] = [
            {k: v for k, v in m.items() if k in allowed} if isinstance(m, dict) else m
            for m in messages
        ]
    return body


def completion_body(data: dict[str, Any], implemented: set[str]) -> dict[str, Any]:
    """A completions body with its no-ops removed; a 400 for a refused or unknown field."""
    known = implemented | COMPLETION_NOOPS | set(COMPLETION_REFUSED)
    _refuse(data, COMPLETION_REFUSED, known, "")
    return {k: v for k, v in data.items() if k in implemented}


def refuse_unknown(data: dict[str, Any], known: set[str] | frozenset[str]) -> None:
    """A 400 naming the first field of `data` outside `known` (bodies whose fields are all
    implemented, with no no-ops or refusals of their own: /v1/rerank)."""
    _refuse(data, {}, known, "")


def _refuse(
    data: dict[str, Any],
    refused: dict[str, tuple[tuple[Any, ...], str]],
    known: set[str] | frozenset[str],
    prefix: str,
) -> None:
    for name, value in data.items():
        if name in refused:
            defaults, why = refused[name]
            if not _is_default(value, defaults):
                raise ApiError(
                    400, f"{prefix}{name} is not supported: {why}", param=f"{prefix}{name}"
                )
        elif name not in known:
            raise ApiError(
                400,
                f"unknown field {prefix}{name}; this server does not silently ignore fields",
                param=f"{prefix}{name}",
            )


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    # NOTE: `False == 0` in Python; compare types too so `priority: 0` is not "off"
    return any(value == d and type(value) is type(d) for d in defaults)
