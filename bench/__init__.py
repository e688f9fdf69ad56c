"""Benchmarks of BENCHMARKS.md (`python -m bench.run`); not part of the sgl_lite package."""

# Before any benchmark module loads torch, as a user's program importing the engine would: the
# engine's OpenMP wait policy (sgl_lite/backend/omp_policy.py). A peer's own process keeps
# libgomp's defaults (bench/isolated.py), as its users get them.
from sgl_lite.backend import omp_policy

omp_policy.apply()
