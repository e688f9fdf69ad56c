"""How the engine's OpenMP workers wait between parallel kernels: passive unless you say otherwise.

torch's CPU kernels run on a libgomp team. By default libgomp's workers spin for a while after
each parallel region, waiting for the next one. On a machine of its own that saves a wake-up per
kernel; on a busy one it is a collapse: a decode step runs ~150 parallel regions, each ends in a
barrier, and a worker that spins while its partner has been descheduled by another process burns
the very core that partner needs. Measured on a 2-core AMD EPYC with other processes saturating
it (load average ~9), batch-1 decode of the embedded model, one run each:

| team | wait policy | tok/s |
|---|---|---|
| 1 thread | default | 9-10 |
| 2 threads | default (spin) | 0.9-1.8 |
| 2 threads | OMP_WAIT_POLICY=ACTIVE | 0.7-1.5 |
| 2 threads | GOMP_SPINCOUNT=1000 | 6-8 |
| 2 threads | OMP_WAIT_POLICY=PASSIVE | 8-20 |

A passive team holds its speed under load (within 2x of a 1-thread team, as it must), and on a
quiet machine costs a futex wake-up per region: 25.0 vs 25.5 tok/s spinning at batch 1, 96 vs
101 at 16 prompts (one run each, the same machine with every other process stopped).

libgomp reads these settings once, when torch loads it, so `apply()` runs when
`sgl_lite.backend` is first imported (before torch); it sets nothing the user already set
(`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` in the environment is the knob; `SGL_LITE_KEEP_OMP_DEFAULTS`
keeps libgomp's defaults), and `note()` says at
start-up what is in force, or that torch was loaded first and the policy is the process's own.
"""

from __future__ import annotations

import os
import sys

# The settings libgomp takes its wait policy from; a user who sets either has chosen.
KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# Set (to anything): leave libgomp's own defaults, as a process that is not the engine's wants
# (a benchmark's peer, which imports sgl_lite only for its file paths).
KEEP_DEFAULTS = "SGL_LITE_KEEP_OMP_DEFAULTS"
DEFAULT_POLICY = "PASSIVE"

# "set": by apply(); "user": a knob was in the environment; "torch": loaded before apply() ran.
_state = "unapplied"


def apply() -> None:
    """Sets `OMP_WAIT_POLICY=PASSIVE` for this process unless the user set a knob or torch (and
    with it libgomp) is already loaded; to be called before the first `import torch`. Only the
    first call decides."""
    global _state
    if _state != "unapplied":
        return
    if any(k in os.environ for k in (*KNOBS, KEEP_DEFAULTS)):
        _state = "user"
    elif "torch" in sys.modules:
        _state = "torch"
    else:
        os.environ["OMP_WAIT_POLICY"] = DEFAULT_POLICY
        _state = "set"


def variables_set() -> dict[str, str]:
    """The environment variables `apply()` set in this process (none if it set nothing): what
    a child process that is not sgl_lite's (a benchmark's peer) should be started without."""
    return {"OMP_WAIT_POLICY": DEFAULT_POLICY} if _state == "set" else {}


def note() -> str:
    """What the start-up line says of the wait policy in force."""
    if _state == "set":
        return f"OpenMP wait policy: {DEFAULT_POLICY} (set OMP_WAIT_POLICY to override)"
    if _state == "user":
        given = [k for k in (*KNOBS, KEEP_DEFAULTS) if k in os.environ]
        knobs = ", ".join(f"{k}={os.environ[k]}" for k in given)
        return f"OpenMP wait policy: {knobs} (from the environment)"
    return "OpenMP wait policy: the process's own (torch was imported before sgl_lite's engine)"
