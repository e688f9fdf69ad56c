"""`python -m bench.llama_cpp_build`: CMake flags for building llama-cpp-python on this CPU, and
`--check` that the installed build decodes.

`-DGGML_NATIVE=ON` builds ggml's AMX path on CPUs that have it, and that build segfaults in
`decode` (seen on Xeons with AMX); so the instruction sets are named explicitly, from what
/proc/cpuinfo reports, with AMX always off. AVX-512 is enabled only where the CPU has it (an
AVX2-only EPYC would die of SIGILL otherwise).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

OFF = ("GGML_CUDA", "GGML_METAL", "GGML_BLAS", "GGML_VULKAN", "LLAMA_CURL", "GGML_NATIVE")
AMX = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# ggml option → the /proc/cpuinfo flag that allows it
ISA = {
    "GGML_AVX": "avx",
    "GGML_AVX2": "avx2",
    "GGML_FMA": "fma",
    "GGML_F16C": "f16c",
    "GGML_AVX512": "avx512f",
    "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
}


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is missing)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cmake_args(flags: set[str]) -> str:
    """CMAKE_ARGS for this CPU: explicit ISA options, AMX and every accelerator off."""
    args = [f"-D{name}=OFF" for name in OFF + AMX]
    args += [f"-D{name}={'ON' if flag in flags else 'OFF'}" for name, flag in ISA.items()]
    return " ".join(args)


CHECK = """
import llama_cpp
from sgl_lite.backend.runner.model_loader import embedded_gguf_path
llm = llama_cpp.Llama(model_path=str(embedded_gguf_path()), n_ctx=256, n_threads=1, verbose=False)
out = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)
print("llama-cpp-python decodes:", repr(out["choices"][0]["text"]))
"""


def check() -> int:
    """Decodes a few tokens in a child process; non-zero (and why) if the build crashes."""
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    print(proc.stdout.strip() or proc.stderr.strip()[-2000:])
    if proc.returncode != 0:
        print(f"llama-cpp-python failed its decode check (exit {proc.returncode})")
    return proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.llama_cpp_build", description=__doc__)
    p.add_argument("--check", action="store_true", help="check the installed build decodes")
    args = p.parse_args()
    if args.check:
        raise SystemExit(check())
    print(cmake_args(cpu_flags()))


if __name__ == "__main__":
    main()
