"""The offline multiple-choice task `bench.lm_eval_bench` runs lm-eval over: items built
deterministically from the texts we ship (bench/workload_texts.py), written as a JSONL and a
task YAML into a folder that lm-eval reads through `--include_path`. Nothing is fetched.

Each item is a long shared passage (a few-shot quiz, the support policy, a page of sentences, the
product list) followed by one question and four options, so lm-eval sends what multiple-choice
evaluation sends: the same long context with four short continuations, and the same passage
again for every other question about it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from bench.workload_texts import (
    FEW_SHOT_HEADER,
    PRODUCTS,
    QUESTIONS,
    RAW_SENTENCES,
    SHOTS,
    SUPPORT_POLICY,
)

TASK = "sgl_lite_mc_bench"
SEED = 38  # the options' order and the arithmetic questions (issue 38)

TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _few_shot_passage() -> str:
    """The five worked quiz examples, as a few-shot prompt's header."""
    parts = [FEW_SHOT_HEADER]
    for question, options, answer, why in SHOTS:
        letters = "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options))
        parts.append(f"Question: {question}\n{letters}\nAnswer: {answer}\n{why}\n\n")
    return "".join(parts).rstrip()


def passages() -> list[str]:
    """The shared contexts, a few hundred tokens each."""
    return [
        _few_shot_passage(),
        "Read the following store policy.\n\n" + SUPPORT_POLICY,
        "Read the following sentences.\n\n" + "\n".join(RAW_SENTENCES),
        "Read the following product descriptions.\n\n" + "\n".join(PRODUCTS),
    ]


def _arithmetic(rng: random.Random) -> tuple[str, str, list[str]]:
    """A sum with its answer and three near misses."""
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    total = a + b
    wrong = rng.sample([total + d for d in (-10, -2, -1, 1, 2, 10) if total + d > 0], 3)
    return f"What is {a} plus {b}?", str(total), [str(w) for w in wrong]


def questions(n: int, rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """`n` questions: the general-knowledge ones first, then generated sums."""
    out = list(QUESTIONS[:n])
    while len(out) < n:
        out.append(_arithmetic(rng))
    return out


def build_items(n: int) -> list[dict[str, Any]]:
    """`n` items, round-robin over the passages: each a prompt (`query`), four `choices` and
    the index of the right one (`gold`). The same `n` always gives the same items."""
    if n < 1:
        raise ValueError(f"items must be at least 1, got {n}")
    rng = random.Random(SEED)
    texts = passages()
    per_passage = -(-n // len(texts))
    asked = questions(per_passage, rng)
    items = []
    for i in range(n):
        passage, (question, right, wrong) = texts[i % len(texts)], asked[i // len(texts)]
        options = [right, *wrong]
        rng.shuffle(options)
        query = f"{passage}\n\nQuestion: {question}\nAnswer:"
        items.append({"query": query, "choices": options, "gold": options.index(right)})
    return items


def write_task(folder: Path, n: int) -> str:
    """Writes `n` items and the task YAML into `folder` (lm-eval's include_path); returns the
    task's name."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in build_items(n)))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))
    return TASK
