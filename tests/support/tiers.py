"""The test tiers: a test's tier is the folder it lives in (tests/conftest.py marks every test
with it, and refuses a test whose needs exceed its folder).

The tiers, lightest first, one folder each:

    tests/unit       no model files: the byte tokenizer, fake runners, tokenizers built in the test
    tests/model      tiny random model configs (no SmolLM2 file)
    tests/tokenizer  SmolLM2's tokenizer or files (config, weight headers), no SmolLM2 forward pass
    tests/e2e        the embedded SmolLM2 run (the shared `engine`, transformers' `hf_smollm`)
    tests/process    child processes: servers (`launch_server`, the router), bench peers; signals
    tests/cuda       a CUDA device (skipped without one)

A test declares no tier marker. What it visibly needs must fit its folder: the shared fixtures
it uses (`FIXTURE_TIERS`, counted where the name resolves to tests/conftest.py's fixture, not a
module's or a tier folder's own), the SmolLM2 tokenizer helpers its module imports
(`HELPER_TIERS`: tests/support/smollm.py, the decode loops in tests/support/constrained.py) and
the launch helpers of tests/support/processes.py (`process`). A test that needs more is a usage
error naming the folder it belongs in, so `-m` never selects a test by a tier it outgrew.
`make test-fast` runs
`-m "unit or model"`: nothing there reads a SmolLM2 file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import processes

TIERS = ("unit", "model", "tokenizer", "e2e", "process", "cuda")
# tests/conftest.py's fixtures that read SmolLM2 (`smollm_tokenizer` depends on `smollm_folder`).
FIXTURE_TIERS = {
    "smollm_folder": "tokenizer",
    "smollm_tokenizer": "tokenizer",
    "engine": "e2e",
    "hf_smollm": "e2e",
}
# Helpers that load SmolLM2's tokenizer outside a fixture, by (module, name): matched on the
# imported function's own `__module__` and `__name__`, so tests/support/constrained.py (which
# imports the constraint layer) need not be imported to check a unit test.
HELPER_TIERS = {
    ("tests.support.smollm", "smollm2_tokenizer"): "tokenizer",
    **{
        ("tests.support.constrained", name): "tokenizer"
        for name in (
            "shared_compiler",
            "decode_without_model",
            "llg_vocab_bytes",
            "compiler",
            "backend_decode",
        )
    },
}
PROCESS_HELPERS = (processes.running, processes.running_many, processes.launch, processes.ENV)
TESTS = Path(__file__).resolve().parents[1]


def folder_tier(path: Path) -> str | None:
    """The tier of the folder `path` lies in (tests/<tier>/...); None outside the tier folders."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def _shared(item: pytest.Item, name: str, module: dict) -> bool:
    """Whether fixture `name` resolves to tests/conftest.py's (a module's or a tier folder's own
    `engine`, say the unit tier's engine double, is not the shared SmolLM2 one)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).get(name)
    if not defs:  # not a collected pytest item: the module's own definition is all we know
        return name not in module
    return getattr(defs[-1].func, "__module__", None) == "tests.conftest"


def _needs(item: pytest.Item) -> dict[str, str]:
    """What the test uses that has a tier: {fixture, helper or module name: tier}."""
    module = getattr(getattr(item, "module", None), "__dict__", {})
    needs = {
        name: FIXTURE_TIERS[name]
        for name in getattr(item, "fixturenames", ())
        if name in FIXTURE_TIERS and _shared(item, name, module)
    }
    for value in module.values():
        key = (str(getattr(value, "__module__", "")), str(getattr(value, "__name__", "")))
        if callable(value) and key in HELPER_TIERS:
            needs[".".join(key)] = HELPER_TIERS[key]
    if any(value is helper for value in module.values() for helper in PROCESS_HELPERS):
        needs["tests.support.processes"] = "process"
    return needs


def tier_of(item: pytest.Item) -> str:
    """The tier of a collected test: its folder's. Raises pytest.UsageError for a test outside
    the tier folders, one that declares a tier marker other than its folder's, and one whose
    needs exceed its folder's tier (naming the folder it belongs in)."""
    tier = folder_tier(Path(item.path))
    if tier is None:
        raise pytest.UsageError(f"{item.nodeid}: a test lives in a tier folder, tests/<tier>/")
    declared = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if declared:
        raise pytest.UsageError(
            f"{item.nodeid} is marked {', '.join(sorted(declared))}: a test's tier is its folder"
            f" (tests/{tier}/); drop the marker (and move the test if its folder is not its tier)"
        )
    if tier == "cuda":
        return tier
    needs = _needs(item)
    heavier = {name: t for name, t in needs.items() if TIERS.index(t) > TIERS.index(tier)}
    if heavier:
        belongs = max(heavier.values(), key=TIERS.index)
        uses = ", ".join(f"{name} ({t})" for name, t in heavier.items())
        raise pytest.UsageError(
            f"{item.nodeid} is in tests/{tier}/ but uses {uses}: it belongs in tests/{belongs}/"
        )
    return tier


_OPERATORS = ("and", "or", "not")


def cannot_select(markexpr: str, path: Path) -> bool:
    """Whether `-m markexpr` selects nothing under `path` (a tier folder or a file in one),
    known without collecting it: the expression names nothing but tiers (anything else, say
    `-m timeout`, needs the collected tests to tell) and is false for the folder's tier."""
    tier = folder_tier(path)
    words = re.findall(r"[^\s()]+", markexpr)
    if tier is None or not words or any(w not in TIERS + _OPERATORS for w in words):
        return False

    # Only tier names, and/or/not and parentheses (checked above, so eval sees nothing else):
    # each name becomes whether it is this folder's tier.
    def truth(word: re.Match[str]) -> str:
        return word[0] if word[0] in _OPERATORS else str(word[0] == tier)

    try:
        return not eval(re.sub(r"[^\s()]+", truth, markexpr), {"__builtins__": {}})
    except SyntaxError:  # a malformed -m: collect, and let pytest's own parser say what is wrong
        return False
