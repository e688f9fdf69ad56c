"""The scripted Backend the frontend's unit tests use (tests/support/mock_backend.py)."""

from __future__ import annotations

from sgl_lite.frontend.backends.base import GenRequest, Prompt
from tests.support.mock_backend import MockBackend


def test_mock_backend_records_calls_and_replies():
    backend = MockBackend(lambda text, req: text[-3:])
    out = backend.generate(Prompt(text="abcdef"), GenRequest())
    assert out.text == "def" and backend.kinds() == ["generate"]
