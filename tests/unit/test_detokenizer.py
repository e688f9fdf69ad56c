"""The incremental detokenizer on a byte tokenizer: text equals a full decode, stops are trimmed,
streamed text is final (never a piece of a later stop), a rewind (jump-forward) changes
nothing, and a step costs O(1) in the output length."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler.detokenizer import IncrementalDetokenizer
from tests.support.fakes import EOS, ByteTokenizer


def run(ids: list[int], **params) -> tuple[list[str], str | None, IncrementalDetokenizer]:
    """Feeds ids one at a time like the engine; returns the streamed pieces and the match."""
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, SamplingParams(**params))
    pieces, out = [], []
    for token in ids:
        out.append(token)
        match = detok.feed(out)
        pieces.append(detok.take())
        if match is not None:
            detok.finish(out, match)
            pieces.append(detok.take())
            return pieces, match.text, detok
    detok.finish(out, None)
    pieces.append(detok.take())
    return pieces, None, detok


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_text_equals_a_full_decode_and_partial_characters_wait():
    ids = encode("héllo, wörld — ✓")
    pieces, match, _ = run(ids)
    assert "".join(pieces) == "héllo, wörld — ✓" and match is None
    assert all("\ufffd" not in p for p in pieces)


def test_a_stop_string_across_tokens_is_trimmed_and_never_streamed():
    pieces, match, _ = run(encode("one, two; three"), stop=("; t",))
    assert match == "; t" and "".join(pieces) == "one, two"
    text = ""
    for piece in pieces:  # no piece ever showed a prefix of the stop that got trimmed
        text += piece
        assert "one, two".startswith(text)


def test_held_back_text_that_does_not_become_a_stop_is_released():
    pieces, match, _ = run(encode("a;b;c"), stop=(";;",))
    assert match is None and "".join(pieces) == "a;b;c"
    assert pieces[1] == "" and pieces[2] == ";b"  # ";" waited one token, then went out


def test_stop_regex_matches_trims_and_holds_partial_matches():
    pieces, match, _ = run(encode("order 66 now 123x"), stop_regex=(r"\d{3}",))
    assert match == "123" and "".join(pieces) == "order 66 now "
    shown = list(itertools.accumulate(pieces))
    assert shown[7] == "order " and shown[8] == "order 66 "  # "66" waited: it might grow
    kept, _, _ = run(encode("ab 123x"), stop_regex=(r"\d{3}",), no_stop_trim=True)
    assert "".join(kept) == "ab 123"


def test_special_tokens_are_skipped_or_kept():
    assert "".join(run([*encode("hi"), EOS])[0]) == "hi"
    assert "".join(run([*encode("hi"), EOS], skip_special_tokens=False)[0]) == "hi<eos>"


def test_rewind_after_replaced_tokens_keeps_the_text():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, SamplingParams())
    out: list[int] = []
    text = ""
    for token in encode("abc é"):
        out.append(token)
        detok.feed(out)
        text += detok.take()
    # jump-forward: the last 3 tokens are replaced by tokens of the same text plus more
    keep = len(out) - 3
    detok.rewind(keep)
    out[keep:] = encode("abc é!!")[keep:]
    detok.feed(out)
    text += detok.take()
    detok.finish(out, None)
    text += detok.take()
    assert text == "abc é!!"


def test_cost_per_token_does_not_grow_with_the_output():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=("zz",)))
    out: list[int] = []
    for token in encode("ab" * 2000):
        out.append(token)
        detok.feed(out)
    # two small windows per token, never the whole output
    assert tok.decoded_tokens < 8 * len(out)


@settings(deadline=None)
@given(
    text=st.text(alphabet="ab;é\n", min_size=0, max_size=40),
    stops=st.lists(st.text(alphabet="ab;é\n", min_size=1, max_size=3), max_size=2),
)
def test_streamed_text_matches_a_reference_trim(text, stops):
    pieces, match, _ = run(encode(text), stop=tuple(stops))
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        assert match is None and "".join(pieces) == text
        return
    # the engine stops at the first token that completes a stop: the earliest-ending match
    ends = sorted((i + len(s), i, s) for i, s in hits)
    end = ends[0][0]
    prefix = text[:end]
    first = min((prefix.find(s), s) for s in stops if s in prefix)
    assert match == first[1] and "".join(pieces) == text[: first[0]]
    assert re.escape(first[1])  # the matched text is one of the stops


@settings(deadline=None)
@given(
    text=st.text(alphabet="ab;é✓", min_size=1, max_size=30),
    steps=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 6)), min_size=1, max_size=12),
    stops=st.lists(st.text(alphabet="ab;", min_size=2, max_size=3), max_size=1),
)
def test_feeds_and_rewinds_in_any_order_give_the_text_once(text, steps, stops):
    """Jump-forward's pattern: a few tokens come at once, then the last ones are replaced by
    tokens of the same text (a byte tokenizer has one tokenization, so: the same ids)."""
    target = encode(text)
    detok = IncrementalDetokenizer(ByteTokenizer(), SamplingParams(stop=tuple(stops)))
    out: list[int] = []
    streamed = ""
    match = None
    for add, back in steps:
        if len(out) >= len(target):
            break
        keep = max(len(out) - back, 0)
        detok.rewind(keep)
        out[keep:] = target[keep : len(out) + add]
        match = detok.feed(out)
        streamed += detok.take()
        if match is not None:
            break
    detok.finish(out, match)
    streamed += detok.take()
    decoded = ByteTokenizer().decode(out)
    if match is None:
        assert streamed == decoded
    else:
        assert streamed == decoded[: decoded.index(match.text)]
