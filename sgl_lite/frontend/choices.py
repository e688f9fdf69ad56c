"""Select scoring: which tokens belong to a choice, and how their logprobs pick a winner.

Pure functions over token ids and logprob lists; no backend, no model. The three methods
follow SGLang's `sglang.lang.choices` (same names, same decisions).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from sgl_lite.common.sequences import common_prefix_len
from sgl_lite.common.tokenizer import Tokenizer


class ChoicesDecision(NamedTuple):
    """The chosen text and the scores behind it (the select's meta_info)."""

    decision: str
    meta_info: dict[str, Any] | None = None  # SGLang's default; the adapter makes it a dict


class ChoicesMethod:
    """Turns per-choice token logprobs into a decision. Subclasses set `name`."""

    name = "base"
    requires_unconditional_logprobs = False

    def __call__(
        self,
        *,
        choices: Sequence[str],
        token_logprobs: Sequence[Sequence[float]],
        unconditional_token_logprobs: Sequence[Sequence[float]] | None = None,
    ) -> ChoicesDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"sgl.{self.name}"


def normalized_logprobs(token_logprobs: Sequence[Sequence[float]]) -> list[float]:
    """Mean logprob per choice (a choice with no scored token gets 0.0)."""
    return [sum(lps) / len(lps) if lps else 0.0 for lps in token_logprobs]


def _meta(
    choices: Sequence[str],
    token_logprobs: Sequence[Sequence[float]],
    scores: Sequence[float],
    decision: int,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "choices": list(choices),
        "scores": list(scores),
        "normalized_prompt_logprobs": normalized_logprobs(token_logprobs),
        "token_logprobs": [list(lps) for lps in token_logprobs],
        # SGLang's keys: `[logprob, token_id, text]` entries per choice (a backend that knows
        # the token ids replaces these), and no output tokens (a choice is only scored).
        "input_token_logprobs": logprob_entries(token_logprobs),
        "output_token_logprobs": [[] for _ in choices],
        "decision": choices[decision],
        **extra,
    }


def logprob_entries(token_logprobs: Sequence[Sequence[float]]) -> list[list[list[Any]]]:
    """SGLang's `[logprob, token_id, text]` entries for bare logprobs (id and text unknown)."""
    return [[[lp, None, None] for lp in lps] for lps in token_logprobs]


class TokenLengthNormalized(ChoicesMethod):
    """Picks the choice with the highest mean token logprob (SGLang's default)."""

    name = "token_length_normalized"

    def __call__(self, *, choices, token_logprobs, unconditional_token_logprobs=None):
        scores = normalized_logprobs(token_logprobs)
        best = max(range(len(choices)), key=scores.__getitem__)
        return ChoicesDecision(choices[best], _meta(choices, token_logprobs, scores, best))


class GreedyTokenSelection(ChoicesMethod):
    """Compares choices token by token, keeping those with the best logprob at each position.

    A shorter choice is padded with its own mean logprob, as in SGLang.
    """

    name = "greedy_token_selection"

    def __call__(self, *, choices, token_logprobs, unconditional_token_logprobs=None):
        width = max((len(lps) for lps in token_logprobs), default=0)
        rows = []
        for lps in token_logprobs:
            pad = sum(lps) / len(lps) if lps else -math.inf
            rows.append(list(lps) + [pad] * (width - len(lps)))
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(rows[i][j] for i in remaining)
            remaining = [i for i in remaining if rows[i][j] == best]
            if len(remaining) == 1:
                break
        winner = remaining[0]
        scores = [1.0 if i == winner else 0.0 for i in range(len(choices))]
        return ChoicesDecision(choices[winner], _meta(choices, token_logprobs, scores, winner))


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Mean logprob given the prompt minus mean logprob of the choice alone (PMI-style)."""

    name = "unconditional_likelihood_normalized"
    requires_unconditional_logprobs = True

    def __call__(self, *, choices, token_logprobs, unconditional_token_logprobs=None):
        if unconditional_token_logprobs is None:
            raise ValueError(
                "unconditional_likelihood_normalized needs the choices' logprobs without the "
                "prompt; this backend did not provide them"
            )
        cond = normalized_logprobs(token_logprobs)
        uncond = normalized_logprobs(unconditional_token_logprobs)
        scores = [c - u for c, u in zip(cond, uncond)]
        best = max(range(len(choices)), key=scores.__getitem__)
        meta = _meta(
            choices,
            token_logprobs,
            scores,
            best,
            unconditional_token_logprobs=[list(x) for x in unconditional_token_logprobs],
        )
        return ChoicesDecision(choices[best], meta)


class ChoicesSamplingMethod:
    """SGLang's base class of choice methods (`sglang.lang.choices.ChoicesSamplingMethod`).

    A subclass defines `__call__(*, choices, normalized_prompt_logprobs, input_token_logprobs,
    output_token_logprobs, unconditional_token_logprobs=None) -> ChoicesDecision` as in SGLang,
    and may override the `requires_unconditional_logprobs` property. `select` wraps it with
    `as_choices_method`; the entries it receives are `[logprob, None, None]` (token ids and
    texts are not passed through the scoring protocol).
    """

    @property
    def requires_unconditional_logprobs(self) -> bool:
        """Whether the method needs each choice's logprobs without the prompt."""
        return False

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> ChoicesDecision:
        raise NotImplementedError(f"{type(self).__name__} must define __call__")


class SglangStyleMethod(ChoicesMethod):
    """Runs an SGLang-style choice method (SGLang's keyword arguments) as a `ChoicesMethod`."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.name = type(method).__name__
        self.requires_unconditional_logprobs = bool(
            getattr(method, "requires_unconditional_logprobs", False)
        )

    def __call__(self, *, choices, token_logprobs, unconditional_token_logprobs=None):
        normalized = normalized_logprobs(token_logprobs)
        uncond = None
        if unconditional_token_logprobs is not None:
            uncond = logprob_entries(unconditional_token_logprobs)
        out = self.method(
            choices=list(choices),
            normalized_prompt_logprobs=normalized,
            input_token_logprobs=logprob_entries(token_logprobs),
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=uncond,
        )
        decision = getattr(out, "decision", None)
        if not isinstance(decision, str) or decision not in choices:
            raise ValueError(
                f"choices_method {self.name} returned {out!r}; it must return "
                f"ChoicesDecision(decision=<one of {list(choices)}>, meta_info=...)"
            )
        meta = _meta(choices, token_logprobs, normalized, list(choices).index(decision))
        meta.update(getattr(out, "meta_info", None) or {})
        return ChoicesDecision(decision, meta)


def as_choices_method(method: Any) -> ChoicesMethod:
    """`method` as a `ChoicesMethod`: one of ours, or an SGLang-style one wrapped."""
    if isinstance(method, ChoicesSamplingMethod) or (
        callable(method) and _takes_sglang_arguments(method)
    ):
        return SglangStyleMethod(method)
    if isinstance(method, ChoicesMethod):
        return method
    raise ValueError(
        "choices_method must be sgl.token_length_normalized, sgl.greedy_token_selection, "
        "sgl.unconditional_likelihood_normalized, or an SGLang-style ChoicesSamplingMethod "
        f"(a __call__ taking choices=, normalized_prompt_logprobs=, ...); got {method!r}"
    )


def _takes_sglang_arguments(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "normalized_prompt_logprobs" in params


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


# --- the token boundary between a prefix and a choice -------------------------------------
class ChoiceTokens(NamedTuple):
    """`ids` = tokens of prefix+choice; the choice is scored on `ids[start:]`.

    `merged` is True when tokenizing prefix+choice changed the prefix's own last tokens (the
    choice's first token absorbed characters of the prefix); those tokens are then scored as
    part of the choice, since no token boundary separates them.
    """

    ids: list[int]
    start: int
    merged: bool


def choice_tokens(
    tokenizer: Tokenizer, prefix: str, choice: str, prefix_ids: list[int] | None = None
) -> ChoiceTokens:
    """Tokenizes prefix+choice together and finds the first token that belongs to the choice.

    That is the first token where the joint tokenization departs from the prefix's own
    tokenization (so every scored token contains choice characters and no token of the
    prefix's stable part is scored).
    """
    if not choice:
        raise ValueError("select choices must be non-empty strings")
    if prefix_ids is None:
        prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    ids = tokenizer.encode(prefix + choice, add_special_tokens=False)
    start = common_prefix_len(prefix_ids, ids)
    if start == len(ids):  # the choice's text tokenized into nothing new: cannot happen for
        start = len(ids) - 1  # non-empty text, but never score zero tokens
    return ChoiceTokens(ids=ids, start=start, merged=start < len(prefix_ids))


def logprob_values(entries: Sequence[Sequence[Any]]) -> list[float]:
    """The logprobs of `[logprob, token_id, text]` entries, skipping the None of a first token."""
    return [float(e[0]) for e in entries if e[0] is not None]
