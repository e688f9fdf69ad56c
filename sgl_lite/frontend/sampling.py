"""Parameter layering for gen(): gen() arguments > run() defaults > global defaults.

The result is SGLang's `sampling_params` dict (max_new_tokens, temperature, ...) plus the
logprob options, with the chat template's stop strings added, as SGLang's interpreter does.
It knows the parameter names (`sgl_lite.common`), never the engine that checks their values.
"""

from __future__ import annotations

from typing import Any

from sgl_lite.common.sampling_names import LOGPROB_OPTION_NAMES, OPENAI_SPELLINGS
from sgl_lite.frontend import ir
from sgl_lite.frontend.backends.base import GenRequest
from sgl_lite.frontend.chat_template import ChatTemplate

# SGLang's SglFunction.run() defaults; every run() keyword below can override one. Each key is
# an SGLang sampling param or logprob option under its own name (a test checks it).
GLOBAL_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "min_new_tokens": None,
    "n": 1,
    "stop": (),
    "stop_token_ids": (),
    "stop_regex": (),
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
    "return_text_in_logprobs": None,
}
RUN_ARGS = tuple(GLOBAL_DEFAULTS)
# run() keywords that are not sampling params: options of each request (gen() takes them too)
REQUEST_OPTIONS = ("timeout",)

# gen() spells max_new_tokens and min_new_tokens as OpenAI does (SGLang's frontend).
_GEN_TO_RUN = {
    gen_name: name for name, gen_name in OPENAI_SPELLINGS.items() if gen_name in ir.SAMPLING_FIELDS
}
_DTYPE_STOPS = (" ", "\n")


def alternatives(args: ir.SamplingArgs, defaults: dict[str, Any]) -> int:
    """How many alternatives one gen() samples: its `n`, else the run() default (1)."""
    n = args.n if args.n is not None else defaults.get("n") or 1
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: the number of alternatives must be an int >= 1")
    return n


def run_defaults(overrides: dict[str, Any]) -> dict[str, Any]:
    """The global defaults with the run() keywords that were given (not None) applied."""
    merged = dict(GLOBAL_DEFAULTS)
    merged.update({k: v for k, v in overrides.items() if v is not None})
    if "timeout" in merged:
        merged["timeout"] = check_timeout("run", merged["timeout"])
    return merged


def check_timeout(where: str, value: Any) -> float | None:
    """A step timeout in seconds (None: none); a ValueError naming `where` unless > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}(timeout={value!r}) must be a number of seconds")
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"{where}(timeout={value!r}) must be > 0 seconds")
    return float(value)


def resolve(
    args: ir.SamplingArgs,
    defaults: dict[str, Any],
    template: ChatTemplate,
    timeout: float | None = None,
) -> GenRequest:
    """One gen()'s request: its own arguments over `defaults` (from `run_defaults`); its
    `timeout` over run()'s."""
    params = dict(defaults)
    run_timeout = params.pop("timeout", None)
    given = args.given()
    for key, value in given.items():
        params[_GEN_TO_RUN.get(key, key)] = value
    dtype = params.pop("dtype", None)
    params.pop("n", None)
    stops = params.get("stop") or ()
    stops = [stops] if isinstance(stops, str) else list(stops)
    if dtype is not None:
        params["regex"] = ir.dtype_regex(dtype)
        if dtype is not str:
            stops += [s for s in _DTYPE_STOPS if s not in stops]
    stops += [s for s in template.stop_str if s not in stops]
    params["stop"] = stops
    params["stop_token_ids"] = list(params.get("stop_token_ids") or ())
    stop_regex = params.pop("stop_regex", None) or ()
    if stop_regex:  # NOTE: only when set: backends that have no stop_regex never see the key
        params["stop_regex"] = [stop_regex] if isinstance(stop_regex, str) else list(stop_regex)
    logprob = {k: params.pop(k) for k in LOGPROB_OPTION_NAMES}
    sampling = {k: v for k, v in params.items() if v is not None}
    return GenRequest(
        sampling_params=sampling,
        return_logprob=bool(logprob["return_logprob"]),
        logprob_start_len=-1
        if logprob["logprob_start_len"] is None
        else logprob["logprob_start_len"],
        top_logprobs_num=logprob["top_logprobs_num"] or 0,
        return_text_in_logprobs=bool(logprob["return_text_in_logprobs"]),
        timeout=timeout if timeout is not None else run_timeout,
    )
