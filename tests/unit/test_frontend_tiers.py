"""The test tiers (tests/support/tiers.py): a test's tier is what it needs (its directory's, a
declared marker, the shared SmolLM2 fixtures, the launch helpers), never lighter."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tests.support import processes
from tests.support.tiers import (
    COLLECTED_FOR_ONE_TIER,
    FIXTURE_TIERS,
    TESTS,
    TIERS,
    cannot_select,
    tier_of,
)


def fake_item(relative: str, *fixtures: str, marks=(), **module_globals) -> SimpleNamespace:
    module = ModuleType("test_x")
    module.__dict__.update(module_globals)
    return SimpleNamespace(
        nodeid=f"{relative}::test_x",
        path=TESTS / relative,
        fixturenames=list(fixtures),
        module=module,
        iter_markers=lambda: [SimpleNamespace(name=m) for m in (*marks, "parametrize")],
    )


def test_this_test_is_marked_unit(request):
    assert request.node.get_closest_marker("unit") is not None
    assert not [t for t in TIERS if t != "unit" and request.node.get_closest_marker(t)]


def own_engine():  # a module's own `engine` fixture (a fake one, say) is not the shared one
    pass


@pytest.mark.parametrize(
    "path, fixtures, marks, module_globals, tier",
    [
        ("unit/test_x.py", (), (), {}, "unit"),
        ("bench/test_x.py", (), (), {}, "unit"),
        ("unit/test_x.py", ("tiny_tokenizer",), (), {}, "unit"),
        ("model/test_x.py", ("tmp_path",), (), {}, "model"),
        ("unit/test_x.py", ("smollm_folder", "smollm_tokenizer"), (), {}, "tokenizer"),
        ("model/test_x.py", ("smollm_tokenizer", "tmp_path"), (), {}, "tokenizer"),
        ("model/test_x.py", ("hf_smollm", "smollm_folder"), (), {}, "e2e"),
        ("unit/test_x.py", ("engine",), (), {}, "e2e"),
        ("unit/test_x.py", ("engine",), (), {"engine": own_engine}, "unit"),
        ("e2e/test_x.py", (), (), {}, "e2e"),
        ("e2e/test_x.py", (), ("tokenizer",), {}, "tokenizer"),
        ("e2e/test_x.py", (), ("unit",), {}, "unit"),
        ("model/test_x.py", ("smollm_folder",), ("e2e",), {}, "e2e"),
        ("e2e/test_x.py", ("engine",), (), {"running": processes.running}, "process"),
        ("e2e/test_x.py", (), (), {"ENV": processes.ENV}, "process"),
        ("e2e/test_x.py", (), (), {"ENV": dict(processes.ENV)}, "e2e"),  # only the helpers
        ("cuda/test_x.py", ("smollm_tokenizer",), (), {}, "cuda"),
    ],
)
def test_tier_is_the_heaviest_of_what_the_test_needs(path, fixtures, marks, module_globals, tier):
    assert tier_of(fake_item(path, *fixtures, marks=marks, **module_globals)) == tier


@pytest.mark.parametrize(
    "item, message",
    [
        (fake_item("e2e/test_x.py", "engine", marks=("tokenizer",)), "marked tokenizer"),
        (fake_item("unit/test_x.py", "hf_smollm", marks=("unit",)), "uses hf_smollm: it is e2e"),
        (fake_item("e2e/test_x.py", marks=("unit", "e2e")), "one tier per test"),
        (fake_item("test_top_level.py"), "no tier for tests/test_top_level.py/"),
    ],
)
def test_a_declared_tier_lighter_than_the_needs_is_an_error(item, message):
    with pytest.raises(pytest.UsageError, match=message):
        tier_of(item)


@pytest.mark.parametrize(
    "markexpr, skipped",
    [
        ("unit or model", True),  # make test-fast
        ("e2e", False),
        ("not unit", False),
        ("(unit or model) and not e2e", True),
        ("e2e and not process", False),
        ("", False),  # the whole suite
        ("unit or timeout", False),  # a name that is not a tier: only the tests can tell
        ("unit or", False),  # malformed: pytest's own parser says so
    ],
)
def test_a_one_tier_module_is_left_uncollected_only_where_m_cannot_select_it(markexpr, skipped):
    openapi = TESTS / "e2e/test_server_openapi.py"
    assert COLLECTED_FOR_ONE_TIER["e2e/test_server_openapi.py"] == "e2e"
    assert cannot_select(markexpr, openapi) is skipped
    assert cannot_select(markexpr, TESTS / "e2e/test_engine.py") is False  # not listed


def test_every_tier_fixture_is_a_fixture_of_the_conftest():
    tree = ast.parse(Path(TESTS, "conftest.py").read_text())
    fixtures = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("fixture" in ast.unparse(d) for d in node.decorator_list)
    }
    assert set(FIXTURE_TIERS) <= fixtures


def test_the_tiny_tokenizer_is_built_here_and_renders_its_chat_template(tiny_tokenizer):
    assert len(tiny_tokenizer) < 400 and tiny_tokenizer.eos_token == "<|im_end|>"
    text = "héllo ✓ wörld"  # bytes outside the training text still round-trip
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
