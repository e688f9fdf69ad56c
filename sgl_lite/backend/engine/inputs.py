"""GenerateInput: one generate call as its caller gives it, checked for shape.

Every way into the engine builds one: `Engine.generate` from SGLang's keyword arguments, the
HTTP server's routes from their bodies (`server/bridge.py`), and `Engine.submit` takes nothing
else. Its constructor holds the rules that need neither the tokenizer nor the model: exactly one
of prompt and input_ids, one sampling-params entry, rid and custom logit processor per prompt,
the logprob options' ranges, the timeout; each refusal is an `InvalidRequest` naming the field.
`RequestBuilder.build` (intake.py) then checks what needs the vocabulary and the context (token
ids in range, prompt + max_new_tokens fit) and makes the `Req`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from sgl_lite.backend.engine.admission import check_timeout
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import SamplingParams

# One prompt's sampling params: built, SGLang's JSON dict, or None for the defaults; or a list,
# one per prompt.
ParamsArg: TypeAlias = SamplingParams | dict[str, Any] | None
ParamsList: TypeAlias = list[SamplingParams] | list[dict[str, Any]] | list[ParamsArg]

_PROCESSOR = "custom_logit_processor"


@dataclass(frozen=True, kw_only=True)
class GenerateInput:
    """One generate call under SGLang's names: one prompt or a list of them (as text or as
    token ids), sampling params for all or one per prompt, the logprob options, whether each
    step is streamed, request ids, a deadline in seconds and custom logit processors.

    Read the per-prompt view from the fields set in `__post_init__`: `batched`, `prompts`,
    `params`, `rids` and `processors` (each one entry per prompt).
    """

    prompt: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: ParamsArg | ParamsList = None
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: from the last prompt token (SGLang)
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None  # with return_logprob: these ids' logprobs
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    timeout: float | None = None
    # SGLang's CustomLogitProcessor.to_str(), for all prompts or one per prompt
    custom_logit_processor: str | list[str | None] | None = None

    batched: bool = field(init=False, repr=False, compare=False)  # the caller sent a list
    prompts: tuple[str, ...] | tuple[list[int], ...] = field(init=False, repr=False, compare=False)
    params: tuple[SamplingParams, ...] = field(init=False, repr=False, compare=False)
    rids: tuple[str | None, ...] = field(init=False, repr=False, compare=False)
    processors: tuple[str | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        batched, prompts = _prompts(self.prompt, self.input_ids)
        n = len(prompts)
        given = self.sampling_params
        entries = given if isinstance(given, list) else [given] * n
        if len(entries) != n:
            raise InvalidRequest(
                "sampling_params", f"sampling_params has {len(entries)} entries for {n} prompts"
            )
        derived: dict[str, object] = {
            "batched": batched,
            "prompts": prompts,
            "rids": _rids(self.rid, batched, n),
            "processors": _processors(self.custom_logit_processor, n),
        }
        _check_logprob_options(self)
        check_timeout(self.timeout)
        derived["params"] = tuple(
            p if isinstance(p, SamplingParams) else SamplingParams.from_dict(p) for p in entries
        )
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # NOTE: frozen: set once, here

    @property
    def num_prompts(self) -> int:
        """How many prompts the call carries (each gives `n` results)."""
        return len(self.prompts)

    def as_batch(self, rids: Sequence[str], *, stream: bool) -> GenerateInput:
        """The same call as a list of prompts with ids `rids`: every result then carries its
        output index, whatever the caller sent (the HTTP server submits this form)."""
        prompts = list(self.prompts)
        return replace(
            self,
            prompt=prompts if self.prompt is not None else None,  # type: ignore[arg-type]
            input_ids=prompts if self.input_ids is not None else None,  # type: ignore[arg-type]
            rid=list(rids),
            stream=stream,
        )


def _prompts(prompt: Any, input_ids: Any) -> tuple[bool, tuple[str, ...] | tuple[list[int], ...]]:
    """(whether a list of prompts came, each prompt's text or token ids)."""
    if (prompt is None) == (input_ids is None):
        raise InvalidRequest("prompt", "give exactly one of prompt (text) and input_ids")
    if prompt is not None:
        batched = isinstance(prompt, list)
        texts = prompt if batched else [prompt]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("prompt", "prompt must be a non-empty string or a list of them")
        if any(not t for t in texts):
            raise InvalidRequest("prompt", "prompt must not be empty")
        return batched, tuple(texts)
    if not isinstance(input_ids, list) or not input_ids:
        raise InvalidRequest(
            "input_ids", "input_ids must be a non-empty list of token ids (or of lists)"
        )
    batched = isinstance(input_ids[0], list)
    lists = input_ids if batched else [input_ids]
    for ids in lists:
        if not isinstance(ids, list) or not ids:
            raise InvalidRequest("input_ids", "input_ids must not contain an empty list")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
        if bad:
            raise InvalidRequest("input_ids", f"input_ids contains {bad[0]!r}, not a token id")
    return batched, tuple(lists)


def _check_logprob_options(inp: GenerateInput) -> None:
    top, start = inp.top_logprobs_num, inp.logprob_start_len
    if not isinstance(top, int) or top < 0:
        raise InvalidRequest(
            "top_logprobs_num", f"top_logprobs_num must be an int >= 0, got {top!r}"
        )
    if not isinstance(start, int) or start < -1:
        raise InvalidRequest(
            "logprob_start_len", f"logprob_start_len must be -1 or >= 0, got {start!r}"
        )
    ids = inp.token_ids_logprob
    if not inp.return_logprob or ids is None or ids == []:
        return  # NOTE: read (and so checked) only with return_logprob, as before
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise InvalidRequest(
            "token_ids_logprob", f"token_ids_logprob must be a list of ints, got {ids!r}"
        )


def _rids(rid: Any, batched: bool, n: int) -> tuple[str | None, ...]:
    """Each prompt's rid (None: the engine makes one): a string for one prompt, a list (one
    per prompt) for a list."""
    if rid is None:
        return (None,) * n
    if isinstance(rid, list) != batched:
        raise InvalidRequest("rid", "rid must be a string for one prompt and a list for a list")
    rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != n:
        raise InvalidRequest("rid", f"rid has {len(rids)} entries for {n} prompts")
    return tuple(rids)


def _processors(wire: Any, n: int) -> tuple[str | None, ...]:
    """Each prompt's custom logit processor string (SGLang's: one for all, or one per prompt);
    loading them, and refusing them when the engine does not allow them, is the builder's."""
    if wire is None or wire == []:
        return (None,) * n
    wires = wire if isinstance(wire, list) else [wire] * n
    if len(wires) != n:
        raise InvalidRequest(_PROCESSOR, f"{_PROCESSOR} has {len(wires)} entries for {n} prompts")
    if any(w is not None and not isinstance(w, str) for w in wires):
        raise InvalidRequest(
            _PROCESSOR, f"{_PROCESSOR} must be a string (or a list, one per prompt)"
        )
    return tuple(wires)
