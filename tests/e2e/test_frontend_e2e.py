"""The frontend language end to end on the shared SmolLM2 engine (`import sgl_lite as sgl`).

Every program runs greedy (temperature 0) with small max_tokens through `sgl.Runtime(engine=...)`
around the session's engine, so no test starts an engine of its own.
"""

from __future__ import annotations

import copy
import inspect
import json
import time

import pytest
import torch

import sgl_lite as sgl
from sgl_lite.common import common_prefix_len
from sgl_lite.frontend.chat_template import from_tokenizer

GREEDY = {"temperature": 0}


# Every test leaves the engine whole (tests/e2e/conftest.py).
pytestmark = pytest.mark.usefixtures("consistent_engine")


def assert_ok(states) -> None:
    errors = [f"{s.name}: {s.error()!r}" for s in states if s.error() is not None]
    assert not errors, f"{len(errors)}/{len(states)} programs failed: {errors[:3]}"


# --- the chat template is SmolLM2's own ---------------------------------------------------------
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_roles_are_derived_from_smollm2s_own_chat_template(smollm_tokenizer):
    t = from_tokenizer(smollm_tokenizer)
    assert t.get_prefix_and_suffix("user") == ("<|im_start|>user\n", "<|im_end|>\n")
    assert t.default_system_prompt == SMOL_SYSTEM and "<|im_end|>" in t.stop_str
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    for gen_prompt in (False, True):
        assert t.render(msgs, gen_prompt) == smollm_tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen_prompt
        )


# --- a multi-step pipeline reuses the first step's prompt and answer ------------------------
@sgl.function
def two_step(s, topic):
    s += sgl.system("You are a concise assistant.")
    s += sgl.user(f"Give one short fact about {topic}.")
    s += sgl.assistant(sgl.gen("fact", max_tokens=24))
    s += sgl.user("Now turn that fact into a quiz question.")
    s += sgl.assistant(sgl.gen("question", max_tokens=24))


def test_second_step_of_a_pipeline_hits_the_first_steps_prompt_and_answer(rt):
    state = two_step.run(topic="the Moon", backend=rt, **GREEDY)
    assert state.error() is None
    first, second = state.get_meta_info("fact"), state.get_meta_info("question")
    assert state["fact"].strip() and state["question"].strip()
    assert first["completion_tokens"] >= 4, first  # an answer long enough to matter below
    # The second prompt starts with the first prompt + its answer (+ the role suffix); the
    # radix cache must serve all of that but a few tokens (the last sampled token has no KV
    # yet, and the answer's text may retokenize differently at its edges).
    covered = first["prompt_tokens"] + first["completion_tokens"]
    assert second["cached_tokens"] >= covered - 3, (first, second)
    assert second["cached_tokens"] > first["prompt_tokens"]  # the answer itself was reused
    assert second["prompt_tokens"] > second["cached_tokens"]


# --- JSON extraction with a schema, batched ---------------------------------------------------
PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "price": {"type": "number"},
        "category": {"type": "string", "enum": ["electronics", "clothing", "kitchen", "toys"]},
    },
    "required": ["name", "price", "category"],
}
PRODUCTS = [
    "Wireless mouse with silent clicks, $24.99.",
    "Cotton crew-neck T-shirt in navy blue, only $12.",
    "Stainless steel chef's knife, 8 inch, $45.50.",
    "Wooden building blocks set for toddlers, $19.95.",
    "Noise-cancelling headphones, $199.",
    "Waterproof rain jacket with hood, $79.90.",
    "Non-stick frying pan, 28 cm, $32.",
    "Remote-control race car for kids, $39.99.",
    "USB-C charging cable, 2 meters, $9.49.",
    "Wool winter scarf, hand-knitted, $25.",
    "Electric kettle, 1.7 liters, $29.99.",
    "Plush teddy bear, 30 cm tall, $14.50.",
]


@sgl.function
def extract_product(s, text):
    s += sgl.system("You extract product data as JSON.")
    s += sgl.user(f"Extract the product's name, price and category: {text}")
    # NOTE: 64 tokens, not 32: a complete object with a long name needs ~30-40 tokens.
    s += sgl.assistant(sgl.gen("json", max_tokens=64, json_schema=PRODUCT_SCHEMA))


def test_json_extraction_with_a_schema_always_parses_and_validates(rt):
    import jsonschema

    states = extract_product.run_batch([{"text": t} for t in PRODUCTS], backend=rt, **GREEDY)
    assert_ok(states)
    bad = []
    for text, state in zip(PRODUCTS, states):
        try:
            jsonschema.validate(json.loads(state["json"]), PRODUCT_SCHEMA)
        except (ValueError, jsonschema.ValidationError) as exc:
            bad.append((text, state["json"], str(exc)[:120]))
    assert not bad, f"{len(bad)}/{len(PRODUCTS)} outputs are not valid: {bad[:3]}"


# --- select equals a brute-force scoring with transformers ------------------------------------
FEW_SHOT = (
    "Answer each question with one word.\n\n"
    "Q: What color is the sky on a clear day?\nA: blue\n\n"
    "Q: What animal barks?\nA: dog\n\n"
    "Q: How many days are in a week?\nA: seven\n\n"
    "Q: What is the capital of Italy?\nA: Rome\n\n"
    "Q: What do cows drink?\nA: water\n\n"
    "Q: Which planet do we live on?\nA: Earth\n\n"
    "Q: What is the opposite of up?\nA: down\n\n"
    "Q: What fruit is yellow and long?\nA: banana\n\n"
    "Q: What do we use to see?\nA: eyes\n\n"
)
QUIZ = [
    ("What is the largest planet in our solar system?", ["Jupiter", "Mars", "Venus", "Mercury"]),
    ("What animal says moo?", ["cow", "dog", "cat", "duck"]),
    ("What is frozen water called?", ["ice", "steam", "sand", "glass"]),
    ("Which season comes after winter?", ["spring", "summer", "autumn", "night"]),
    ("What do bees make?", ["honey", "milk", "silk", "bread"]),
    ("What is the opposite of hot?", ["cold", "warm", "loud", "tall"]),
    ("How many legs does a spider have?", ["eight", "six", "four", "ten"]),
    ("What gas do plants absorb from the air?", ["carbon dioxide", "oxygen", "helium", "neon"]),
    ("What is the capital of Japan?", ["Tokyo", "Paris", "Rome", "Cairo"]),
    ("Which metal is liquid at room temperature?", ["mercury", "iron", "gold", "copper"]),
    ("What color is a ripe banana?", ["yellow", "blue", "purple", "black"]),
    ("What do you call a baby dog?", ["puppy", "kitten", "calf", "chick"]),
    ("Which organ pumps blood?", ["heart", "lung", "liver", "brain"]),
    ("At what Celsius temperature does water boil?", ["100", "50", "0", "212"]),
    ("Which instrument has 88 keys?", ["piano", "guitar", "violin", "drum"]),
    ("What language is spoken in Brazil?", ["Portuguese", "Spanish", "French", "English"]),
    ("What shape has three sides?", ["triangle", "square", "circle", "hexagon"]),
    ("Who wrote Romeo and Juliet?", ["Shakespeare", "Dickens", "Tolstoy", "Homer"]),
    ("What is the closest star to Earth?", ["the Sun", "Sirius", "Polaris", "Vega"]),
    ("Which ocean is the largest?", ["Pacific", "Atlantic", "Indian", "Arctic"]),
]
# The gold answer moves around; every choice starts with a space (as after "A:").
QUIZ = [(q, [" " + c for c in cs[i % 4 :] + cs[: i % 4]]) for i, (q, cs) in enumerate(QUIZ)]


@sgl.function
def quiz(s, question, choices):
    s += FEW_SHOT
    s += "Q: " + question + "\nA:"
    s += sgl.select("answer", choices=choices)


def _forward(model, ids: list[int], past=None):
    """(logprobs per position, KV cache) of `ids` after `past`; any transformers >= 4.46."""
    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    extra = {arg: past} if past is not None else {}
    out = model(input_ids=torch.tensor([ids]), use_cache=True, **extra)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    return torch.log_softmax(out.logits[0].float(), -1), cache


def hf_mean_choice_logprobs(
    model, tokenizer, prompt: str, choices: list[str], shared_past, shared_len: int
) -> list[float]:
    """Mean logprob of each choice's tokens after `prompt`, by transformers.

    The choice's tokens are those where tokenize(prompt + choice) departs from tokenize(prompt).
    Equivalent to a full forward over prompt + choice: the few-shot tokens every sequence
    starts with (`shared_past`, `shared_len`) and this question's common tokens are run once and
    their KV reused, which keeps the reference affordable on two CPU cores.
    """
    prefix_ids = tokenizer.encode(prompt, add_special_tokens=False)
    seqs = [tokenizer.encode(prompt + c, add_special_tokens=False) for c in choices]
    starts = [min(common_prefix_len(prefix_ids, ids), len(ids) - 1) for ids in seqs]
    common = min(common_prefix_len(seqs[0], ids) for ids in seqs)
    assert min(starts) > shared_len, "a choice merged into the few-shot prefix"
    rows: dict[int, torch.Tensor] = {shared_len - 1: shared_past[1]}  # position -> logprobs
    past = copy.deepcopy(shared_past[0])
    if common > shared_len:
        lps, past = _forward(model, seqs[0][shared_len:common], past)
        rows.update({shared_len + i: lps[i] for i in range(common - shared_len)})
    scores = []
    for ids, start in zip(seqs, starts):
        mine = dict(rows)
        if len(ids) > common + 1:  # the last token's own logits are never needed
            lps, _ = _forward(model, ids[common:-1], copy.deepcopy(past))
            mine.update({common + i: lps[i] for i in range(len(ids) - 1 - common)})
        values = [mine[t - 1][ids[t]].item() for t in range(start, len(ids))]
        scores.append(sum(values) / len(values))
    return scores


def test_select_equals_a_brute_force_scoring_with_transformers(rt, smollm_tokenizer, hf_smollm):
    states = quiz.run_batch([{"question": q, "choices": cs} for q, cs in QUIZ], backend=rt)
    assert_ok(states)
    prompts = []
    for state, (_, choices) in zip(states, QUIZ):
        assert state["answer"] in choices
        text = state.text()
        assert text.endswith(state["answer"])
        prompts.append(text[: len(text) - len(state["answer"])])  # exactly what select scored
    shared_ids = smollm_tokenizer.encode(prompts[0], add_special_tokens=False)
    for p in prompts[1:]:
        shared_ids = shared_ids[
            : common_prefix_len(shared_ids, smollm_tokenizer.encode(p, add_special_tokens=False))
        ]
    assert len(shared_ids) >= 100  # the few-shot prefix
    mismatches, worst = [], 0.0
    with torch.no_grad():
        lps, past = _forward(hf_smollm, shared_ids)
        shared = (past, lps[-1])
        for state, prompt, (question, choices) in zip(states, prompts, QUIZ):
            ref = hf_mean_choice_logprobs(
                hf_smollm, smollm_tokenizer, prompt, choices, shared, len(shared_ids)
            )
            meta = state.get_meta_info("answer")
            worst = max(worst, *(abs(a - b) for a, b in zip(meta["scores"], ref)))
            best = max(range(len(choices)), key=ref.__getitem__)
            ours = choices.index(state["answer"])
            # A different pick is only acceptable as a numerical tie.
            if ours != best and ref[best] - ref[ours] > 2e-3:
                mismatches.append((question, state["answer"], choices[best], ref))
        # The shortcut above equals a plain full forward (checked on the last question's pick).
        ids = smollm_tokenizer.encode(prompt + choices[best], add_special_tokens=False)
        start = common_prefix_len(smollm_tokenizer.encode(prompt, add_special_tokens=False), ids)
        full = torch.log_softmax(hf_smollm(torch.tensor([ids])).logits[0].float(), -1)
        values = [full[t - 1, ids[t]].item() for t in range(start, len(ids))]
        assert abs(sum(values) / len(values) - ref[best]) < 1e-4
    assert not mismatches, f"select disagrees with transformers on {mismatches}"
    assert worst < 1e-2, f"engine and transformers scores differ by up to {worst:.3g}"


# --- a batch reaches the engine as a batch ---------------------------------------------------
@sgl.function
def short_answer(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_run_batch_of_sixteen_runs_concurrently_in_the_engine(rt, engine):
    questions = [
        f"Say a word that rhymes with '{w}'."
        for w in (
            "cat",
            "dog",
            "sun",
            "tree",
            "cake",
            "light",
            "rain",
            "book",
            "star",
            "fish",
            "moon",
            "bell",
            "king",
            "road",
            "ship",
            "hand",
        )
    ]
    states = short_answer.run_batch([{"question": q} for q in questions], backend=rt, **GREEDY)
    assert_ok(states)
    assert all(isinstance(s["answer"], str) for s in states)
    assert engine.get_server_info()["max_running_batch_seen"] > 1


# --- streaming ------------------------------------------------------------------------------
def test_streamed_text_equals_the_non_streamed_text(rt):
    question = "Describe the ocean in two sentences."
    streamed = short_answer.run(
        question=question, stream=True, backend=rt, max_new_tokens=24, **GREEDY
    )
    chunks = list(streamed.text_iter("answer"))
    plain = short_answer.run(question=question, backend=rt, max_new_tokens=24, **GREEDY)
    assert streamed.error() is None and plain.error() is None
    assert len(chunks) > 1, chunks  # it really streamed
    assert "".join(chunks) == plain["answer"] == streamed["answer"]
    assert "".join(streamed.text_iter()) == streamed.text() == plain.text()
    # A stop string of several tokens: its first tokens must not leak into the stream.
    words = plain["answer"].split(" ")
    assert len(words) >= 6, plain["answer"]
    stop = " " + " ".join(words[3:5])
    cut = short_answer_until.run(question=question, stop_at=stop, stream=True, backend=rt, **GREEDY)
    chunks = list(cut.text_iter("answer"))
    expected = plain["answer"][: plain["answer"].find(stop)]
    assert cut["answer"] == expected and "".join(chunks) == expected, (chunks, stop)
    assert "".join(cut.text_iter()) == cut.text()


@sgl.function
def short_answer_until(s, question, stop_at):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=24, stop=stop_at))


# --- the seed's style: an anonymous program on a Runtime ---------------------------------------
def test_runtime_run_of_role_expressions_returns_the_answer(rt):
    answer = rt.run(
        sgl.system("You are a helpful assistant."),
        sgl.user("What is the capital of France?"),
        sgl.assistant(sgl.gen("answer", max_tokens=32)),
        **GREEDY,
    )["answer"]
    assert isinstance(answer, str) and answer.strip()


# --- fork: children continue from the cached parent prefix -----------------------------------
@sgl.function
def ideas(s, topic):
    s += sgl.system("You are a creative assistant.")
    s += sgl.user(f"Give me three different ideas for {topic}.")
    s += sgl.assistant_begin()
    s += "Here are three ideas."
    s["parent_text"] = s.text()
    forks = s.fork(3)
    forks += lambda i: f"\nIdea {i + 1}:" + sgl.gen("idea", max_tokens=12, stop="\n")
    forks.join()
    s += sgl.assistant_end()


def test_fork_children_continue_from_the_cached_parent_prefix(rt, smollm_tokenizer):
    state = ideas.run(topic="a rainy weekend", backend=rt, **GREEDY)
    assert state.error() is None
    parent_len = len(smollm_tokenizer.encode(state["parent_text"], add_special_tokens=False))
    metas = state.get_meta_info("idea")
    assert isinstance(state["idea"], list) and len(state["idea"]) == len(metas) == 3
    for meta in metas:
        assert meta["prompt_tokens"] > parent_len
        assert meta["cached_tokens"] >= parent_len - 1, (parent_len, meta)


# --- bad input ------------------------------------------------------------------------------
def test_unreachable_server_is_a_clear_error_quickly():
    began = time.monotonic()
    with pytest.raises(ConnectionError, match="127.0.0.1:9"):
        sgl.RuntimeEndpoint("http://127.0.0.1:9")
    assert time.monotonic() - began < 10
