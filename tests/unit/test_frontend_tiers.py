"""The test tiers of tests/conftest.py: markers by directory, SmolLM2 fixtures make a test e2e."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import SMOLLM_FIXTURES, tier_of

TESTS = Path(__file__).resolve().parents[1]


def fake_item(relative: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(path=TESTS / relative, fixturenames=list(fixtures))


def test_this_test_is_marked_unit(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("e2e") is None


@pytest.mark.parametrize(
    "path, fixtures, tier",
    [
        ("unit/test_x.py", (), "unit"),
        ("unit/test_x.py", ("tiny_tokenizer",), "unit"),
        ("model/test_x.py", ("tmp_path",), "model"),
        ("e2e/test_x.py", ("engine",), "e2e"),
        ("cuda/test_x.py", (), "cuda"),
        ("unit/test_x.py", ("smollm_tokenizer",), "e2e"),
        ("model/test_x.py", ("hf_smollm", "tmp_path"), "e2e"),
        ("test_top_level.py", (), None),
    ],
)
def test_tier_comes_from_the_directory_unless_the_test_uses_smollm2(path, fixtures, tier):
    assert tier_of(fake_item(path, *fixtures)) == tier


def test_every_smollm2_fixture_exists_in_conftest():
    import tests.conftest as conftest

    assert all(callable(getattr(conftest, name, None)) for name in SMOLLM_FIXTURES)


def test_the_tiny_tokenizer_is_built_here_and_renders_its_chat_template(tiny_tokenizer):
    assert len(tiny_tokenizer) < 400 and tiny_tokenizer.eos_token == "<|im_end|>"
    text = "héllo ✓ wörld"  # bytes outside the training text still round-trip
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
