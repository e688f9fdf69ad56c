"""Shared helpers of the benchmark: token ids of every workload, timing, JSON checking.

Every system gets the same token ids from these functions (one tokenizer, one chat template),
so any difference between systems comes from how they compute, never from what they were given.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jsonschema

from bench.workloads import Workloads
from sgl_lite.common import common_prefix_len


class Skipped(Exception):
    """A system cannot run a workload here (a missing package, an unfinished feature)."""


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def on_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on a thread that ends with it, its result or exception handed back.

    Every in-process system (the HF baselines, the engine wrappers) runs its calls this way, so
    no OpenMP team outlives a call: a thread's team lives as long as the thread, and two teams
    put libgomp's workers to sleep between kernels, slowing whichever system runs next
    (sgl_lite/backend/omp_threads.py). Each system is then timed as if alone in its process.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="bench-call")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def strip_eos(ids: Sequence[int], eos: set[int]) -> list[int]:
    """Output ids without a trailing end-of-sequence token (systems differ on including it)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in eos else ids


def eos_ids(tokenizer: Any, hf_config: Any = None) -> set[int]:
    ids = getattr(hf_config, "eos_token_id", None) if hf_config is not None else None
    out = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        out.add(tokenizer.eos_token_id)
    return out


# --- W1 ----------------------------------------------------------------------------------------
def chat_ids(
    tokenizer: Any, system: str, users: Sequence[str], answers: Sequence[str]
) -> list[int]:
    """The chat template over system + alternating user/answer turns, ending at the assistant."""
    messages = [{"role": "system", "content": system}]
    for i, user in enumerate(users):
        messages.append({"role": "user", "content": user})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def answer_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The answer as it goes back into the history (same decode for every system)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()


class ChatRun:
    """One system's W1 run, turn by turn: each conversation's prompts and answers so far.

    `prompt(c)` builds conversation c's next prompt from this system's own previous answers.
    """

    def __init__(self, tokenizer: Any, wl: Workloads) -> None:
        self.tokenizer, self.wl = tokenizer, wl
        n = len(wl.conversations)
        self.prompts: list[list[list[int]]] = [[] for _ in range(n)]
        self.answers: list[list[list[int]]] = [[] for _ in range(n)]
        self.ttft: list[float] = []

    @property
    def num_turns(self) -> int:
        return len(self.wl.conversations[0])

    def prompt(self, conv: int) -> list[int]:
        turn = len(self.answers[conv])
        texts = [answer_text(self.tokenizer, a) for a in self.answers[conv]]
        ids = chat_ids(
            self.tokenizer, self.wl.system_prompt, self.wl.conversations[conv][: turn + 1], texts
        )
        self.prompts[conv].append(ids)
        return ids

    def record(self, conv: int, output_ids: Sequence[int], ttft: float) -> None:
        self.answers[conv].append(list(output_ids))
        self.ttft.append(ttft)

    def submitted_tokens(self) -> int:
        return sum(len(p) for conv in self.prompts for p in conv)

    def figures(
        self, wall: float, computed: int | None = None, submitted: int | None = None
    ) -> dict[str, Any]:
        """W1's figures for one repetition; cache figures when `computed` prompt tokens is known.

        `submitted` defaults to the prompts' token count; an engine may report its own.
        """
        submitted = self.submitted_tokens() if submitted is None else submitted
        out: dict[str, Any] = {
            "wall_s": wall,
            "ttft_mean_s": sum(self.ttft) / len(self.ttft),
            "prompt_tokens_submitted": submitted,
        }
        if computed is not None:
            out["prompt_tokens_computed"] = computed
            out["cache_hit_rate"] = 1 - computed / max(submitted, 1)
        out["_run"] = self
        return out


def json_figures(wall: float, texts: list[str], schema: dict) -> dict[str, Any]:
    """W3's figures for one repetition: wall time and how many outputs validate."""
    valid = sum(validate_json(t, schema) for t in texts)
    return {
        "wall_s": wall,
        "valid": valid,
        "items": len(texts),
        "valid_fraction": valid / len(texts),
        "texts": texts,
    }


# --- W2 ----------------------------------------------------------------------------------------
class ChoiceIds(NamedTuple):
    """`ids` = prompt+choice tokens; the choice is scored on ids[start:]."""

    ids: list[int]
    start: int


class SelectItem(NamedTuple):
    prompt_ids: list[int]
    choices: list[ChoiceIds]
    options: list[str]
    answer: int  # index of the correct option


def select_items(tokenizer: Any, wl: Workloads) -> tuple[int, list[SelectItem]]:
    """(shared prefix length, the W2 items). A choice whose first token merges with the prompt's
    last one is scored from the first token where the joint tokenization departs."""
    items = []
    for i, (_, options, right) in enumerate(wl.questions):
        text = wl.question_prompt(i)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        choices = []
        for option in options:
            ids = tokenizer.encode(text + " " + option, add_special_tokens=False)
            start = min(common_prefix_len(prompt_ids, ids), len(ids) - 1)
            choices.append(ChoiceIds(ids, start))
        items.append(SelectItem(prompt_ids, choices, list(options), options.index(right)))
    prefix_ids = tokenizer.encode(wl.few_shot_prefix, add_special_tokens=False)
    shared = min(common_prefix_len(prefix_ids, it.prompt_ids) for it in items)
    shared = min([shared] + [c.start for it in items for c in it.choices])
    return shared, items


def decide(scores: Sequence[Sequence[float]]) -> tuple[int, list[float]]:
    """Token-length-normalized select: (index of the best choice, mean logprob per choice)."""
    means = [sum(s) / len(s) for s in scores]
    return max(range(len(means)), key=means.__getitem__), means


# --- W3 ----------------------------------------------------------------------------------------
def json_prompt_ids(tokenizer: Any, wl: Workloads, product: str) -> list[int]:
    messages = [{"role": "system", "content": wl.json_system}, {"role": "user", "content": product}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def validate_json(text: str, schema: dict) -> bool:
    """Whether `text` (whole, or its first {...} span) parses and validates against `schema`."""
    candidates = [text.strip()]
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1])
    for candidate in candidates:
        try:
            jsonschema.validate(json.loads(candidate), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            continue
    return False


# --- W4 ----------------------------------------------------------------------------------------
def raw_ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@contextlib.contextmanager
def without_variables(variables: dict[str, str]) -> Iterator[None]:
    """Within the block, `os.environ` lacks those of `variables` that still hold the value given
    (a child started here inherits the rest); restored after."""
    removed = {k: os.environ.pop(k) for k, v in variables.items() if os.environ.get(k) == v}
    try:
        yield
    finally:
        os.environ.update(removed)
