"""Unit-tier fixtures: an engine double served in process, no model files.

`engine` here is `ScriptedEngine` (tests/support/fakes.py) with the tiny tokenizer, so a unit
test can never reach the session's SmolLM2 engine by its name; a module that needs the real
`Engine` over a fake runner defines its own `engine`, and `url` serves whichever is in scope.
`compilers` are grammar compilers on the tiny tokenizer, by backend.
"""

from __future__ import annotations

import pytest

from sgl_lite.backend.constrained import GrammarCompiler
from tests.support.fakes import ScriptedEngine
from tests.support.server import url_fixture
from tests.support.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def engine(tiny_tokenizer) -> ScriptedEngine:
    """The scripted engine double; its tiny tokenizer's chat template renders the chat routes."""
    scripted = ScriptedEngine()
    scripted.tokenizer = tiny_tokenizer
    return scripted


url = url_fixture()


@pytest.fixture(scope="session")
def compilers() -> dict[str, GrammarCompiler]:
    """A compiler per backend the exactness tests compare ("outlines", "auto")."""
    tokenizer = build_tiny_tokenizer()
    return {b: GrammarCompiler(tokenizer, backend=b) for b in ("outlines", "auto")}
