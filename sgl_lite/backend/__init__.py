"""The inference engine, grouped by role; each layer imports only the ones below it
(`make lint` checks it with import-linter):

    engine/       the engine's lifetime: Engine, start-up, loop thread, intake, admission, results
    scheduler/    one step's decisions: batches, sampling, applying samples, text, logprobs
    runner/       tensors: ModelRunner, model families (models/), weight formats (weights/)
    kvcache/      KV memory: the slot pool, the radix tree, the cache manager, pool sizing
    constrained/  regex / JSON Schema / grammar → per-request token masks
    types.py      the data that flows down a step (Req, ScheduleBatch, ForwardOutput, Sample, …)
    config.py · sampling_params.py · errors.py · omp_threads.py · omp_policy.py
                  settings and shared leaves

The HTTP server is a client of the engine and lives beside it, in `sgl_lite/server/`.

Importing this package sets OpenMP's wait policy before anything here loads torch (omp_policy).
"""

from sgl_lite.backend import omp_policy

omp_policy.apply()
