"""Unit-tier fixtures: an engine double served in process, no model files.

`engine` here is `ScriptedEngine` (tests/support/fakes.py) with the tiny tokenizer, so a unit
test can never reach the session's SmolLM2 engine by its name; a module that needs the real
`Engine` over a fake runner defines its own `engine`, and `url` serves whichever is in scope.
"""

from __future__ import annotations

import pytest

from tests.support.fakes import ScriptedEngine
from tests.support.server import url_fixture


@pytest.fixture(scope="module")
def engine(tiny_tokenizer) -> ScriptedEngine:
    """The scripted engine double; its tiny tokenizer's chat template renders the chat routes."""
    scripted = ScriptedEngine()
    scripted.tokenizer = tiny_tokenizer
    return scripted


url = url_fixture()
