"""One OpenMP team per process: why the engine's tensor work runs on its loop thread only.

torch's CPU kernels parallelise with OpenMP (libgomp in the Linux wheels). Every thread that runs
a parallel kernel gets a team of worker threads of its own, kept until that thread exits. libgomp
counts the workers of all teams together, and once they outnumber the CPUs it stops letting them
spin between parallel regions: each worker sleeps after every kernel and every kernel pays its
wake-up (libgomp's throttled spinning; no environment variable turns it off once it applies).
A decode step runs ~600 small parallel kernels, so this doubles it. Measured on 2 cores, batch-1
`auto` decode: 25-30 ms a step with one team, 50 ms once one other thread had run a single
parallel op, whichever thread then ran the step.

So the engine loads, packs and runs its model on its loop thread, and the threads that do tensor
work beside it (grammar compiles, the mask worker) run their ops on one OpenMP thread, which
starts no team.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os

import torch

logger = logging.getLogger("sgl_lite")


def use_one_omp_thread() -> None:
    """Sets the calling thread's OpenMP thread count to 1, leaving every other thread's count.

    OpenMP keeps the count per thread; `torch.set_num_threads` would change the process-wide
    one the engine was configured with. This goes through the libgomp torch loaded.
    """
    # NOTE: torch sets a thread's OpenMP count from the process-wide one on its first op in that
    # thread; done first here, so that the 1 below is not overwritten later.
    torch.get_num_threads()
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*"))
    for path in [*libs, None]:  # None: the symbols already loaded into the process
        try:
            ctypes.CDLL(path).omp_set_num_threads(1)
            return
        except (OSError, AttributeError):
            continue
    logger.debug("no libgomp found; this thread's tensor ops use torch's thread count")
