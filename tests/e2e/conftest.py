"""e2e-tier fixtures on the `engine` in scope: the session's SmolLM2 engine, or a module's own
`engine = engine_fixture(...)`.

`url` serves the app on it on loopback for the module (a module that needs other app settings
declares its own, `url = url_fixture(served_model_name=...)`); `rt` is a frontend `Runtime`
around it; `consistent_engine` and `idle_engine` check it is left whole after a test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_checks import assert_engine_whole
from tests.support.server import url_fixture

url = url_fixture()


@pytest.fixture(scope="module")
def rt(engine: Any) -> Any:
    """A Runtime around the engine (never shut down here: the engine is not the Runtime's)."""
    import sgl_lite as sgl

    return sgl.Runtime(engine=engine)


@pytest.fixture
def consistent_engine(engine: Any) -> Iterator[Any]:
    """The engine; after the test, its slot invariant holds (free + cached + in use == total)."""
    yield engine
    engine.check_integrity()


@pytest.fixture
def idle_engine(engine: Any) -> Iterator[Any]:
    """The engine with its cache flushed; after the test, `assert_engine_whole`."""
    assert engine.flush_cache()
    yield engine
    assert_engine_whole(engine)
