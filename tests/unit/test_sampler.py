"""Sampler: greedy, masks, seeded draws from its own generators, logprobs from the raw logits,
and picking each request's row out of the runner's output."""

from __future__ import annotations

import torch

from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler.logprobs import LogprobState
from sgl_lite.backend.scheduler.sampler import Sampler, _nucleus
from sgl_lite.backend.types import ForwardOutput, Req, ScheduleBatch, Segment

V = 16
EOS = 3


def req(**params) -> Req:
    return Req(rid="r", input_ids=[1, 2], sampling_params=SamplingParams(**params))


def rows(*peaks: int) -> torch.Tensor:
    logits = torch.zeros(len(peaks), V)
    for i, p in enumerate(peaks):
        logits[i, p] = 5.0
    return logits


def test_greedy_takes_the_argmax_and_min_new_tokens_blocks_eos():
    sampler = Sampler({EOS}, V)
    tokens, _ = sampler.sample_rows(
        rows(7, EOS), [req(temperature=0), req(temperature=0, min_new_tokens=2)]
    )
    assert tokens[0] == 7 and tokens[1] != EOS


def test_seeded_draws_repeat_and_leave_the_global_rng_alone():
    logits = torch.randn(1, V)
    state = torch.random.get_rng_state()
    draws = []
    for _ in range(2):
        r = req(temperature=1.0)
        r.generator = torch.Generator().manual_seed(5)
        draws.append([Sampler({EOS}, V).sample_rows(logits, [r])[0][0] for _ in range(1)])
    assert draws[0] == draws[1]
    unseeded = Sampler({EOS}, V, seed=1)
    a = [unseeded.sample_rows(logits, [req(temperature=1.0)])[0][0] for _ in range(20)]
    again = Sampler({EOS}, V, seed=1)
    b = [again.sample_rows(logits, [req(temperature=1.0)])[0][0] for _ in range(20)]
    assert a == b  # the sampler's own generator, seeded from the config
    assert torch.equal(torch.random.get_rng_state(), state)


def test_rows_drawn_together_keep_each_requests_own_filters_and_seed():
    """One batched draw for the unseeded rows: each row still samples only from its own
    top-k / top-p / min-p set, and a seeded request draws the same token alone or batched."""
    logits = torch.arange(V, dtype=torch.float32).repeat(5, 1)  # token V-1 the likeliest
    filters = [
        dict(temperature=1.0, top_k=2),  # {V-1, V-2}
        dict(temperature=1.0, top_p=1e-3),  # the likeliest alone
        dict(temperature=1.0, min_p=0.3),  # p >= 0.3 * max: e^-1 = 0.37 keeps V-1, V-2
        dict(temperature=0.0),  # greedy beside them
    ]
    allowed = [{V - 1, V - 2}, {V - 1}, {V - 1, V - 2}, {V - 1}]
    sampler = Sampler({EOS}, V, seed=3)
    for _ in range(30):
        seeded = req(temperature=1.0)
        seeded.generator = torch.Generator().manual_seed(11)
        batch = [req(**f) for f in filters] + [seeded]
        tokens, _ = sampler.sample_rows(logits, batch)
        for token, ok in zip(tokens, allowed):
            assert token in ok
        alone = req(temperature=1.0)
        alone.generator = torch.Generator().manual_seed(11)
        assert sampler.sample_rows(logits[:1], [alone])[0] == [tokens[-1]]


def test_the_nucleus_from_the_top_candidates_equals_the_one_from_a_full_sort():
    """Peaked rows (the nucleus within the candidates) and flat ones (past them, sorted
    whole) in one batch give the same kept set and mass as sorting every row."""
    torch.manual_seed(0)
    probs = torch.cat([torch.randn(3, 4096) * 8, torch.randn(3, 4096)]).softmax(-1)
    top_p = torch.tensor([0.5, 0.9, 0.99, 0.5, 0.9, 0.99])
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p[:, None]] = 0
    want = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    for rows in (slice(0, 3), slice(0, 6)):  # the candidates alone; with rows sorted whole
        got = _nucleus(probs[rows], top_p[rows])
        assert torch.equal(got > 0, want[rows] > 0)
        assert torch.allclose(got, want[rows])


def test_top_k_one_is_greedy_whatever_the_temperature():
    tokens, _ = Sampler({EOS}, V).sample_rows(rows(9), [req(temperature=2.0, top_k=1)])
    assert tokens == [9]


def test_logprobs_come_from_the_raw_logits_before_penalties():
    r = req(temperature=0, repetition_penalty=2.0)
    r.logprobs = LogprobState(start_len=1, top_k=2)
    logits = rows(1)  # token 1 is in the prompt, so the penalty halves its logit
    tokens, values = Sampler({EOS}, V).sample_rows(logits, [r])
    raw = torch.log_softmax(logits[0], -1)
    assert values is not None and abs(values.chosen[0] - raw[tokens[0]].item()) < 1e-6
    assert values.top[0][0] == (raw.max().item(), 1)


def test_chosen_token_ids_get_their_raw_logprobs_per_row():
    asks, plain = req(temperature=0, repetition_penalty=2.0), req(temperature=0)
    asks.logprobs = LogprobState(start_len=1, token_ids=(1, 7, 1))  # repeats are kept
    plain.logprobs = LogprobState(start_len=1)
    logits = rows(1, 4)
    tokens, values = Sampler({EOS}, V).sample_rows(logits, [asks, plain])
    raw = torch.log_softmax(logits[0], -1)
    assert values is not None and values.ids is not None and values.ids[1] is None
    assert values.ids[0] == [raw[1].item(), raw[7].item(), raw[1].item()]
    asks.logprobs.add_output(tokens[0], values, 0, lambda t: f"<{t}>")
    delta = asks.logprobs.take()
    one, seven = (raw[1].item(), 1, None), (raw[7].item(), 7, None)
    assert delta.output_token_ids == ((one, seven, one),)  # one entry per output token
    assert asks.logprobs.take().output_token_ids == ()  # handed out once
    plain.logprobs.add_output(tokens[1], values, 1, lambda t: None)
    assert plain.logprobs.take().output_token_ids is None  # not asked for


def test_sample_reads_each_requests_last_row_of_the_forward_output():
    a, b = req(temperature=0), req(temperature=0)
    slots = torch.arange(2)
    batch = ScheduleBatch(
        [a, b],
        [
            Segment(token_ids=[1, 2], start=0, kv_slots=slots, logits_from=0),
            Segment(token_ids=[1, 2], start=0, kv_slots=slots, logits_from=1),
        ],
    )
    # a asked for two rows (a prompt-logprob row, then its last); b for one
    output = ForwardOutput(rows(4, 5, 6), [(0, 2), (2, 3)])
    samples = Sampler({EOS}, V).sample(batch, output)
    assert [s.token for s in samples] == [5, 6]


def test_a_grammar_mask_is_applied_and_padding_ids_never_win():
    class Only:
        def allowed_mask(self) -> torch.Tensor:
            mask = torch.zeros(V - 4, dtype=torch.bool)
            mask[2] = True
            return mask

    r = req(temperature=0)
    r.guide = Only()  # type: ignore[assignment]
    tokens, _ = Sampler({EOS}, V).sample_rows(rows(V - 1), [r])
    assert tokens == [2]


def test_the_stacked_grammar_masks_are_each_requests_own_in_order():
    gen = torch.Generator().manual_seed(3)
    masks = [torch.rand(V, generator=gen) > 0.5 for _ in range(5)]
    reqs = [req(temperature=0) for _ in masks]
    for r in reqs:
        r.guide = object()  # type: ignore[assignment]  # constrained; the step's masks apply
    logits = torch.randn(5, V, generator=gen)
    got = Sampler._allowed(logits, reqs, dict(zip(reqs, masks)))
    assert got.dtype == torch.bool and torch.equal(got, torch.stack(masks))
    tokens, _ = Sampler({EOS}, V).sample_rows(logits, reqs, dict(zip(reqs, masks)))
    expected = torch.where(torch.stack(masks), logits, float("-inf")).argmax(dim=1)
    assert tokens == expected.tolist()


def test_logit_bias_forces_or_bans_a_token_under_greedy_only_for_its_request():
    noise = torch.randn(3, V, generator=torch.Generator().manual_seed(0))  # fixed: no flakes
    logits = 0.1 * noise + rows(7, 7, 7)
    sampler = Sampler({EOS}, V)
    plain = req(temperature=0)
    forced = req(temperature=0, logit_bias=((11, 100.0),))
    banned = req(temperature=0, logit_bias=((7, -100.0),))
    tokens, values = sampler.sample_rows(logits, [plain, forced, banned])
    assert tokens[0] == 7 and tokens[1] == 11
    assert tokens[2] != 7 and tokens[2] == int(logits[2].topk(2).indices[1])
    assert values is None


def test_logit_bias_from_json_keys_and_a_grammar_still_wins():
    params = SamplingParams.from_dict({"temperature": 0, "logit_bias": {"9": 100, 4: -5.5}})
    assert params.logit_bias == ((4, -5.5), (9, 100.0))

    class Only:
        def allowed_mask(self) -> torch.Tensor:
            mask = torch.zeros(V, dtype=torch.bool)
            mask[2] = True
            return mask

    r = Req(rid="r", input_ids=[1], sampling_params=params)
    r.guide = Only()  # type: ignore[assignment]
    tokens, _ = Sampler({EOS}, V).sample_rows(rows(5), [r])
    assert tokens == [2]  # the bias on 9 cannot break the constraint
