#!/usr/bin/env bash
# Fetches into .whl/ the wheels scripts/gpu_check.sh installs on the GPU machine: what sgl_lite
# imports beyond that machine's own packages (it has torch, transformers, tokenizers,
# safetensors, numpy, attrs and pytest), for its Python 3.12 on x86-64, at the versions this
# checkout's environment runs. .whl/ is git-ignored; nothing here is built, only downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NAMES=(outlines_core jsonschema jsonschema-specifications referencing rpds-py jsonpointer)
pins=()
for name in "${NAMES[@]}"; do
    pins+=("$name==$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
ls -l .whl
