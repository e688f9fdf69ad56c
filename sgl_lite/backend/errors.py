"""Typed errors of the engine: what went wrong is a type, and the bad field is data.

Callers map these to their own answers by type (the HTTP server: `InvalidRequest` is a 400
naming `field`, anything else a 500); nothing downstream parses a message.
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the engine refuses: `field` names the argument or sampling param at fault."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class EngineError(RuntimeError):
    """The engine failed a request it had accepted (a step raised, or it shut down)."""
