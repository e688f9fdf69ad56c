"""The three select methods on hand-made logprobs (the token boundary: test_frontend_tokenizer)."""

from __future__ import annotations

import pytest

import sgl_lite as sgl


def test_token_length_normalized_picks_highest_mean_logprob():
    d = sgl.token_length_normalized(choices=["a", "bb"], token_logprobs=[[-2.0], [-0.5, -1.0]])
    assert d.decision == "bb"
    assert d.meta_info["normalized_prompt_logprobs"] == [-2.0, -0.75]


def test_token_length_normalized_does_not_favor_short_choices_by_sum():
    # by sum "a" (-1.0) would win; by mean "bbb" (-0.5) wins
    d = sgl.token_length_normalized(
        choices=["a", "bbb"], token_logprobs=[[-1.0], [-0.5, -0.5, -0.5]]
    )
    assert d.decision == "bbb"


def test_greedy_token_selection_decides_on_first_differing_token():
    d = sgl.greedy_token_selection(
        choices=["x", "y", "z"], token_logprobs=[[-0.1, -9.0], [-0.1, -0.2], [-3.0, -0.0]]
    )
    assert d.decision == "y"


def test_greedy_token_selection_pads_short_choices_with_their_mean():
    # "a" is one token (-0.3); padded with -0.3 it beats "b"'s second token -0.5
    d = sgl.greedy_token_selection(choices=["a", "b"], token_logprobs=[[-0.3], [-0.3, -0.5]])
    assert d.decision == "a"


def test_unconditional_likelihood_normalized_subtracts_the_prior():
    # "common" is likely everywhere; "rare" is much more likely here than without the prompt
    d = sgl.unconditional_likelihood_normalized(
        choices=["common", "rare"],
        token_logprobs=[[-0.5], [-1.0]],
        unconditional_token_logprobs=[[-0.4], [-6.0]],
    )
    assert d.decision == "rare"
    assert d.meta_info["scores"] == pytest.approx([-0.1, 5.0])


def test_unconditional_likelihood_normalized_needs_unconditional_logprobs():
    with pytest.raises(ValueError, match="without the prompt"):
        sgl.unconditional_likelihood_normalized(choices=["a"], token_logprobs=[[-1.0]])
