"""The engine's lifetime: start-up, the loop thread, intake of requests, admission, results.

`Engine` (engine.py) is the in-process engine with SGLang's `Engine.generate` API; one step is
schedule → forward → sample → process, in `Engine.step`. `GenerateInput` (inputs.py) is one
generate call, what `Engine.submit` takes.
"""

from sgl_lite.backend.engine.engine import Engine
from sgl_lite.backend.engine.inputs import GenerateInput

__all__ = ["Engine", "GenerateInput"]
