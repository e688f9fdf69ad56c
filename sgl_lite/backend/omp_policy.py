"""How the engine's OpenMP workers wait between parallel kernels: a bounded spin, then sleep.

torch's CPU kernels run on a libgomp team. By default libgomp's workers spin for a long while
(300,000 rounds) after each parallel region, waiting for the next one. On a machine of its own
that saves a wake-up per kernel; on a busy one it is a collapse: a decode step runs ~150
parallel regions, each ends in a barrier, and a worker that spins while its partner has been
descheduled burns the very core that partner needs. A passive team (sleep at once) holds up
under load but pays a futex wake-up per region, which halves a quiet machine's speed. Measured
on a 2-core AMD EPYC (AVX2), batch-1 decode of the embedded model, one process per setting:

| 2-thread team | quiet machine | other processes saturating it (load ~9) |
|---|---|---|
| libgomp's default (spin 300k) | 23.6 tok/s | 0.9-1.8 tok/s |
| GOMP_SPINCOUNT=10000 (the default here) | 22.6 | 4.3 |
| OMP_WAIT_POLICY=PASSIVE | 12.3 | 8-20 |
| (1-thread team, for reference) | 18.4 | 9-10 |

So the default is a short spin (`GOMP_SPINCOUNT=10000`): within 5 % of spinning on a quiet
machine, several times faster than it under load. On a machine known to be shared, set
`OMP_WAIT_POLICY=PASSIVE` (or run 1 thread); on one of its own, `OMP_WAIT_POLICY=ACTIVE`.

libgomp reads these settings once, when torch loads it, so `apply()` runs when
`sgl_lite.backend` is first imported (before torch); it sets nothing the user already set
(`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` in the environment is the knob; `SGL_LITE_KEEP_OMP_DEFAULTS`
keeps libgomp's defaults), and `note()` says at start-up what is in force, or that torch was
loaded first and the policy is the process's own.
"""

from __future__ import annotations

import os
import sys

# The settings libgomp takes its wait policy from; a user who sets either has chosen.
KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# Set (to anything): leave libgomp's own defaults, as a process that is not the engine's wants
# (a benchmark's peer, which imports sgl_lite only for its file paths).
KEEP_DEFAULTS = "SGL_LITE_KEEP_OMP_DEFAULTS"
DEFAULT_KNOB, DEFAULT_VALUE = "GOMP_SPINCOUNT", "10000"

# "set": by apply(); "user": a knob was in the environment; "torch": loaded before apply() ran.
_state = "unapplied"


def apply() -> None:
    """Sets `GOMP_SPINCOUNT=10000` for this process unless the user set a knob or torch (and
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
        os.environ[DEFAULT_KNOB] = DEFAULT_VALUE
        _state = "set"


def variables_set() -> dict[str, str]:
    """The environment variables `apply()` set in this process (none if it set nothing): what
    a child process that is not sgl_lite's (a benchmark's peer) should be started without."""
    return {DEFAULT_KNOB: DEFAULT_VALUE} if _state == "set" else {}


def note() -> str:
    """What the start-up line says of the wait policy in force."""
    if _state == "set":
        return (
            f"OpenMP wait policy: {DEFAULT_KNOB}={DEFAULT_VALUE}, a short spin "
            "(OMP_WAIT_POLICY or GOMP_SPINCOUNT override it)"
        )
    if _state == "user":
        given = [k for k in (*KNOBS, KEEP_DEFAULTS) if k in os.environ]
        knobs = ", ".join(f"{k}={os.environ[k]}" for k in given)
        return f"OpenMP wait policy: {knobs} (from the environment)"
    return "OpenMP wait policy: the process's own (torch was imported before sgl_lite's engine)"
