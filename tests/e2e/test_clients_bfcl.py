"""BFCL, the Berkeley Function Calling Leaderboard (`bfcl-eval`, from .venv-bfcl), generates and
scores against our server with its own CLI, unmodified: `bfcl generate` with two of its
OpenAI-compatible FC model entries, one over chat completions and one over the Responses API,
on two items each of `simple_python`, `multiple`, `parallel` and `irrelevance`, then
`bfcl evaluate` on what they wrote.

BFCL's FC entries send `tools` with no `tool_choice` ("auto"), and SmolLM2-135M never calls a
tool when left to choose (0 of 25 `simple_python` and 0 of 25 `multiple` items measured, the
Hermes prompt, greedy): it answers in prose. So the checks are on the plumbing, which a broken
server fails, not on the model's skill: every request BFCL sent was served (no "Error during
inference" record, a string BFCL would score as a *correct* irrelevance answer), each recorded
answer is the server's own greedy answer to the request BFCL logged, every call (if any)
carries JSON arguments, and BFCL's scores agree with what was answered.

BFCL writes its results, scores, locks and .env lookup under `BFCL_PROJECT_ROOT`, here a tmp
folder; its data ship inside the package, and nothing is fetched.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from sgl_lite.server import create_app
from tests.support.client_venv import CLIENT_ENV, ROOT
from tests.support.server import serve


class Entry(NamedTuple):
    """A BFCL model entry that reads OPENAI_BASE_URL, and the model name it sends (served)."""

    registry: str
    served: str
    route: str


# BFCL 2026.3.23's chat-completions FC entry (`OpenAICompletionsHandler`) and a Responses API
# one (`OpenAIResponsesHandler`; a non-reasoning model, so it sends `temperature`)
ENTRIES = {
    "chat": Entry("openbmb/MiniCPM-SALA-FC", "openbmb/MiniCPM-SALA-FC", "/v1/chat/completions"),
    "responses": Entry("gpt-4.1-nano-2025-04-14-FC", "gpt-4.1-nano-2025-04-14", "/v1/responses"),
}
CATEGORIES = ("simple_python", "multiple", "parallel", "irrelevance")
IDS = {category: [f"{category}_{i}" for i in range(2)] for category in CATEGORIES}
N_IDS = sum(len(ids) for ids in IDS.values())
# BFCL sends no max_tokens; the model's prose runs on, so the server's default budget for a body
# without one bounds each answer (BFCL records whatever comes back)
MAX_TOKENS = 16


def bfcl_executable() -> str:
    """The `bfcl` CLI of .venv-bfcl (or SGL_LITE_BFCL_VENV's); fails the test if absent."""
    venv = Path(os.environ.get("SGL_LITE_BFCL_VENV") or ROOT / ".venv-bfcl")
    executable = venv / "bin" / "bfcl"
    if not executable.exists():
        pytest.fail(f"no BFCL at {executable}: run `make clients` (or set SGL_LITE_BFCL_VENV)")
    return str(executable)


def run_bfcl(root: Path, *args: str, url: str | None = None) -> None:
    """`bfcl ARGS` with its project root at `root` (pointed at `url`'s /v1 if given); a non-zero
    exit fails the test with its output's tail."""
    env = {**os.environ, **CLIENT_ENV, "BFCL_PROJECT_ROOT": str(root)}
    if url is not None:
        env["OPENAI_BASE_URL"] = f"{url}/v1"
    start = time.monotonic()
    run = subprocess.run(
        [bfcl_executable(), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=str(root),
    )
    print(f"bfcl {args[0]}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    if run.returncode != 0:
        pytest.fail(f"bfcl {args[0]} exited {run.returncode}:\n{(run.stdout + run.stderr)[-4000:]}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A BFCL result or score file: one JSON object a line."""
    assert path.exists(), f"BFCL wrote no {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(url: str, entry: Entry, record: dict[str, Any]) -> dict[str, Any]:
    """What the server answers to the request BFCL logged for `record` (`--include-input-log`:
    the messages' repr and the tools it sent), greedy as BFCL's was: the answer as BFCL keeps
    it (`{name: arguments}` per call, else the text) and the token counts."""
    logged = record["inference_log"][0]["content"]
    key = "messages" if entry.route.endswith("chat/completions") else "input"
    body = {
        "model": entry.served,
        key: ast.literal_eval(logged["message"]),
        "tools": logged["tools"],
        "temperature": 0,
        "store": False,
    }
    response = httpx.post(f"{url}{entry.route}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    if key == "messages":
        message, usage = answer["choices"][0]["message"], answer["usage"]
        calls = [c["function"] for c in message.get("tool_calls") or []]
        text = message["content"]
        tokens = (usage["prompt_tokens"], usage["completion_tokens"])
    else:
        calls = [item for item in answer["output"] if item["type"] == "function_call"]
        text = "".join(
            part["text"]
            for item in answer["output"]
            if item["type"] == "message"
            for part in item["content"]
            if part["type"] == "output_text"
        )
        tokens = (answer["usage"]["input_tokens"], answer["usage"]["output_tokens"])
    result = [{c["name"]: c["arguments"]} for c in calls] if calls else text
    return {"result": result, "tokens": tokens}


@pytest.fixture(scope="module")
def outcome(engine, tmp_path_factory) -> dict[str, Any]:
    """For each entry, one `bfcl generate` (eight requests at once) and the server's answers
    to the requests it logged; then one `bfcl evaluate` of both: the result and score records
    per entry and category."""
    root = tmp_path_factory.mktemp("bfcl")
    (root / "test_case_ids_to_generate.json").write_text(json.dumps(IDS))
    categories = ",".join(CATEGORIES)
    out: dict[str, Any] = {}
    for name, entry in ENTRIES.items():
        app = create_app(engine, served_model_name=entry.served, default_max_tokens=MAX_TOKENS)
        with serve(app) as url:
            # --run-ids: only the ids in test_case_ids_to_generate.json. All eight requests at
            # once: the test engine's float32 greedy answers are the same batched or alone
            # (docs/architecture.md, Determinism), so the replay one by one matches them
            run_bfcl(
                root,
                "generate",
                *("--model", entry.registry, "--test-category", categories, "--run-ids"),
                *("--temperature", "0", "--num-threads", str(N_IDS), "--include-input-log"),
                url=url,
            )
            folder = root / "result" / entry.registry.replace("/", "_") / "non_live"
            results = {c: read_jsonl(folder / f"BFCL_v4_{c}_result.json") for c in CATEGORIES}
            records = [r for c in CATEGORIES for r in results[c]]
            with ThreadPoolExecutor(len(records)) as pool:
                answers = pool.map(functools.partial(replay, url, entry), records)
                replies = {r["id"]: a for r, a in zip(records, answers, strict=True)}
        out[name] = {"results": results, "replies": replies}
    # --partial-eval: score the ids generated, not the whole categories
    models = ",".join(entry.registry for entry in ENTRIES.values())
    run_bfcl(root, "evaluate", "--model", models, "--test-category", categories, "--partial-eval")
    for name, entry in ENTRIES.items():
        folder = root / "score" / entry.registry.replace("/", "_") / "non_live"
        out[name]["scores"] = {}
        for category in CATEGORIES:
            summary, *failed = read_jsonl(folder / f"BFCL_v4_{category}_score.json")
            out[name]["scores"][category] = {"summary": summary, "failed": failed}
    out["overall"] = (root / "score" / "data_non_live.csv").read_text()
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ENTRIES)
def test_bfcl_generates_one_record_per_id_and_every_request_was_served(outcome, api):
    for category in CATEGORIES:
        records = outcome[api]["results"][category]
        assert [r["id"] for r in records] == IDS[category]
        for record in records:
            # a failed request is recorded as this string (and scored, not raised)
            assert not str(record["result"]).startswith("Error during inference"), record
            # BFCL's token counts are our `usage`
            assert record["input_token_count"] > 0
            assert 0 < record["output_token_count"] <= MAX_TOKENS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ENTRIES)
def test_each_recorded_answer_is_the_servers_answer_to_the_logged_request(outcome, api):
    for records in outcome[api]["results"].values():
        for record in records:
            reply = outcome[api]["replies"][record["id"]]
            assert record["result"] == reply["result"], record["id"]
            if isinstance(record["result"], list):  # calls: {name: arguments as JSON text}
                for call in record["result"]:
                    (arguments,) = call.values()
                    assert isinstance(json.loads(arguments), dict), call
            else:
                assert record["result"].strip(), record["id"]
            assert (record["input_token_count"], record["output_token_count"]) == reply["tokens"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ENTRIES)
def test_bfcl_scores_what_was_answered(outcome, api):
    for category in CATEGORIES:
        score, answers = outcome[api]["scores"][category], outcome[api]["results"][category]
        summary = score["summary"]
        assert summary["total_count"] == len(IDS[category])
        assert summary["accuracy"] == summary["correct_count"] / summary["total_count"]
        # the score file lists the failed entries; each names its id and BFCL's reason
        failed = {e["id"]: e for e in score["failed"]}
        assert len(failed) == summary["total_count"] - summary["correct_count"]
        for answer in answers:
            prose = isinstance(answer["result"], str)  # no call: the model answered in text
            if category == "irrelevance":
                # no call is the right answer to a question no given function can serve
                assert (answer["id"] not in failed) == prose, failed.get(answer["id"])
            elif prose:
                entry = failed[answer["id"]]
                assert entry["error_type"] == "ast_decoder:decoder_failed", entry
                assert entry["model_result_raw"] == answer["result"]
    # BFCL's own table of the run has a row for each entry
    for display in ("MiniCPM-SALA (FC)", "GPT-4.1-nano-2025-04-14 (FC)"):
        assert display in outcome["overall"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ENTRIES)
def test_irrelevance_is_detected_as_the_135m_model_never_calls_unforced(outcome, api):
    """SmolLM2-135M answers in prose when left to choose, so BFCL scores every irrelevance item
    right: a floor that holds only with the record checks above, as an error string scores
    right too."""
    assert outcome[api]["scores"]["irrelevance"]["summary"]["accuracy"] == 1.0
