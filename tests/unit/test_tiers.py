"""The test tiers (tests/support/tiers.py): a test's tier is its folder; a test that needs more
(the shared SmolLM2 fixtures, its tokenizer helpers, the launch helpers) or declares another
tier is refused, naming the folder it belongs in; `-m` skips the folders it cannot select."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tests.support import processes, smollm
from tests.support.tiers import FIXTURE_TIERS, TESTS, TIERS, cannot_select, tier_of


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
        ("unit/test_x.py", ("tiny_tokenizer",), (), {}, "unit"),
        ("unit/test_x.py", ("engine",), (), {"engine": own_engine}, "unit"),
        ("unit/test_x.py", (), (), {"ENV": dict(processes.ENV)}, "unit"),  # only the helpers
        ("unit/bench/test_x.py", (), (), {}, "unit"),  # any depth under the folder
        ("model/test_x.py", ("tmp_path",), (), {}, "model"),
        ("tokenizer/test_x.py", ("smollm_tokenizer", "tmp_path"), (), {}, "tokenizer"),
        ("e2e/test_x.py", ("hf_smollm", "smollm_folder"), (), {}, "e2e"),
        ("e2e/test_x.py", (), (), {"tok": smollm.smollm2_tokenizer}, "e2e"),
        ("process/test_x.py", ("engine",), (), {"running": processes.running}, "process"),
        ("cuda/test_x.py", ("smollm_tokenizer",), (), {}, "cuda"),
    ],
)
def test_tier_is_the_folder(path, fixtures, marks, module_globals, tier):
    assert tier_of(fake_item(path, *fixtures, marks=marks, **module_globals)) == tier


@pytest.mark.parametrize(
    "item, message",
    [
        (
            fake_item("unit/test_x.py", "smollm_folder", "smollm_tokenizer"),
            r"tests/unit/ but uses smollm_folder \(tokenizer\), smollm_tokenizer \(tokenizer\): "
            "it belongs in tests/tokenizer/",
        ),
        (fake_item("model/test_x.py", "hf_smollm"), "belongs in tests/e2e/"),
        (fake_item("tokenizer/test_x.py", "engine"), "uses engine .e2e.: it belongs in tests/e2e/"),
        (
            fake_item("unit/test_x.py", tok=smollm.smollm2_tokenizer),
            "smollm2_tokenizer .tokenizer.: it belongs in tests/tokenizer/",
        ),
        (fake_item("e2e/test_x.py", ENV=processes.ENV), "belongs in tests/process/"),
        (fake_item("e2e/test_x.py", launch=processes.launch), "belongs in tests/process/"),
        (
            fake_item("e2e/test_x.py", marks=("tokenizer",)),
            "marked tokenizer: a test's tier is its",
        ),
        (fake_item("tokenizer/test_x.py", marks=("tokenizer",)), "drop the marker"),  # even its own
        (fake_item("test_top_level.py"), "a test lives in a tier folder"),
        (fake_item("support/test_x.py"), "a test lives in a tier folder"),
    ],
)
def test_needs_beyond_the_folder_or_a_declared_tier_are_an_error(item, message):
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
def test_a_tier_folder_is_left_uncollected_only_where_m_cannot_select_it(markexpr, skipped):
    for path in (TESTS / "e2e", TESTS / "e2e/test_server_openapi.py"):
        assert cannot_select(markexpr, path) is skipped
    assert cannot_select(markexpr, TESTS / "support") is False  # not a tier folder
    assert cannot_select(markexpr, TESTS / "conftest.py") is False


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
