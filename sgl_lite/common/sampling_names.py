"""The names of SGLang's per-request sampling parameters and logprob options, in one place.

`SAMPLING_PARAM_NAMES` are the keys of a `sampling_params` dict (the fields of the engine's
`SamplingParams`, checked in tests/unit/test_frontend_common.py); `LOGPROB_OPTION_NAMES` travel
beside that dict in a generate request (SGLang's `GenerateReqInput`); `OPENAI_SPELLINGS` are the
few that OpenAI's API (and SGLang's `gen()`) spell differently.
"""

from __future__ import annotations

SAMPLING_PARAM_NAMES: tuple[str, ...] = (
    "max_new_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_regex",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "n",
    "sampling_seed",
    "regex",
    "json_schema",
    "ebnf",
    "logit_bias",
    "custom_params",
)

LOGPROB_OPTION_NAMES: tuple[str, ...] = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)

OPENAI_SPELLINGS: dict[str, str] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
}
