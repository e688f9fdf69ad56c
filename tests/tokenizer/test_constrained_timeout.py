"""A slow compile fails with a timeout error while other compiles keep working.

Runs in a child process: the timed-out build cannot be stopped and would keep a core busy
for the rest of the test session.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, time, torch
torch.set_num_threads(1)
from sgl_lite.backend.constrained import GrammarCompiler, GrammarError
from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path
compiler = GrammarCompiler(load_tokenizer(resolve_model_path(None)), timeout_s=1.0)
# one schema validated first: the one-time jsonschema import is not what is timed here
compiler.validate("json_schema", {"type": "boolean"})
t0 = time.monotonic()
slow = compiler.submit("json_schema", {"type": "string", "maxLength": 2000})
submit_s = time.monotonic() - t0
small = compiler.compile("regex", r"(yes|no)")
try:
    slow.result()
    error = None
except GrammarError as exc:
    error = str(exc)
waited_s = time.monotonic() - t0
again = compiler.submit("json_schema", {"type": "string", "maxLength": 2000})
print(json.dumps({
    "submit_s": submit_s, "waited_s": waited_s, "error": error,
    "small_ok": small.is_accepting(small.initial_state) is False, "same_future": again is slow,
}))
"""


def test_slow_compile_times_out_quickly_and_small_compiles_still_succeed() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], check=False, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["submit_s"] < 0.5
    assert result["error"] is not None and "timed out after 1.0 s" in result["error"]
    assert result["waited_s"] < 3.0
    assert result["small_ok"] and result["same_future"]
