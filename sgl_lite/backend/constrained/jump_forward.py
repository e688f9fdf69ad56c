"""Jump-forward: when the grammar forces the next text, append its tokens without sampling.

Each Guide plans its own jump (`Guide.plan_jump_forward`): the automaton walks its single-byte
index for the forced bytes and `retokenize`s the tail of the output plus those bytes here (on
bytes, so partial UTF-8 characters are never split into replacement characters); llguidance
and xgrammar append their own forced tokens. `plan_jump_forward` and `apply_jump_forward` are
what the output processor calls, with the checks every guide shares. This module touches no
tensors and no KV memory: the engine drops the KV of replaced tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_lite.backend.constrained.protocols import Guide, JumpForward

# NOTE: only the last RETOKENIZE_WINDOW output tokens are retokenized, so a step costs O(1)
# in the output length; tokens before the window are always kept.
RETOKENIZE_WINDOW = 32


def plan_jump_forward(tokenizer: Any, guide: Guide, output_ids: list[int]) -> JumpForward | None:
    """What to splice into the output if the grammar forces text from the guide's state.

    `output_ids` are this request's generated tokens, all already advanced in `guide`.
    None when nothing is forced, when the text does not round-trip through the tokenizer, when
    retokenizing changes nothing, or when the new tokens do not fit the grammar or the budget.
    """
    if guide.num_advanced != len(output_ids):
        raise ValueError(
            f"guide has advanced {guide.num_advanced} tokens but output_ids has {len(output_ids)}"
        )
    return guide.plan_jump_forward(tokenizer, output_ids)


def apply_jump_forward(guide: Guide, jf: JumpForward) -> bool:
    """Rolls `guide` back to `jf.keep` advances and advances over `jf.new_ids`.

    Checks every new token and the budget first; if the jump does not fit, the guide is left
    untouched and the result is False (the caller must not jump).
    """
    if not 0 <= jf.keep <= guide.num_advanced:
        raise ValueError(
            f"jump-forward keeps {jf.keep} tokens but the guide has {guide.num_advanced}"
        )
    return guide.apply_jump_forward(jf)


def retokenize(
    tokenizer: Any,
    decode_bytes: Callable[[list[int]], bytes | None],
    output_ids: list[int],
    forced: bytes,
) -> JumpForward | None:
    """`output_ids` followed by the `forced` bytes, with the tail retokenized: which tokens to
    keep and which to append. None when the text does not round-trip through the tokenizer
    (`decode_bytes` gives a token's bytes, None for special ones) or nothing changes. The
    caller still checks that the new tokens fit its grammar and budget."""
    start = max(0, len(output_ids) - RETOKENIZE_WINDOW)
    tail = decode_bytes(output_ids[start:])
    while tail is not None and start > 0 and tail[:1] and tail[0] & 0xC0 == 0x80:
        start -= 1  # begin the window on a character boundary
        tail = decode_bytes(output_ids[start:])
    if tail is None:
        return None
    cut = _unfinished_char_len(tail + forced)
    if cut >= len(forced):
        return None
    forced = forced[: len(forced) - cut]
    full = tail + forced
    try:
        text = full.decode("utf-8")
    except UnicodeDecodeError:
        return None
    new = tokenizer.encode(text, add_special_tokens=False)
    if decode_bytes(new) != full:  # also rejects special tokens
        return None
    old = output_ids[start:]
    k = 0
    while k < len(old) and k < len(new) and old[k] == new[k]:
        k += 1
    if k == len(new):
        return None
    return JumpForward(
        keep=start + k, new_ids=new[k:], forced_text=forced.decode("utf-8", errors="replace")
    )


def _unfinished_char_len(b: bytes) -> int:
    """How many trailing bytes of `b` belong to a UTF-8 character that is not complete."""
    n = 0
    while n < min(3, len(b)) and b[-1 - n] & 0xC0 == 0x80:
        n += 1
    if n == len(b):
        return 0  # only continuation bytes: let the decode check decide
    lead = b[-1 - n]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
    return n + 1 if n + 1 < need else 0
