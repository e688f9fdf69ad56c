"""The vLLM peer's test doubles: a byte-per-character tokenizer and a `VllmPeer` whose child
process is bench/vllm_worker.py over the stand-in `vllm` module in fake_vllm_worker.py."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.vllm_peer import VllmPeer

FAKE_WORKER = Path(__file__).with_name("fake_vllm_worker.py")


class CharTokenizer:
    """Token id = byte value; a chat template that just joins the turns."""

    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i >= 32).decode(errors="replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def fake_peer(mode: str = "ok") -> VllmPeer:
    """A peer on the stand-in worker; `mode` is its MODE (see fake_vllm_worker.py)."""
    return VllmPeer(1, CharTokenizer(), Path(mode), python=sys.executable, worker=FAKE_WORKER)
