"""The test tiers: which marker a collected test gets, from what it needs (tests/conftest.py
applies it to every test).

Tiers are markers given by what a test needs, lightest first:

    unit       no model files: the byte tokenizer, fake runners, tokenizers built in the test
    model      tiny random model configs (no SmolLM2 file)
    tokenizer  SmolLM2's tokenizer or files (config, weight headers), no SmolLM2 forward pass
    e2e        the embedded SmolLM2 run (the shared `engine`, transformers' `hf_smollm`)
    process    child processes: servers (`launch_server`, the router), bench peers; signals
    cuda       a CUDA device (tests/cuda; skipped without one)

A test's tier is the heaviest of: its directory's (tests/unit, tests/bench -> unit,
tests/model -> model, tests/e2e -> e2e), unless the test or its module declares a tier marker
itself (`pytestmark = pytest.mark.tokenizer`: a model-free decode loop in tests/e2e); the
shared fixtures it uses (`FIXTURE_TIERS`, counted only where the test module does not define a
fixture of that name itself); and `process` if its module imports a launch helper from
tests/support/processes.py. A declared tier lighter than what the test uses is an error, so
`-m` never selects a test by a marker it outgrew. tests/cuda is always `cuda`.
`make test-fast` runs `-m "unit or model"`: nothing there reads a SmolLM2 file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support import processes

TIERS = ("unit", "model", "tokenizer", "e2e", "process", "cuda")
DIRECTORY_TIERS = {"unit": "unit", "bench": "unit", "model": "model", "e2e": "e2e", "cuda": "cuda"}
# tests/conftest.py's fixtures that read SmolLM2 (`smollm_tokenizer` depends on `smollm_folder`).
FIXTURE_TIERS = {
    "smollm_folder": "tokenizer",
    "smollm_tokenizer": "tokenizer",
    "engine": "e2e",
    "hf_smollm": "e2e",
}
PROCESS_HELPERS = (processes.running, processes.running_many, processes.launch, processes.ENV)
TESTS = Path(__file__).resolve().parents[1]


def _heaviest(tiers: Iterable[str]) -> str:
    return max(tiers, key=TIERS.index)


def tier_of(item: pytest.Item) -> str:
    """The tier of a collected test (see the module docstring); raises pytest.UsageError for a
    test outside the tier directories or one whose declared tier is lighter than its needs."""
    try:
        top = Path(item.path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        top = ""
    if top not in DIRECTORY_TIERS:
        raise pytest.UsageError(f"{item.nodeid}: no tier for tests/{top}/ (DIRECTORY_TIERS)")
    if top == "cuda":
        return "cuda"
    declared = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if len(declared) > 1:
        raise pytest.UsageError(f"{item.nodeid}: one tier per test, got {sorted(declared)}")
    module = getattr(getattr(item, "module", None), "__dict__", {})
    needs = {
        name: FIXTURE_TIERS[name]
        for name in getattr(item, "fixturenames", ())
        if name in FIXTURE_TIERS and name not in module  # a module's own `engine` is not ours
    }
    if any(value is helper for value in module.values() for helper in PROCESS_HELPERS):
        needs["tests.support.processes"] = "process"
    floor = next(iter(declared)) if declared else DIRECTORY_TIERS[top]
    tier = _heaviest([floor, *needs.values()])
    if declared and tier != floor:
        uses = ", ".join(name for name, t in needs.items() if t == tier)
        raise pytest.UsageError(f"{item.nodeid} is marked {floor} but uses {uses}: it is {tier}")
    return tier


# Modules that cost seconds to collect (schemathesis builds every operation's cases at
# collection; instructor and langchain are slow imports) and whose every test is of one tier:
# where `-m` cannot select that tier (`make test-fast`), they are not collected at all, so the
# selection is what it would be, only sooner. tests/conftest.py checks, whenever they are
# collected, that each of their tests is of that tier.
COLLECTED_FOR_ONE_TIER = {
    "e2e/test_server_openapi.py": "e2e",
    "e2e/test_server_clients.py": "e2e",
}
_OPERATORS = ("and", "or", "not")


def one_tier_module(path: Path) -> str | None:
    """The one tier of every test in `path` if it is in COLLECTED_FOR_ONE_TIER, else None."""
    try:
        return COLLECTED_FOR_ONE_TIER.get(path.resolve().relative_to(TESTS).as_posix())
    except ValueError:
        return None


def cannot_select(markexpr: str, path: Path) -> bool:
    """Whether `-m markexpr` selects none of `path`'s tests, known without collecting them: the
    module holds tests of one tier only and the expression names nothing but tiers (anything
    else, say `-m timeout`, needs the collected tests to tell)."""
    tier = one_tier_module(path)
    words = re.findall(r"[^\s()]+", markexpr)
    if tier is None or not words or any(w not in TIERS + _OPERATORS for w in words):
        return False

    # Only tier names, and/or/not and parentheses (checked above, so eval sees nothing else):
    # each name becomes whether it is this module's tier.
    def truth(word: re.Match[str]) -> str:
        return word[0] if word[0] in _OPERATORS else str(word[0] == tier)

    try:
        return not eval(re.sub(r"[^\s()]+", truth, markexpr), {"__builtins__": {}})
    except SyntaxError:  # a malformed -m: collect, and let pytest's own parser say what is wrong
        return False
