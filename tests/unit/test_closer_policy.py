"""closer.py's policy on a model-free regex matcher over a byte vocabulary: in an email local
part that takes `}` as a letter (llguidance's `format: email`) the closer reaches the end
through `@`, where it used to take `}` for a closing bracket until its cap."""

from __future__ import annotations

import regex

from sgl_lite.backend.constrained.matchers.closer import Ranked, closing_path

# one-byte tokens for printable ASCII, then the two-byte closers the policy prefers
VOCAB: tuple[bytes, ...] = (*(bytes([b]) for b in range(32, 127)), b'"}', b'"]')
RANKED = Ranked(VOCAB.index(b'"'), VOCAB.index(b"a"), VOCAB, {b: i for i, b in enumerate(VOCAB)})
EMAIL = r'\{"email": "[a-z0-9}]+@[a-z0-9]+"\}'


class RegexMatcher:
    """closer.ClosingMatcher over a regex: the text so far must stay a prefix of a match."""

    def __init__(self, pattern: str, text: str = "") -> None:
        self.pattern = regex.compile(pattern)
        self.text = text

    def _prefix(self, text: str) -> bool:
        return self.pattern.fullmatch(text, partial=True) is not None

    def accepting(self) -> bool:
        """Whether the text so far is a whole match."""
        return self.pattern.fullmatch(self.text) is not None

    def forced(self) -> list[int]:
        """No fast-forward (the policy's rules 1, 2 and 4 must do it all)."""
        return []

    def forced_bytes(self) -> bytes:
        """No fast-forward."""
        return b""

    def try_consume(self, token_id: int) -> bool:
        """Appends the token's text where the result is still a prefix of a match."""
        text = self.text + VOCAB[token_id].decode()
        if not self._prefix(text):
            return False
        self.text = text
        return True

    def lowest_allowed(self) -> int | None:
        """The lowest-id token that keeps a prefix of a match."""
        return next((i for i, b in enumerate(VOCAB) if self._prefix(self.text + b.decode())), None)

    def allows(self, tokens: list[int]) -> int:
        """How many of `tokens` in a row keep a prefix of a match."""
        text, n = self.text, 0
        for t in tokens:
            text += VOCAB[t].decode()
            if not self._prefix(text):
                break
            n += 1
        return n

    def completes(self, tokens: list[int]) -> bool:
        """Whether `tokens` end a whole match."""
        text = self.text + "".join(VOCAB[t].decode() for t in tokens)
        return self.pattern.fullmatch(text) is not None


def test_an_email_local_part_that_takes_a_brace_is_closed_through_its_at_sign() -> None:
    matcher = RegexMatcher(EMAIL, '{"email": "')
    path = closing_path(matcher, RANKED, 64)
    assert path is not None, "the closer took `}` in the local part for a closing bracket"
    assert matcher.text == '{"email": "1@1"}'


def test_a_brace_that_closes_the_object_is_still_taken_first() -> None:
    matcher = RegexMatcher(r'\{"n": [0-9]+\}', '{"n": 5')
    assert closing_path(matcher, RANKED, 8) == [VOCAB.index(b"}")]
