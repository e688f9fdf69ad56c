"""What a test asserts of an engine it shares with others: left whole, nothing running."""

from __future__ import annotations

import time
from typing import Any


def assert_engine_whole(engine: Any, timeout: float = 30) -> None:
    """Waits (up to `timeout` s: a timed-out request may still be being retired) until nothing
    runs, then asserts the slot invariant (free + cached + in use == total) and that a flush
    empties the pool."""
    deadline = time.monotonic() + timeout
    while engine.get_server_info()["num_running_reqs"]:
        assert time.monotonic() < deadline, f"a request is still running after {timeout} s"
        time.sleep(0.05)
    engine.check_integrity()
    assert engine.flush_cache()
    assert engine.get_server_info()["pool_used_tokens"] == 0
