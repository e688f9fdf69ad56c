"""Chat-template derivation and select's token boundary with a tiny BPE tokenizer built in the
test (ChatML template with a default system prompt, as SmolLM2's), and EngineBackend against a
fake engine that follows the Engine API."""

from __future__ import annotations

import pytest

import sgl_lite as sgl
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.chat_template import from_tokenizer
from sgl_lite.frontend.choices import choice_tokens
from tests.conftest import TINY_SYSTEM_PROMPT


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer


class FakeEngine:
    """Engine.generate's contract: text or ids (single or batch), logprobs from a start index."""

    def __init__(self, tokenizer, reply="Paris", abort=False):
        self.tokenizer, self.reply, self.abort = tokenizer, reply, abort
        self.calls = []

    @staticmethod
    def logprob(token_id):
        return -((token_id * 7919) % 101) / 10.0

    def generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        return_text_in_logprobs=False,
        stream=False,
        rid=None,
    ):
        self.calls.append(
            {
                "prompt": prompt,
                "input_ids": input_ids,
                "params": sampling_params,
                "return_logprob": return_logprob,
                "start": logprob_start_len,
            }
        )
        batched = isinstance(prompt, list) or (input_ids and isinstance(input_ids[0], list))
        items = (
            prompt
            if isinstance(prompt, list)
            else input_ids
            if batched
            else [prompt if prompt is not None else input_ids]
        )
        outs = [
            self._one(x, sampling_params or {}, return_logprob, logprob_start_len) for x in items
        ]
        if stream:
            text = outs[0]["text"]
            return iter(
                [{"text": text[:i], "meta_info": {}} for i in range(1, len(text))] + [outs[0]]
            )
        return outs if batched else outs[0]

    def _one(self, x, params, return_logprob, start):
        ids = self.tokenizer.encode(x, add_special_tokens=False) if isinstance(x, str) else x
        text = "" if params.get("max_new_tokens") == 0 else self.reply
        reason = (
            {"type": "abort", "message": "out of memory"}
            if self.abort
            else {"type": "stop", "matched": None}
        )
        meta = {
            "prompt_tokens": len(ids),
            "completion_tokens": 0,
            "cached_tokens": 0,
            "finish_reason": reason,
        }
        if return_logprob:
            s = max(start, 0)  # SGLang: the entry at logprob_start_len has a None logprob
            meta["input_token_logprobs"] = [
                [None if i == s else self.logprob(ids[i]), ids[i], None] for i in range(s, len(ids))
            ]
        return {"text": text, "output_ids": [], "meta_info": meta}


def test_roles_are_derived_from_the_tokenizers_template(tok):
    t = from_tokenizer(tok)
    assert t.get_prefix_and_suffix("user") == ("<|im_start|>user\n", "<|im_end|>\n")
    assert t.default_system_prompt == TINY_SYSTEM_PROMPT
    assert "<|im_end|>" in t.stop_str
    for msgs in (
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    ):
        for gen_prompt in (False, True):
            assert t.render(msgs, gen_prompt) == tok.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=gen_prompt
            )


def test_program_prompt_matches_apply_chat_template(tok):
    backend = EngineBackend(engine=FakeEngine(tok))
    state = backend_run(
        backend,
        sgl.user("What is the capital of France?"),
        sgl.assistant(sgl.gen("answer", max_tokens=8)),
    )
    assert state["answer"] == "Paris"
    sent = backend.engine.calls[0]["prompt"]
    assert sent == tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert backend.engine.calls[0]["params"]["stop"] == ["<|im_end|>"]


def backend_run(backend, *exprs, **kw):
    runtime = sgl.Runtime.__new__(sgl.Runtime)
    runtime.backend = backend
    return runtime.run(*exprs, **kw)


def test_choice_tokens_when_the_choice_merges_with_the_prefix(tok):
    prefix, choice = "The capital of France is ", "Paris"
    prefix_ids = tok.encode(prefix, add_special_tokens=False)
    ct = choice_tokens(tok, prefix, choice)
    assert ct.merged and ct.start < len(prefix_ids)  # " Paris" swallowed the prefix's space
    assert ct.ids[: ct.start] == prefix_ids[: ct.start]
    assert tok.decode(ct.ids[ct.start :]).endswith(choice)
    assert prefix.startswith(tok.decode(ct.ids[: ct.start]))


def test_choice_tokens_on_a_clean_boundary_score_only_the_choice(tok):
    prefix, choice = "The capital of France is", " Paris"
    prefix_ids = tok.encode(prefix, add_special_tokens=False)
    ct = choice_tokens(tok, prefix, choice)
    assert not ct.merged and ct.start == len(prefix_ids)
    assert tok.decode(ct.ids[ct.start :]) == choice


def test_select_prefills_once_then_scores_all_choices_in_one_call(tok):
    engine = FakeEngine(tok)
    backend = EngineBackend(engine=engine)
    prefix = "Q: Best pet?\nA: "
    choices = ["cat", "dog", "hamster"]
    decision = backend.select(
        sgl.frontend.backends.Prompt(text=prefix), choices, sgl.token_length_normalized
    )
    prefill, scoring = engine.calls
    assert prefill["params"] == {"max_new_tokens": 0} and not prefill["return_logprob"]
    assert len(scoring["input_ids"]) == 3 and scoring["return_logprob"]
    expected = []
    for c in choices:
        ct = choice_tokens(tok, prefix, c)
        assert scoring["start"] <= ct.start
        expected.append(sum(map(FakeEngine.logprob, ct.ids[ct.start :])) / (len(ct.ids) - ct.start))
    assert decision.meta_info["scores"] == pytest.approx(expected)
    assert decision.decision == choices[max(range(3), key=expected.__getitem__)]


def test_unconditional_select_makes_one_more_call_without_the_prefix(tok):
    engine = FakeEngine(tok)
    backend = EngineBackend(engine=engine)
    d = backend.select(
        sgl.frontend.backends.Prompt(text="Pick: "),
        ["red", "blue"],
        sgl.unconditional_likelihood_normalized,
    )
    assert len(engine.calls) == 3 and len(engine.calls[2]["input_ids"]) == 2
    assert d.decision in ("red", "blue") and "unconditional_token_logprobs" in d.meta_info


def test_engine_abort_and_streaming(tok):
    backend = EngineBackend(engine=FakeEngine(tok, abort=True))
    state = backend_run(backend, "x", sgl.gen("a"))
    with pytest.raises(sgl.ProgramError, match="out of memory"):
        state["a"]

    @sgl.function
    def prog(s):
        s += "Say:" + sgl.gen("a")

    state = prog.run(backend=EngineBackend(engine=FakeEngine(tok, reply="hello")), stream=True)
    assert list(state.text_iter("a")) == ["h", "e", "l", "l", "o"]
