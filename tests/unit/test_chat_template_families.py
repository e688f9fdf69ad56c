"""The DSL's roles, derived from each family's real chat template, render exactly as
`apply_chat_template` does: single and multi-turn, with and without a system message, the
default system prompt inserted like the template, and Qwen3's `enable_thinking` switch."""

from __future__ import annotations

import copy

import pytest

from sgl_lite.frontend.chat_template import ChatTemplate, from_tokenizer
from sgl_lite.frontend.transcript import Transcript
from tests.support.chat_templates import FAMILIES, Family
from tests.support.tiny import build_tiny_tokenizer

SYSTEM = "You answer in one word."
CONVERSATIONS = {
    "system+user": [("system", SYSTEM), ("user", "What is the capital of France?")],
    "user": [("user", "What is the capital of France?")],
    "multi-turn": [
        ("system", SYSTEM),
        ("user", "Best pet?"),
        ("assistant", "A cat."),
        ("user", "And the second best?"),
    ],
    "multi-turn, no system": [
        ("user", "Best pet?"),
        ("assistant", "A cat."),
        ("user", "Say: hello"),
    ],
}


@pytest.fixture(scope="module")
def base_tokenizer():
    return build_tiny_tokenizer()


def family_tokenizer(base, family: Family):
    """The tiny tokenizer with this family's template, special tokens, BOS and EOS."""
    tokenizer = copy.deepcopy(base)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tokenizer.bos_token, tokenizer.eos_token = family.bos, family.eos
    tokenizer.chat_template = family.template
    return tokenizer


def dsl_text(template: ChatTemplate, turns: list[tuple[str, str]]) -> str:
    """What a program `s += system(..); s += user(..); ...; s += assistant(gen())` has sent
    when gen() starts: the Transcript the interpreter and the tracer both build."""
    transcript = Transcript(template)
    for role, content in turns:
        transcript.role_begin(role)
        transcript.fill(content)
        transcript.role_end(role)
    transcript.role_begin("assistant")
    return transcript.text


def reference(tokenizer, family: Family, turns: list[tuple[str, str]], **kwargs) -> str:
    messages = [{"role": r, "content": c} for r, c in turns]
    rejects_system = "System role not supported" in family.template
    if rejects_system and messages[0]["role"] == "system":
        # the template rejects a system message; the DSL folds it into the first user turn
        # as Gemma 3 does, so that is the reference
        system = messages.pop(0)["content"]
        messages[0] = {"role": "user", "content": system + "\n\n" + messages[0]["content"]}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )


CASES = [
    (family, conversation)
    for family in FAMILIES
    for conversation in CONVERSATIONS
    # Mistral Nemo writes the system text into the LAST user turn, which a program that
    # writes text as it goes cannot know; single-turn and system-less conversations match.
    if not (FAMILIES[family].system_in_last_user_turn and conversation == "multi-turn")
]


@pytest.mark.parametrize(("family", "conversation"), CASES)
def test_dsl_roles_render_as_the_familys_template(base_tokenizer, family, conversation):
    spec = FAMILIES[family]
    tokenizer = family_tokenizer(base_tokenizer, spec)
    template = from_tokenizer(tokenizer)
    assert template.name != "default", "fell back to the default template"
    turns = CONVERSATIONS[conversation]
    expected = reference(tokenizer, spec, turns)
    assert dsl_text(template, turns) == expected
    assert template.render([{"role": r, "content": c} for r, c in turns], True) == expected


@pytest.mark.parametrize("family", list(FAMILIES))
def test_assistant_stops_at_the_familys_end_of_turn(base_tokenizer, family):
    spec = FAMILIES[family]
    template = from_tokenizer(family_tokenizer(base_tokenizer, spec))
    suffix = template.get_prefix_and_suffix("assistant")[1]
    assert suffix.strip() in template.stop_str and spec.eos in template.stop_str


def test_families_without_a_system_turn_fold_it_into_the_first_user_turn(base_tokenizer):
    for family in ("gemma-2", "gemma-3"):
        template = from_tokenizer(family_tokenizer(base_tokenizer, FAMILIES[family]))
        text = dsl_text(template, [("system", "Be brief."), ("user", "Hi")])
        assert (
            text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        )


def test_llama3_inserts_its_system_block_even_without_a_system_message(base_tokenizer):
    template = from_tokenizer(family_tokenizer(base_tokenizer, FAMILIES["llama-3.2"]))
    assert template.default_system_prompt == ""  # an empty system block, not none at all
    text = dsl_text(template, [("user", "Hi")])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "Cutting Knowledge Date: December 2023\nToday Date: " in text


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_enable_thinking_reaches_the_generation_prompt(base_tokenizer, enable_thinking):
    spec = FAMILIES["qwen3"]
    tokenizer = family_tokenizer(base_tokenizer, spec)
    template = from_tokenizer(tokenizer, enable_thinking=enable_thinking)
    turns = CONVERSATIONS["system+user"]
    expected = reference(tokenizer, spec, turns, enable_thinking=enable_thinking)
    assert dsl_text(template, turns) == expected
    assert expected.endswith("<think>\n\n</think>\n\n") == (not enable_thinking)
