"""A fake model runner and a byte tokenizer: the real Engine, no model files, milliseconds.

`ByteTokenizer`: ids 0-255 are bytes, then a few special tokens, so multi-byte characters span
tokens as with a real byte-level BPE. `FakeRunner` keeps one "K/V" number per pool slot (the
token written there) and predicts from the sequence it reads back through the slots, so a
request that got wrong slots from the cache would produce different tokens. `SlowRunner` makes
each forward pass take a while. The two engine doubles: `ScriptedEngine` gives the canned
outcomes the real engine cannot be made to give on demand (see its docstring); `ReplyEngine`
answers with scripted replies checked against their constraints, for the routes that build
prompts and constraints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine.results import Submission
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.kvcache.kv_pool import KVPool
from sgl_lite.backend.types import FinishReason, ForwardOutput, ReqOutput, Segment

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
    """Logits that peak at `next_token(sequence read back through the slots)`.

    `vocab_size` is ByteTokenizer's by default; give a tokenizer's own size to run the engine
    with that tokenizer (the tiny BPE one, say).
    """

    def __init__(
        self,
        num_slots: int = 4096,
        context_length: int = 2048,
        next_token: Callable[[list[int]], int] = hashed_next,
        vocab_size: int = VOCAB,
    ) -> None:
        self.pool = KVPool(num_layers=1, num_slots=num_slots, num_kv_heads=1, head_dim=2)
        self.vocab_size = vocab_size
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
        """Small seeded noise, the predicted token far ahead, ids past the bytes (ByteTokenizer's
        specials) unlikely."""
        seed = int.from_bytes(hashlib.blake2b(str(seq).encode(), digest_size=4).digest(), "big")
        row = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(seed))
        row[256:] -= 20.0
        row[self.next_token(seq)] += 8.0
        return row


class SlowRunner(FakeRunner):
    """A FakeRunner whose forward pass takes `delay` seconds and always predicts "a", so
    requests stay queued and running long enough to be observed, bounded and timed out."""

    def __init__(self, delay: float, num_slots: int = 2048, vocab_size: int = VOCAB) -> None:
        super().__init__(
            num_slots=num_slots, next_token=lambda seq: ord("a"), vocab_size=vocab_size
        )
        self.delay = delay

    def forward(self, segments: list[Segment]) -> ForwardOutput:
        time.sleep(self.delay)
        return super().forward(segments)


def output(rid: str, text: str, ids: list[int], start: int, reason: FinishReason | None):
    """A ReqOutput of a 3-token prompt."""
    return ReqOutput(
        rid=rid,
        text=text,
        output_ids=tuple(ids),
        ids_start=start,
        prompt_tokens=3,
        completion_tokens=start + len(ids),
        cached_tokens=0,
        forced_tokens=0,
        e2e_latency=0.01,
        finish_reason=reason,
    )


class ScriptedEngine:
    """The engine API the server uses (submit, abort, info), answering per the request's regex:
    "bad" is refused at submit, "slow" aborts like a grammar compile timeout, "boom" crashes,
    "hang" sends one token and then nothing until aborted, "invalid" finishes with an output
    that failed its final check; anything else streams "a", "b". `submitted` keeps each
    request's sampling params, as the engine received them.

    Not the real Engine over a fake runner: the server's mapping of a compile timeout and of an
    engine crash to HTTP is what its tests check, and the real engine reaches the first only
    through a multi-second compile on a real vocabulary, the second not at all.
    """

    def __init__(self) -> None:
        self.config = EngineConfig(served_model_name="fake", device="cpu")
        self.model_folder = "/models/fake"
        self.context_length = 64
        self.aborted: list[str] = []
        self.hanging: dict[str, object] = {}  # rid -> sink of a request that never ends
        self.submitted: list[dict] = []  # each request's sampling params, in arrival order

    def max_new_tokens_room(self, prompt_len: int) -> int:
        return 64 - prompt_len

    def submit(self, inp, sink):
        given = inp.sampling_params  # a GenerateInput's, as the client's body had it
        params = given if isinstance(given, dict) else (given or [{}])[0]
        self.submitted.append(params)
        regex = params.get("regex")
        if regex == "bad":
            raise InvalidRequest("regex", "regex 'bad' is not a valid regular expression")
        if regex == "boom":
            raise RuntimeError("grammar worker crashed")
        rid = inp.rid[0]
        if regex == "hang":  # one token, then nothing until aborted
            self.hanging[rid] = sink
            sink(output(rid, "a", [1], 0, None))
        elif regex == "slow":
            message = "grammar compile timed out after 10 s"
            reason = FinishReason.abort(message, InvalidRequest("regex", message))
            sink(output(rid, "", [], 0, reason))
        elif regex == "invalid":  # finished, but failed the constraint's final check
            final = output(rid, "ab", [1, 2], 0, FinishReason.stop(2))
            violation = {"budget_closed": False, "constraint_violation": "'ab' does not match"}
            sink(dataclasses.replace(final, constraint=violation))
        else:
            sink(output(rid, "a", [1], 0, None))
            sink(output(rid, "b", [2], 1, FinishReason.length_reached(2)))
        return Submission((rid,), ((rid,),), batched=True)

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        sink = self.hanging.pop(rid, None)
        if sink is not None:
            sink(output(rid, "", [], 1, FinishReason.abort("aborted by request")))

    def flush_cache(self) -> bool:
        return True

    def get_server_info(self) -> dict:
        return {
            "num_running_reqs": 0,
            "num_waiting_reqs": 0,
            "cache_hit_rate": 0.0,
            "pool_used_tokens": 0,
            "pool_free_tokens": 128,
            "cached_tokens": 0,
        }


class ReplyEngine:
    """The engine API a route uses, answering each request with the next of `replies` (two
    tokens a streamed output). It checks the reply against the constraint it was given (regex
    or JSON Schema), records each request's prompt ids and params, and counts cached tokens as
    a radix cache would: the longest prefix shared with an earlier prompt and its answer. So a
    route's own work (prompts, constraints, items, events, errors) is tested with a real
    tokenizer and no model.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.config = EngineConfig(served_model_name="fake", device="cpu")
        self.model_folder = "/models/fake"
        self.context_length = 2048
        self.tokenizer = tokenizer
        self.replies: list[str] = []
        self.requests: list[dict[str, Any]] = []  # each submission's prompt ids and params
        self.seen: list[list[int]] = []  # prompt + answer ids of every request so far

    def max_new_tokens_room(self, prompt_len: int) -> int:
        return self.context_length - prompt_len

    def submit(self, inp: Any, sink: Callable[[ReqOutput], None]) -> Submission:
        ids, params, rid = inp.input_ids[0], inp.sampling_params, inp.rid[0]
        if len(ids) + params["max_new_tokens"] > self.context_length:
            raise InvalidRequest(
                "max_new_tokens", "the prompt and max_new_tokens exceed the context"
            )
        self.requests.append({"ids": ids, "params": params})
        text = self.replies.pop(0)
        if "regex" in params:
            assert re.fullmatch(params["regex"], text), (params["regex"], text)
        if "json_schema" in params:
            jsonschema.validate(json.loads(text), json.loads(params["json_schema"]))
        out = self.tokenizer.encode(text, add_special_tokens=False)
        reason = FinishReason.stop(self.tokenizer.eos_token_id)
        if len(out) > params["max_new_tokens"]:
            out = out[: params["max_new_tokens"]]
            reason = FinishReason.length_reached(params["max_new_tokens"])
        cached = max((_shared(ids, seq) for seq in self.seen), default=0)
        self.seen.append(ids + out)
        sent = ""
        for k in range(0, max(len(out), 1), 2):
            now = self.tokenizer.decode(out[: k + 2])
            last = k + 2 >= len(out)
            sink(
                ReqOutput(
                    rid=rid,
                    text=now[len(sent) :],
                    output_ids=tuple(out[k : k + 2]),
                    ids_start=k,
                    prompt_tokens=len(ids),
                    completion_tokens=min(k + 2, len(out)),
                    cached_tokens=cached,
                    forced_tokens=0,
                    e2e_latency=0.01,
                    finish_reason=reason if last else None,
                )
            )
            sent = now
        return Submission((rid,), ((rid,),), batched=True)

    def abort(self, rid: str) -> None:
        pass

    def prompt(self, i: int = -1) -> str:
        return self.tokenizer.decode(self.requests[i]["ids"])


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
