"""The messages callers' threads send the engine's loop thread, one small frozen type each.

The loop matches on them in one place (`Engine._handle`); nothing else reads the inbox.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeAlias

from sgl_lite.backend.types import OutputSink, Req


@dataclass(frozen=True, slots=True)
class Add:
    """Requests accepted by `Engine.submit`, to schedule; `sink` gets each one's outputs."""

    reqs: list[Req]
    sink: OutputSink


@dataclass(frozen=True, slots=True)
class Abort:
    """Ends request `rid` (if it is still queued or running), its slots freed."""

    rid: str


@dataclass(frozen=True, slots=True)
class Call:
    """Runs `fn` on the loop thread; its value, or what it raised, goes to `result`."""

    fn: Callable[[], Any]
    result: Future[Any]


@dataclass(frozen=True, slots=True)
class Stop:
    """Stops the loop; what is still queued or running is aborted."""


Message: TypeAlias = Add | Abort | Call | Stop
