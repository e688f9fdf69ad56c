"""sglang.test: test helpers (test_utils, runners, kits) for SGLang's server tests."""
