"""A fake model runner and a byte tokenizer: the real Engine, no model files, milliseconds.

`ByteTokenizer`: ids 0-255 are bytes, then a few special tokens, so multi-byte characters span
tokens as with a real byte-level BPE. `FakeRunner` keeps one "K/V" number per pool slot (the
token written there) and predicts from the sequence it reads back through the slots, so a
request that got wrong slots from the cache would produce different tokens.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import torch

from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.types import ForwardOutput, Segment

EOS = 256
BOS = 257
SPECIAL = {EOS: "<eos>", BOS: "<bos>"}
VOCAB = 260


class ByteTokenizer:
    """Bytes as tokens; `<eos>`/`<bos>` specials. Enough of the HF API for the engine."""

    eos_token_id = EOS
    bos_token_id = BOS

    def __init__(self) -> None:
        self.decoded_tokens = 0  # how many token ids decode() has read, to measure cost

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.decoded_tokens += len(ids)
        out, run = [], bytearray()
        for t in ids:
            if t < 256:
                run.append(t)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(SPECIAL.get(t, f"<{t}>"))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


def hashed_next(seq: list[int]) -> int:
    """A deterministic 'model': the next byte from a hash of the last 8 tokens, in a-z."""
    digest = hashlib.blake2b(bytes(t % 256 for t in seq[-8:]), digest_size=2).digest()
    return ord("a") + digest[0] % 26


class FakeRunner:
    """Logits that peak at `next_token(sequence read back through the slots)`."""

    def __init__(
        self,
        num_slots: int = 4096,
        context_length: int = 2048,
        next_token: Callable[[list[int]], int] = hashed_next,
    ) -> None:
        self.pool = KVPool(num_layers=1, num_slots=num_slots, num_kv_heads=1, head_dim=2)
        self.vocab_size = VOCAB
        self.context_length = context_length
        self.next_token = next_token
        self.tokens = torch.full((num_slots,), -1, dtype=torch.long)  # the fake K/V
        self.batches: list[list[int]] = []  # new tokens per segment, per forward pass
        self.segments: list[list[Segment]] = []

    def forward(self, segments: list[Segment]) -> ForwardOutput:
        self.batches.append([len(s.token_ids) for s in segments])
        self.segments.append(segments)
        rows, ranges = [], []
        for seg in segments:
            new = seg.kv_slots[seg.start :]
            assert len(new) == len(seg.token_ids), "a segment's new slots match its tokens"
            self.tokens[new] = torch.tensor(seg.token_ids)
            first = len(rows)
            for j in range(seg.logits_from, len(seg.token_ids)):
                seq = self.tokens[seg.kv_slots[: seg.start + j + 1]].tolist()
                assert min(seq) >= 0, "a slot of the sequence was never written"
                rows.append(self.logits(seq))
            ranges.append((first, len(rows)))
        return ForwardOutput(torch.stack(rows) if rows else None, ranges)

    def logits(self, seq: list[int]) -> torch.Tensor:
        """Small seeded noise, the predicted token far ahead, specials unlikely."""
        seed = int.from_bytes(hashlib.blake2b(str(seq).encode(), digest_size=4).digest(), "big")
        row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed))
        row[256:] -= 20.0
        row[self.next_token(seq)] += 8.0
        return row


class SlowRunner(FakeRunner):
    """A FakeRunner whose forward pass takes `delay` seconds and always predicts "a", so
    requests stay queued and running long enough to be observed, bounded and timed out."""

    def __init__(self, delay: float, num_slots: int = 2048) -> None:
        super().__init__(num_slots=num_slots, next_token=lambda seq: ord("a"))
        self.delay = delay

    def forward(self, segments: list[Segment]) -> ForwardOutput:
        time.sleep(self.delay)
        return super().forward(segments)
