"""SGLang 0.5 DSL parity on the mock backend: text_async_iter with meta data and streamed
logprob meta, as SGLang's stream sends it."""

from __future__ import annotations

import asyncio

import sgl_lite as sgl
from sgl_lite.frontend.backends.base import GenResult
from tests.support.mock_backend import MockBackend


def test_text_async_iter_with_meta_data_yields_chunk_meta_pairs():
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("x") + sgl.gen("y")

    backend = MockBackend(lambda text, req: "hello world" if text == "Q:" else "zz")

    async def consume():
        st = prog.run(backend=backend, stream=True)
        return [pair async for pair in st.text_async_iter("x", return_meta_data=True)], st

    pairs, state = asyncio.run(consume())
    assert all(isinstance(p, tuple) and len(p) == 2 for p in pairs) and len(pairs) > 1
    assert "".join(chunk for chunk, _ in pairs) == "hello world" == state["x"]
    assert pairs[-1][1] == state.get_meta_info("x")
    assert pairs[-1][1]["finish_reason"] == {"type": "stop"}

    async def plain():
        st = prog.run(backend=backend, stream=True)
        return [c async for c in st.text_async_iter("y")]

    assert "".join(asyncio.run(plain())) == "zz"


# --- select: SGLang's meta keys and choice methods ------------------------------------------


class LogprobStream(MockBackend):
    """Streams one character per token, with cumulative output logprobs as the engine does."""

    def generate_stream(self, prompt, request):
        text = self.reply(prompt.text, request)
        entries = [[-0.5, ord(c), None] for c in text]
        for i in range(1, len(text) + 1):
            meta = {"completion_tokens": i, "output_token_logprobs": entries[:i]}
            yield GenResult(text[:i], meta)
        yield GenResult(text, {**meta, "finish_reason": {"type": "stop"}})


def test_streamed_meta_carries_only_new_logprob_entries_as_sglangs_stream_does():
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("x", return_logprob=True)

    async def consume():
        st = prog.run(backend=LogprobStream(lambda text, req: "abcd"), stream=True)
        return [pair async for pair in st.text_async_iter("x", return_meta_data=True)], st

    pairs, state = asyncio.run(consume())
    assert "".join(c for c, _ in pairs) == "abcd"
    seen = 0
    for chunk, meta in pairs:  # the checks of SGLang's test_stream_logprobs
        assert chunk and meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - seen
        seen = meta["completion_tokens"]
    assert seen == 4 and pairs[-1][1]["finish_reason"] == {"type": "stop"}
    # the variable's own meta info stays cumulative
    assert len(state.get_meta_info("x")["output_token_logprobs"]) == 4
