"""Tokenizer-tier fixtures: grammar compilers on SmolLM2's tokenizer (no model forward)."""

from __future__ import annotations

import pytest

from sgl_lite.backend.constrained import GrammarCompiler
from tests.support.smollm import smollm2_tokenizer


@pytest.fixture(scope="session")
def auto() -> GrammarCompiler:
    """The compiler under the `auto` routing table."""
    return GrammarCompiler(smollm2_tokenizer(), backend="auto", timeout_s=60.0)
