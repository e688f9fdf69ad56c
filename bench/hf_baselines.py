"""The transformers baselines on the same float32 weights: HF-alone and HF-manual-cache.

HF-alone is what a user gets from `model.generate` with no reuse: every prompt in full, one
request at a time, `select` by one forward pass per choice. HF-manual-cache is the best a careful
user does by hand: one `DynamicCache` per conversation, cropped to the longest common prefix
and extended; the W2 few-shot prefix prefilled once and copied per question, the four choices
of a question scored in one right-padded batch. Both compute logits only where they are read.
"""

from __future__ import annotations

import copy
import inspect
import os
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    ChatRun,
    decide,
    eos_ids,
    json_figures,
    json_prompt_ids,
    raw_ids,
    select_items,
    strip_eos,
)
from bench.workloads import Workloads
from sgl_lite.common import common_prefix_len


def dense_checkpoint(folder: Path) -> Path:
    """A Hugging Face folder with float32 safetensors of `folder`'s weights, for a peer that
    reads only such folders (vLLM): `folder` itself where it has them; for a GGUF model's
    folder (config and tokenizer only) a copy made once under the cache dir, its weights
    dequantized by our reader (bit for bit transformers' own dequantisation:
    tests/tokenizer/test_embedded_weights.py). The copy is keyed by the GGUF file's content,
    not its place, so every checkout's embedded model shares one."""
    import hashlib
    import shutil

    from safetensors.torch import save_file

    from sgl_lite.backend.runner.model_loader import (
        GGUF_SOURCE_FILE,
        cache_dir,
        gguf_source,
        load_config,
        load_state_dict,
    )

    source = gguf_source(folder)
    if source is None:
        return folder
    digest = hashlib.sha256()
    with source.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    target = cache_dir() / "dense" / f"{source.stem}-{digest.hexdigest()[:16]}-float32"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}-writing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns(GGUF_SOURCE_FILE))
    state = load_state_dict(folder, load_config(folder))
    save_file({name: t.contiguous() for name, t in state.items()}, tmp / "model.safetensors")
    try:
        tmp.rename(target)
    except OSError:  # another process made it first; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_hf_model(folder: Any, dtype: torch.dtype = torch.float32) -> Any:
    """transformers' own implementation of a model folder's weights, for reference outputs: a
    GGUF model's folder (config and tokenizer only) through transformers' GGUF loader, which
    dequantizes the file itself."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from sgl_lite.backend.runner.model_loader import gguf_source, load_config

    hf_logging.set_verbosity_error()
    source = gguf_source(Path(folder))
    if source is None:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, config=load_config(Path(folder)), dtype=dtype
    ).eval()


class _FirstToken:
    """A generate() streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls, self.at = 0, None

    def put(self, value: Any) -> None:
        self.calls += 1  # the first put is the prompt itself
        if self.calls == 2 and self.at is None:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


class _HF:
    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos = eos_ids(tokenizer, model.config)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos)
        # transformers 5.x names the KV argument `cache` (`past_key_values` before, deprecated).
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _kv(self, cache: Any) -> dict[str, Any]:
        return {self._cache_kw: cache, "use_cache": True}

    def warmup(self) -> None:
        with torch.inference_mode():
            self.model.generate(
                torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False, pad_token_id=self.pad
            )

    def shutdown(self) -> None:
        pass

    def _generate(self, ids: list[int], max_new: int, **kw: Any) -> tuple[list[int], float]:
        streamer = _FirstToken()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=self.pad,
                streamer=streamer,
                **kw,
            )
        ttft = (streamer.at or time.perf_counter()) - start
        return out[0, len(ids) :].tolist(), ttft


class HFAlone(_HF):
    """transformers `generate`, every prompt recomputed in full, one request at a time."""

    name = "hf_alone"

    def w1(self, wl: Workloads) -> dict[str, Any]:
        run = ChatRun(self.tokenizer, wl)
        start = time.perf_counter()
        for _ in range(run.num_turns):
            for c in range(len(wl.conversations)):
                ids, ttft = self._generate(run.prompt(c), wl.chat_max_new_tokens)
                run.record(c, strip_eos(ids, self.eos), ttft)
        wall = time.perf_counter() - start
        return run.figures(wall, computed=run.submitted_tokens())

    def w2(self, wl: Workloads) -> dict[str, Any]:
        _, items = select_items(self.tokenizer, wl)
        start = time.perf_counter()
        scores = []
        with torch.inference_mode():
            for item in items:
                per_choice = []
                for choice in item.choices:
                    keep = len(choice.ids) - choice.start + 1
                    logits = self.model(torch.tensor([choice.ids]), logits_to_keep=keep).logits
                    logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)  # (n, V)
                    target = torch.tensor(choice.ids[choice.start :])
                    per_choice.append(logp.gather(1, target[:, None])[:, 0].tolist())
                scores.append(per_choice)
        wall = time.perf_counter() - start
        submitted = sum(len(c.ids) for it in items for c in it.choices)
        decisions = [decide(s)[0] for s in scores]
        return {
            "wall_s": wall,
            "decisions": decisions,
            "accuracy": sum(d == it.answer for d, it in zip(decisions, items)) / len(items),
            "prompt_tokens_submitted": submitted,
            "prompt_tokens_computed": submitted,
            "scores": [decide(s)[1] for s in scores],
        }

    def w3(self, wl: Workloads) -> dict[str, Any]:
        prompts = [json_prompt_ids(self.tokenizer, wl, p) for p in wl.products]
        start = time.perf_counter()
        outs = [self._generate(ids, wl.json_max_new_tokens)[0] for ids in prompts]
        wall = time.perf_counter() - start
        texts = [self.tokenizer.decode(o, skip_special_tokens=True) for o in outs]
        return {
            **json_figures(wall, texts, wl.json_schema),
            "tokens_emitted": sum(map(len, outs)),
        }

    def w4(self, wl: Workloads) -> dict[str, Any]:
        n1, nb = wl.decode_new_tokens_b1, wl.decode_new_tokens_batch
        start = time.perf_counter()
        out, _ = self._generate(raw_ids(self.tokenizer, wl.decode_prompt), n1, min_new_tokens=n1)
        wall1 = time.perf_counter() - start
        tok = self.tokenizer
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok(
                list(wl.decode_prompts), return_tensors="pt", padding=True, add_special_tokens=False
            )
        finally:
            tok.padding_side = side
        start = time.perf_counter()
        with torch.inference_mode():
            outs = self.model.generate(
                **enc, max_new_tokens=nb, min_new_tokens=nb, do_sample=False, pad_token_id=self.pad
            )
        walln = time.perf_counter() - start
        tokens_n = (outs.shape[1] - enc["input_ids"].shape[1]) * outs.shape[0]
        return {
            "batch1_tokens_per_s": len(out) / wall1,
            "batch_tokens_per_s": tokens_n / walln,
            "batch_size": outs.shape[0],
            "batch1_wall_s": wall1,
            "batch_wall_s": walln,
        }


class HFManualCache(_HF):
    """transformers forward passes with hand-kept `past_key_values` (W1, W2)."""

    name = "hf_manual_cache"

    def _decode(self, cache: Any, feed: list[int], max_new: int) -> tuple[list[int], float]:
        """Greedy from `cache` after feeding `feed`; returns (new ids, time to first token)."""
        start = time.perf_counter()
        out, ttft = [], 0.0
        ids = torch.tensor([feed])
        with torch.inference_mode():
            while True:
                logits = self.model(input_ids=ids, **self._kv(cache), logits_to_keep=1).logits
                token = int(logits[0, -1].argmax())
                if not out:
                    ttft = time.perf_counter() - start
                out.append(token)
                if token in self.eos or len(out) >= max_new:
                    return out, ttft
                ids = torch.tensor([[token]])

    def w1(self, wl: Workloads) -> dict[str, Any]:
        from transformers import DynamicCache

        run = ChatRun(self.tokenizer, wl)
        caches = [DynamicCache(config=self.model.config) for _ in wl.conversations]
        cached: list[list[int]] = [[] for _ in wl.conversations]  # the ids each cache holds
        computed = 0
        start = time.perf_counter()
        for _ in range(run.num_turns):
            for c in range(len(wl.conversations)):
                ids = run.prompt(c)
                keep = min(common_prefix_len(cached[c], ids), len(ids) - 1)
                if caches[c].get_seq_length() > keep:
                    caches[c].crop(keep)
                computed += len(ids) - keep
                out, ttft = self._decode(caches[c], ids[keep:], wl.chat_max_new_tokens)
                # NOTE: the last sampled token was never fed, so the cache stops before it.
                cached[c] = ids + out[:-1]
                run.record(c, strip_eos(out, self.eos), ttft)
        wall = time.perf_counter() - start
        return run.figures(wall, computed=computed)

    def w2(self, wl: Workloads) -> dict[str, Any]:
        from transformers import DynamicCache

        shared, items = select_items(self.tokenizer, wl)
        start = time.perf_counter()
        scores = []
        with torch.inference_mode():
            prefix = DynamicCache(config=self.model.config)
            self.model(
                torch.tensor([items[0].prompt_ids[:shared]]), **self._kv(prefix), logits_to_keep=1
            )
            for item in items:
                scores.append(self._score(prefix, shared, item))
        wall = time.perf_counter() - start
        computed = shared + sum(
            min(c.start for c in it.choices)
            - shared
            + sum(len(c.ids) - min(x.start for x in it.choices) for c in it.choices)
            for it in items
        )
        decisions = [decide(s)[0] for s in scores]
        return {
            "wall_s": wall,
            "decisions": decisions,
            "accuracy": sum(d == it.answer for d, it in zip(decisions, items)) / len(items),
            "prompt_tokens_submitted": sum(len(c.ids) for it in items for c in it.choices),
            "prompt_tokens_computed": computed,
            "scores": [decide(s)[1] for s in scores],
        }

    def _score(self, prefix: Any, shared: int, item: Any) -> list[list[float]]:
        base = min(c.start for c in item.choices)  # first position any choice scores
        cache = copy.deepcopy(prefix)
        last = self.model(
            torch.tensor([item.prompt_ids[shared:base]]), **self._kv(cache), logits_to_keep=1
        ).logits[0, -1]  # predicts pos `base`
        tails = [c.ids[base:] for c in item.choices]
        width = max(map(len, tails))
        batch = torch.tensor([t + [self.pad] * (width - len(t)) for t in tails])  # (C, W)
        # NOTE: padding is on the right, so under the causal mask no real token sees a pad.
        cache.batch_repeat_interleave(len(tails))
        logits = self.model(batch, **self._kv(cache)).logits  # (C, W, V)
        scores = []
        for i, (choice, tail) in enumerate(zip(item.choices, tails)):
            rows = torch.cat([last[None], logits[i, : len(tail) - 1]])  # row j predicts tail[j]
            logp = torch.log_softmax(rows.float(), dim=-1)
            j0 = choice.start - base
            target = torch.tensor(tail[j0:])
            scores.append(logp[j0:].gather(1, target[:, None])[:, 0].tolist())
        return scores


def top2_margin(model: Any, prompt_ids: list[int], prefix: list[int]) -> float:
    """The HF model's top-2 logit margin for the token after prompt + prefix."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + prefix]), logits_to_keep=1).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])
