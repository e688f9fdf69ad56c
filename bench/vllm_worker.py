"""The vLLM side of the vLLM peer, run as

`.venv-vllm/bin/python bench/vllm_worker.py MODEL_FOLDER [DTYPE [eager|compiled]]`.

Runs in vLLM's own venv (its torch, its transformers), so it imports nothing of sgl_lite or
bench: only the standard library and vllm. It speaks JSON lines, one request in on stdin and one
reply out on the file descriptor stdout had at start; fd 1 itself is pointed at stderr first, so
whatever vLLM (or its C code) prints never lands inside a reply.

Start-up reply: {"ready": true, "version": ...} or {"error": "..."}. Requests (`op`):
- "generate": {"prompts": [[ids]], "max_tokens", "ignore_eos", "json_schema": null | {...}}
  -> {"ok": true, "wall_s", "outputs": [{"ids", "text", "cached", "ttft_s"}]}; `wall_s` is the
  time of the `LLM.generate` call alone, `cached` the prompt tokens vLLM's prefix cache served.
- "score": {"prompts": [[ids]], "starts": [int], "cache_reads": bool} -> {"ok": true, "wall_s",
  "outputs": [{"logprobs", "cached"}], "rescored"}: each prompt prefilled once for its prompt
  logprobs (`max_tokens=1`); `logprobs` are those of ids[start:], each given the ids before it.
  vLLM 0.32 reads no prefix cache for a request asking for prompt logprobs unless told to
  (`skip_reading_prefix_cache=False`, with `cache_reads`); its logprobs at cached positions
  are then stale, so a prompt whose cache hit reaches its `start` is scored again in a second
  call without cache reads (counted in `rescored` and in `wall_s`).
- "reset": empties the prefix cache -> {"ok": true}
- "quit": ends the process.
A request that fails is {"ok": false, "error": "..."}; the process lives on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any


def _replies() -> Any:
    """The reply channel (stdout's original descriptor); fd 1 then points at stderr."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def _ttft(output: Any) -> float | None:
    """Seconds from arrival to first token where this vLLM records it (its metrics vary)."""
    metrics = getattr(output, "metrics", None)
    if metrics is None:
        return None
    first = getattr(metrics, "first_token_time", None)
    arrival = getattr(metrics, "arrival_time", None)
    if first is not None and arrival is not None:
        return float(first - arrival)
    latency = getattr(metrics, "first_token_latency", None)
    return float(latency) if latency else None  # 0.0: not recorded


def _sampling(vllm: Any, request: dict) -> Any:
    kwargs: dict[str, Any] = {
        "temperature": 0.0,
        "max_tokens": int(request["max_tokens"]),
        "ignore_eos": bool(request.get("ignore_eos", False)),
    }
    schema = request.get("json_schema")
    if schema is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kwargs["structured_outputs"] = StructuredOutputsParams(json=schema)
    return vllm.SamplingParams(**kwargs)


def _generate(vllm: Any, llm: Any, request: dict) -> dict:
    prompts = [{"prompt_token_ids": list(p)} for p in request["prompts"]]
    params = _sampling(vllm, request)
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    outputs = []
    for result in results:
        completion = result.outputs[0]
        outputs.append(
            {
                "ids": list(completion.token_ids),
                "text": completion.text,
                "cached": int(getattr(result, "num_cached_tokens", None) or 0),
                "ttft_s": _ttft(result),
            }
        )
    return {"ok": True, "wall_s": wall, "outputs": outputs}


def choice_logprobs(prompt_logprobs: Any, ids: list[int], start: int, cached: int) -> list[float]:
    """The logprobs of ids[start:] out of one request's `prompt_logprobs`.

    Entry i of vLLM's list holds token i's logprob given tokens 0..i-1 (entry 0 is None); with
    `cached` prompt tokens read from the prefix cache only entries past `cached` were computed.
    """
    if not 0 < start < len(ids):
        raise ValueError(f"choice start {start} outside a {len(ids)}-token prompt")
    if start <= cached:
        raise ValueError(f"{cached} cached tokens cover the choice from {start}")
    if prompt_logprobs is None or len(prompt_logprobs) != len(ids):
        got = None if prompt_logprobs is None else len(prompt_logprobs)
        raise ValueError(f"{got} prompt logprobs for a {len(ids)}-token prompt")
    out = []
    for i in range(start, len(ids)):
        entry = prompt_logprobs[i]
        if entry is None or ids[i] not in entry:
            raise ValueError(f"no logprob of prompt token {ids[i]} at position {i}")
        out.append(float(entry[ids[i]].logprob))
    return out


def _score_params(vllm: Any, cache_reads: bool) -> Any:
    # detokenize=False: no text wanted, and vLLM would otherwise decode every prompt position
    return vllm.SamplingParams(
        max_tokens=1,
        temperature=0.0,
        prompt_logprobs=0,
        detokenize=False,
        skip_reading_prefix_cache=not cache_reads,
    )


def _score(vllm: Any, llm: Any, request: dict) -> dict:
    prompts, starts = request["prompts"], request["starts"]
    cache_reads = bool(request.get("cache_reads", False))
    start = time.perf_counter()
    results = llm.generate(
        [{"prompt_token_ids": list(p)} for p in prompts],
        _score_params(vllm, cache_reads),
        use_tqdm=False,
    )
    cached = [int(getattr(r, "num_cached_tokens", None) or 0) for r in results]
    again = [i for i, (c, s) in enumerate(zip(cached, starts)) if s <= c]
    if again:  # the cache hit reached into the choice: those positions hold no fresh logprob
        redo = llm.generate(
            [{"prompt_token_ids": list(prompts[i])} for i in again],
            _score_params(vllm, False),
            use_tqdm=False,
        )
        for i, result in zip(again, redo):
            results[i] = result
            cached[i] = int(getattr(result, "num_cached_tokens", None) or 0)
    wall = time.perf_counter() - start
    outputs = [
        {"logprobs": choice_logprobs(r.prompt_logprobs, list(p), s, c), "cached": c}
        for r, p, s, c in zip(results, prompts, starts, cached)
    ]
    return {"ok": True, "wall_s": wall, "outputs": outputs, "rescored": len(again)}


def main(argv: list[str]) -> int:
    """Loads the model, then answers requests until "quit" or end of input."""
    replies = _replies()

    def send(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    folder = argv[0]
    dtype = argv[1] if len(argv) > 1 else "float32"
    eager = len(argv) > 2 and argv[2] == "eager"
    try:
        import vllm

        llm = vllm.LLM(
            model=folder,
            dtype=dtype,
            enable_prefix_caching=True,
            max_model_len=4096,
            seed=0,
            enforce_eager=eager,
            disable_log_stats=False,  # else no per-request metrics: no first-token latency
        )
    except BaseException as exc:
        traceback.print_exc()
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send({"ready": True, "version": vllm.__version__})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "quit":
                break
            if op == "reset":
                llm.reset_prefix_cache()
                send({"ok": True})
            elif op == "generate":
                send(_generate(vllm, llm, request))
            elif op == "score":
                send(_score(vllm, llm, request))
            else:
                send({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:
            traceback.print_exc()
            send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
