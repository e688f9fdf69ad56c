"""Chat-template derivation and select's token boundary with a tiny BPE tokenizer built in the
test (ChatML template with a default system prompt, as SmolLM2's), and EngineBackend on the
real engine over a fake runner: what it sends, and scores equal to the runner's logprobs."""

from __future__ import annotations

import pytest
import torch

import sgl_lite as sgl
from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.engine import Engine
from sgl_lite.frontend.backends.engine import EngineBackend
from sgl_lite.frontend.chat_template import from_tokenizer
from sgl_lite.frontend.choices import choice_tokens
from tests.support.fakes import FakeRunner, SlowRunner, hashed_next
from tests.support.tiny import TINY_SYSTEM_PROMPT


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer


class Recorded:
    """The real engine, recording each generate call's arguments (what EngineBackend sent)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, prompt=None, sampling_params=None, input_ids=None, **kwargs):
        self.calls.append(
            {
                "prompt": prompt,
                "input_ids": input_ids,
                "params": sampling_params,
                "return_logprob": kwargs.get("return_logprob", False),
                "start": kwargs.get("logprob_start_len", -1),
            }
        )
        return self.engine.generate(prompt, sampling_params, input_ids, **kwargs)


@pytest.fixture(scope="module")
def runner(tok):
    """A fake runner whose predictions are the tiny tokenizer's single-letter tokens, so what
    it generates decodes (and streams) as plain text."""
    letters = [tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
    return FakeRunner(
        num_slots=4096,
        vocab_size=len(tok),
        next_token=lambda seq: letters[hashed_next(seq) - ord("a")],
    )


@pytest.fixture(scope="module")
def real_engine(tok, runner):
    """The real engine over a fake runner, with the tiny tokenizer (no model files)."""
    with Engine(EngineConfig(device="cpu"), runner=runner, tokenizer=tok) as engine:
        yield engine


@pytest.fixture
def recorded(real_engine):
    real_engine.flush_cache()
    return Recorded(real_engine)


def fake_logprob(runner: FakeRunner, ids: list[int], position: int) -> float:
    """The fake runner's log-probability of ids[position] after ids[:position]."""
    return torch.log_softmax(runner.logits(ids[:position]), -1)[ids[position]].item()


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


def test_program_prompt_matches_apply_chat_template(tok, recorded):
    backend = EngineBackend(engine=recorded)
    state = backend_run(
        backend,
        sgl.user("What is the capital of France?"),
        sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0)),
    )
    (call,) = recorded.calls
    assert call["prompt"] == tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert call["params"]["stop"] == ["<|im_end|>"]
    assert state["answer"] == recorded.engine.generate(call["prompt"], call["params"])["text"]


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


def test_select_prefills_once_then_scores_all_choices_in_one_call(tok, recorded, runner):
    engine = recorded
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
        values = [fake_logprob(runner, ct.ids, t) for t in range(ct.start, len(ct.ids))]
        expected.append(sum(values) / len(values))
    assert decision.meta_info["scores"] == pytest.approx(expected, abs=1e-5)
    assert decision.decision == choices[max(range(3), key=expected.__getitem__)]


def test_unconditional_select_makes_one_more_call_without_the_prefix(recorded):
    engine = recorded
    backend = EngineBackend(engine=engine)
    d = backend.select(
        sgl.frontend.backends.Prompt(text="Pick: "),
        ["red", "blue"],
        sgl.unconditional_likelihood_normalized,
    )
    assert len(engine.calls) == 3 and len(engine.calls[2]["input_ids"]) == 2
    assert d.decision in ("red", "blue") and "unconditional_token_logprobs" in d.meta_info


def test_engine_abort_and_streaming(tok, real_engine):
    # a forward pass of 0.1 s against a 0.2 s request timeout: the engine aborts the request
    slow = SlowRunner(0.1, num_slots=512, vocab_size=len(tok))
    with Engine(EngineConfig(device="cpu", request_timeout=0.2), runner=slow, tokenizer=tok) as eng:
        state = backend_run(EngineBackend(engine=eng), "x", sgl.gen("a", max_tokens=50))
        with pytest.raises(sgl.ProgramError, match="timed out"):
            state["a"]

    @sgl.function
    def prog(s):
        s += "Say:" + sgl.gen("a", max_tokens=6, temperature=0)

    state = prog.run(backend=EngineBackend(engine=real_engine), stream=True)
    pieces = list(state.text_iter("a"))
    full = real_engine.generate("Say:", {"max_new_tokens": 6, "temperature": 0})["text"]
    assert len(pieces) > 1 and "".join(pieces) == full == state["a"]
