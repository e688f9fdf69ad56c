"""The per-step fast paths give exactly what the plain code gives: the chunked greedy argmax,
the detokenizer's direct backend decode; masks never write into the runner's logits."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler.detokenizer import IncrementalDetokenizer, backend_decoder
from sgl_lite.backend.scheduler.sampler import ARGMAX_CHUNK, Sampler, greedy_argmax
from sgl_lite.backend.types import ForwardOutput, Req, ScheduleBatch, Segment
from tests.support.fakes import ByteTokenizer
from tests.support.tiny import build_tiny_tokenizer


@settings(deadline=None)
@given(
    rows=st.integers(1, 17),
    vocab=st.sampled_from([2 * ARGMAX_CHUNK, 1000, 8191, 49152, 70001]),
    seed=st.integers(0, 2**16),
    ties=st.booleans(),
    masked=st.sampled_from([0.0, 0.5, 1.0]),
    nan=st.booleans(),
)
def test_greedy_argmax_is_argmax(rows, vocab, seed, ties, masked, nan) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=gen)
    if ties:
        x = (x * 2).round()  # many equal maxima: the first one must win
    if masked:
        x[torch.rand(rows, vocab, generator=gen) < masked] = float("-inf")
    if nan:
        x[rows // 2, seed % vocab] = float("nan")
    assert torch.equal(greedy_argmax(x), x.argmax(dim=-1))


def test_backend_decode_matches_the_tokenizers_decode() -> None:
    assert backend_decoder(ByteTokenizer()) is None  # not a HF tokenizer: its own decode
    tok = build_tiny_tokenizer()
    decode = backend_decoder(tok)
    assert decode is not None
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, len(tok), (int(torch.randint(1, 6, (1,), generator=gen)),))
        for skip in (False, True):
            assert decode(ids.tolist(), skip) == tok.decode(ids.tolist(), skip_special_tokens=skip)
    text = "Paris is a city in France. ☃"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams())
    for n in range(1, len(ids) + 1):
        detok.feed(ids[:n])
    detok.finish(ids, None)
    assert detok.take() == tok.decode(ids) == text


def test_masks_leave_the_runners_inference_logits_alone() -> None:
    vocab = 600

    class Only:
        def __init__(self, token: int) -> None:
            self.mask = torch.zeros(vocab, dtype=torch.bool)
            self.mask[token] = True

        def allowed_mask(self) -> torch.Tensor:
            return self.mask

    reqs = [Req(rid=str(i), input_ids=[1], sampling_params=SamplingParams(temperature=0))
            for i in range(3)]  # fmt: skip
    reqs[0].guide = Only(5)  # type: ignore[assignment]
    reqs[2].guide = Only(9)  # type: ignore[assignment]
    for r in reqs:
        r.slot_ids = torch.arange(1)
    segments = [Segment(token_ids=[1], start=0, kv_slots=r.slot_ids, logits_from=0) for r in reqs]
    with torch.inference_mode():  # as the model computes them
        logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    copied = logits.clone()
    output = ForwardOutput(logits, [(0, 1), (1, 2), (2, 3)])
    samples = Sampler({0}, vocab).sample(ScheduleBatch(reqs, segments), output)
    assert [s.token for s in samples] == [5, int(copied[1].argmax()), 9]
    assert torch.equal(logits, copied)
