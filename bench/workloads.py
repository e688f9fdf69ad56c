"""The five workloads of BENCHMARKS.md as fixed, deterministic inputs (no network, no model).

This module holds only text and the size knobs; turning text into token ids is `bench.common`'s
job, and running it is the systems' job. `build(quick=...)` returns one `Workloads`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.workload_texts import (
    CONVERSATIONS,
    FEW_SHOT_HEADER,
    JSON_SCHEMA,
    JSON_SYSTEM,
    PRODUCTS,
    QUESTIONS,
    RAW_SENTENCES,
    SHOTS,
    SUPPORT_POLICY,
)

SEED = 0


@dataclass(frozen=True, kw_only=True)
class Workloads:
    """Every workload's inputs and sizes; `quick` ones are cut-down copies of the full ones."""

    quick: bool
    # W1
    system_prompt: str
    conversations: list[list[str]]
    chat_max_new_tokens: int
    # W2
    few_shot_prefix: str
    questions: list[tuple[str, list[str], str]]  # (prompt suffix, options, correct option)
    # W3
    json_schema: dict
    json_system: str
    products: list[str]
    json_max_new_tokens: int
    # W4
    decode_prompt: str
    decode_prompts: list[str]
    decode_new_tokens_b1: int
    decode_new_tokens_batch: int

    def question_prompt(self, index: int) -> str:
        """The full W2 prompt for question `index` (shared prefix + question, ends at 'Answer:')."""
        return self.few_shot_prefix + self.questions[index][0]


def _format_question(question: str, options: list[str]) -> str:
    return f"Question: {question}\nOptions: {'; '.join(options)}\nAnswer:"


def few_shot_prefix() -> str:
    """The shared ~400-token 5-shot prefix of W2."""
    shots = [
        f"{_format_question(q, opts)} {ans}\nExplanation: {why}\n\n" for q, opts, ans, why in SHOTS
    ]
    return FEW_SHOT_HEADER + "".join(shots)


def multiple_choice(rng: random.Random) -> list[tuple[str, list[str], str]]:
    """The 24 W2 questions as (formatted question, shuffled options, correct option)."""
    out = []
    for question, right, wrong in QUESTIONS:
        options = [right, *wrong]
        rng.shuffle(options)
        out.append((_format_question(question, options), options, right))
    return out


def raw_prompts(rng: random.Random, count: int, sentences: int = 6) -> list[str]:
    """`count` different plain-text prompts of ~100 tokens, each a distinct sentence sample."""
    prompts = []
    for _ in range(count):
        picked = rng.sample(RAW_SENTENCES, sentences)
        prompts.append(" ".join(picked) + " Continue the story in the same style:")
    return prompts


def build(
    quick: bool = False,
    conversations: int | None = None,
    turns: int | None = None,
    questions: int | None = None,
    json_items: int | None = None,
    json_max_new_tokens: int | None = None,
    decode_batch: int | None = None,
) -> Workloads:
    """The workloads; `quick` shrinks them (1 conversation x 2 turns, 2 questions, 2 JSON
    items, 8 new tokens); explicit counts override either size (`json_max_new_tokens`: W3T's
    tight budget, or a smaller W3 for the smoke test; `decode_batch`: W4's batch)."""
    rng = random.Random(SEED)
    mcq = multiple_choice(rng)
    prompts = raw_prompts(rng, 16)
    n_conv = conversations or (1 if quick else len(CONVERSATIONS))
    n_turns = turns or (2 if quick else 4)
    n_q = questions or (2 if quick else len(mcq))
    n_json = json_items or (2 if quick else len(PRODUCTS))
    n_decode = decode_batch or (4 if quick else len(prompts))
    return Workloads(
        quick=quick,
        system_prompt=SUPPORT_POLICY,
        conversations=[c[:n_turns] for c in CONVERSATIONS[:n_conv]],
        chat_max_new_tokens=8 if quick else 24,
        few_shot_prefix=few_shot_prefix(),
        questions=mcq[:n_q],
        json_schema=JSON_SCHEMA,
        json_system=JSON_SYSTEM,
        products=PRODUCTS[:n_json],
        json_max_new_tokens=json_max_new_tokens or 64,
        decode_prompt=prompts[0],
        decode_prompts=prompts[:n_decode],
        decode_new_tokens_b1=8 if quick else 128,
        decode_new_tokens_batch=8 if quick else 64,
    )
