"""Select scoring: which tokens belong to a choice, and how their logprobs pick a winner.

Pure functions over token ids and logprob lists; no backend, no model. The three methods
follow SGLang's `sglang.lang.choices` (same names, same decisions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from sgl_lite.common.sequences import common_prefix_len


class ChoicesDecision(NamedTuple):
    """The chosen text and the scores behind it (the select's meta_info)."""

    decision: str
    meta_info: dict[str, Any]


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
        "decision": choices[decision],
        **extra,
    }


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
    tokenizer: Any, prefix: str, choice: str, prefix_ids: list[int] | None = None
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
