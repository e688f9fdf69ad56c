"""Benchmarks of BENCHMARKS.md (`python -m bench.run`); not part of the sgl_lite package."""
