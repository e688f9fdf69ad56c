"""A stand-in `sglang` package for running SGLang's own server tests against sgl_lite.

Only what SGLang's HTTP-level tests under test/srt import lives here (names they import,
written for sgl_lite; no SGLang code): `popen_launch_server` starts
`python -m sgl_lite.launch_server --model-path default`, `get_tokenizer` returns that model's
tokenizer, and the rest are the constants and helpers around them. scripts/sglang_server_tests.py
puts this folder first on PYTHONPATH of the test process only; the server it launches imports
the real environment.
"""
