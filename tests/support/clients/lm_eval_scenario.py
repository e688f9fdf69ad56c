"""lm-evaluation-harness against our server, run by .venv-clients' python (tests/e2e/
test_clients_lm_eval.py): `python lm_eval_scenario.py URL WORKDIR` writes an offline
multiple-choice task and a generate_until task (JSONL + task YAML under WORKDIR), evaluates
both with `lm_eval.simple_evaluate(model="local-completions", ...)`, which finds our tokenizer
through GET /tokenizer_info and POST /tokenize (its "remote" backend), and prints one JSON line:
what lm-eval computed, per item, for the test to check against the server's own logprobs.

Nothing is fetched: the datasets' `json` builder reads the JSONL, and the hub is offline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

MC_ITEMS = [
    {"question": "The capital of France is", "choices": ["Paris", "Tokyo", "Lima"], "gold": 0},
    {"question": "Two plus two equals", "choices": ["four", "nine", "blue"], "gold": 0},
    {"question": "The opposite of hot is", "choices": ["cold", "table", "seven"], "gold": 0},
    {"question": "A cat says", "choices": ["woof", "meow", "moo"], "gold": 1},
    {"question": "The sky on a clear day is", "choices": ["green", "loud", "blue"], "gold": 2},
]
GEN_ITEMS = [
    {"question": "The capital of France is", "answer": "Paris"},
    {"question": "The largest planet in the solar system is", "answer": "Jupiter"},
]

MC_YAML = """task: sgl_lite_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

GEN_YAML = """task: sgl_lite_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}?\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
"""


def write_tasks(workdir: Path) -> None:
    """The two tasks' data and YAML, in `workdir` (lm-eval's include_path)."""
    for name, items, yaml in (("mc", MC_ITEMS, MC_YAML), ("gen", GEN_ITEMS, GEN_YAML)):
        data = workdir / f"{name}.jsonl"
        data.write_text("".join(json.dumps(item) + "\n" for item in items))
        (workdir / f"sgl_lite_{name}.yaml").write_text(yaml.format(data=data))


def evaluate(lm: Any, tasks: list[str], workdir: Path, chat: bool = False) -> dict[str, Any]:
    """`tasks` evaluated with `lm` through lm-eval's Python API: what it computed, per item."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        # only our two tasks: indexing lm-eval's ~13,000 built-in task YAMLs takes seconds
        task_manager=TaskManager(include_path=str(workdir), include_defaults=False),
        log_samples=True,
        apply_chat_template=chat,
        num_fewshot=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    assert results is not None
    out: dict[str, Any] = {}
    if "sgl_lite_mc" in tasks:
        mc = sorted(results["samples"]["sgl_lite_mc"], key=lambda s: s["doc_id"])
        out["mc"] = {
            "acc": results["results"]["sgl_lite_mc"]["acc,none"],
            "items": [
                {
                    "context": s["arguments"][0][0],
                    "continuations": [a[1] for a in s["arguments"]],
                    "loglikelihoods": [r[0][0] for r in s["resps"]],
                    "is_greedy": [r[0][1] for r in s["resps"]],
                    "target": s["target"],
                    "acc": s["acc"],
                }
                for s in mc
            ],
        }
    if "sgl_lite_gen" in tasks:
        gen = sorted(results["samples"]["sgl_lite_gen"], key=lambda s: s["doc_id"])
        out["gen"] = {
            "exact_match": results["results"]["sgl_lite_gen"]["exact_match,strip"],
            "items": [
                {
                    "prompt": s["arguments"][0][0],
                    "response": s["resps"][0][0],
                    "filtered": s["filtered_resps"][0],
                    "target": s["target"],
                    "exact_match": s["exact_match"],
                }
                for s in gen
            ],
        }
    return out


def main(url: str, workdir: Path) -> None:
    """Evaluates the tasks against `url` with three of lm-eval's API models and prints the
    summary line."""
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI
    from lm_eval.models.sglang_generate_API import SGLANGGENERATEAPI

    write_tasks(workdir)
    common = {"model": "default", "num_concurrent": 1, "max_retries": 1, "timeout": 120}
    # tokenizer_backend="auto": lm-eval probes /tokenizer_info and /tokenize itself
    completions = LocalCompletionsAPI(
        base_url=f"{url}/v1/completions",
        tokenizer_backend="auto",
        batch_size=16,  # all 15 loglikelihood prompts in one /v1/completions request
        max_length=512,
        **common,
    )
    # NOTE: lm-eval's RemoteTokenizer finds the server by stripping "/v1/completions" from
    # base_url, so it cannot start from /generate: built on the /v1 URL, then pointed at
    # /generate (the requests go to base_url)
    native = SGLANGGENERATEAPI(
        base_url=f"{url}/v1/completions",
        tokenizer_backend="remote",
        batch_size=16,
        max_length=512,
        **common,
    )
    native.base_url = f"{url}/generate"
    chat = LocalChatCompletion(base_url=f"{url}/v1/chat/completions", **common)
    summary: dict[str, Any] = {
        "__version__": version("lm-eval"),
        "tokenizer_backend": completions.tokenizer_backend,
        "seconds": {},
    }
    runs = [
        ("local-completions", completions, ["sgl_lite_mc", "sgl_lite_gen"], False),
        ("sglang-generate", native, ["sgl_lite_mc", "sgl_lite_gen"], False),
        ("local-chat-completions", chat, ["sgl_lite_gen"], True),
    ]
    for name, lm, tasks, as_chat in runs:
        start = time.monotonic()
        summary[name] = evaluate(lm, tasks, workdir, chat=as_chat)
        summary["seconds"][name] = round(time.monotonic() - start, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
