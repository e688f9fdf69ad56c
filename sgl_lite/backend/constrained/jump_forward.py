"""Jump-forward: when the grammar forces the next bytes, append their tokens without sampling.

`forced_bytes` walks the grammar's single-byte index while exactly one byte is allowed;
`plan_jump_forward` retokenizes the tail of the output plus the forced bytes (on bytes, so
partial UTF-8 characters are never split into replacement characters) and says which output
tokens to keep and which to append; `apply_jump_forward` moves the guide accordingly. This
module touches no tensors and no KV memory: the engine drops the KV of replaced tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sgl_lite.backend.constrained.compiler import CompiledGrammar
from sgl_lite.backend.constrained.guide import Guide
from sgl_lite.backend.constrained.vocab import BYTE_EOS_ID

MAX_FORCED_BYTES = 4096
# NOTE: only the last RETOKENIZE_WINDOW output tokens are retokenized, so a step costs O(1)
# in the output length; tokens before the window are always kept.
RETOKENIZE_WINDOW = 32


class JumpForward(NamedTuple):
    """Replace output_ids[keep:] by new_ids; `forced_text` is what the grammar forced."""

    keep: int
    new_ids: list[int]
    forced_text: str


def forced_bytes(grammar: CompiledGrammar, state: int) -> bytes:
    """The only continuation from `state`, up to a branch or an accepting state (memoized)."""
    hit = grammar.forced.get(state)
    if hit is not None:
        return hit
    out = bytearray()
    index = grammar.byte_index
    s = state
    while len(out) < MAX_FORCED_BYTES and not index.is_final_state(s):
        allowed = index.get_allowed_tokens(s)
        if not allowed or len(allowed) != 1 or allowed[0] == BYTE_EOS_ID:
            break
        nxt = index.get_next_state(s, allowed[0])
        if nxt is None:
            break
        out.append(allowed[0])
        s = nxt
    grammar.forced[state] = bytes(out)
    return grammar.forced[state]


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
    if not isinstance(guide, Guide):  # a grammar backend: its own forced tokens, appended
        ids = guide.forced_tokens()
        if not ids:
            return None
        text = tokenizer.decode(ids)
        return JumpForward(keep=len(output_ids), new_ids=ids, forced_text=text)
    grammar = guide.grammar
    forced = forced_bytes(grammar, guide.state)
    if not forced:
        return None
    vocab = grammar.vocab
    start = max(0, len(output_ids) - RETOKENIZE_WINDOW)
    tail = vocab.decode_bytes(output_ids[start:])
    while tail is not None and start > 0 and tail[:1] and tail[0] & 0xC0 == 0x80:
        start -= 1  # begin the window on a character boundary
        tail = vocab.decode_bytes(output_ids[start:])
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
    if vocab.decode_bytes(new) != full:  # also rejects special tokens
        return None
    old = output_ids[start:]
    k = 0
    while k < len(old) and k < len(new) and old[k] == new[k]:
        k += 1
    if k == len(new):
        return None
    # NOTE: checked here, before the engine drops any KV: a retokenized jump the grammar
    # refuses, or one that would leave no valid ending within the budget, is not taken.
    if not guide.fits_after(start + k, new[k:]):
        return None
    return JumpForward(
        keep=start + k, new_ids=new[k:], forced_text=forced.decode("utf-8", errors="replace")
    )


def apply_jump_forward(guide: Guide, jf: JumpForward) -> bool:
    """Rolls `guide` back to `jf.keep` advances and advances over `jf.new_ids`.

    Checks every new token and the budget first; if the jump does not fit, the guide is left
    untouched and the result is False (the caller must not jump).
    """
    if not 0 <= jf.keep <= guide.num_advanced:
        raise ValueError(
            f"jump-forward keeps {jf.keep} tokens but the guide has {guide.num_advanced}"
        )
    if not isinstance(guide, Guide):
        for token_id in jf.new_ids:
            guide.advance(token_id)
        return True
    if not guide.fits_after(jf.keep, jf.new_ids):
        return False
    guide.rollback(guide.num_advanced - jf.keep)
    for token_id in jf.new_ids:
        guide.advance(token_id)
    return True


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
