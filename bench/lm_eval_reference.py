"""The reference log-likelihoods `bench.lm_eval_bench` compares a server's against: what lm-eval's
own `--model hf` computes for each (context, continuation), in float32 on transformers' model.

lm-eval's `hf` model needs torch, which `.venv-clients` (where lm-eval lives) does not have, and
loading lm-eval's whole harness to run one forward pass per item buys nothing: its
`loglikelihood` is three steps, done here in `.venv` with the same transformers:
1. `_encode_pair`: trailing spaces of the context move to the continuation; the whole string
   and the context are encoded without special tokens (SmolLM2 adds no BOS; lm-eval's
   `add_bos_token` defaults to False), the continuation's tokens are the whole's after the
   context's;
2. a forward pass over context + continuation;
3. the sum of the continuation tokens' log-softmax, and whether each is the argmax (is_greedy).
Step 2 runs the context once per item and each option's tokens after it, on a `DynamicCache`
that starts from the longest token prefix an earlier item computed (the passage): the same
float32 arithmetic as one pass over the whole sequence up to summation order (at most 1.4e-5
nats from full passes over 12 items' 48 options, measured), and ~20x fewer tokens than
`HFLM`'s full passes, which on this shared 2-core machine took ~5 s an item (100 items: ~40 s
here against ~8 min).
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import torch

from bench.hf_baselines import load_hf_model
from sgl_lite.common import common_prefix_len


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's causal `_encode_pair`: (context tokens, continuation tokens)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    return ctx, whole[len(ctx) :]


class Reference:
    """transformers' float32 model and tokenizer of a model folder, scoring (context,
    continuation) pairs as lm-eval's `hf` model does; each pair scored once."""

    KEPT_PREFIXES = 8  # the last contexts' caches: the same passage comes back 4 items later

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        self.model = load_hf_model(folder, torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.scores: dict[tuple[str, str], tuple[float, bool]] = {}
        # transformers 5.x names the KV argument `cache` (`past_key_values` before).
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # (ids, the DynamicCache holding them, log-probabilities of the token after them)
        self._prefixes: list[tuple[list[int], Any, torch.Tensor]] = []

    def score(self, pairs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Each pair's (log-likelihood, is_greedy), computed the first time it is asked for."""
        for pair in pairs:
            if pair not in self.scores:
                self.scores[pair] = self._score(*pair)
        return [self.scores[p] for p in pairs]

    def _run(self, ids: list[int], cache: Any, keep_last: bool = False) -> torch.Tensor:
        """Log-softmax of the logits after each of `ids` fed on `cache` (the last one only
        with `keep_last`), as float32 (positions, vocab)."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if keep_last:
            kwargs["logits_to_keep"] = 1
        logits = self.model(input_ids=torch.tensor([ids]), **kwargs).logits[0]
        return torch.log_softmax(logits.float(), -1)

    def _context(self, ids: list[int]) -> tuple[Any, torch.Tensor]:
        """A cache holding `ids` and the log-probabilities of the token after them; starts from
        the kept cache sharing the longest prefix with `ids`."""
        from transformers import DynamicCache

        for cached, cache, last in self._prefixes:
            if cached == ids:  # the item's other options
                return cache, last
        best, keep = None, 0
        for cached, cache, _ in self._prefixes:
            n = min(common_prefix_len(cached, ids), len(ids) - 1)
            if n > keep:
                best, keep = cache, n
        if best is None:
            cache = DynamicCache(config=self.model.config)
        else:
            cache = copy.deepcopy(best)
            # a negative count removes that many tokens from the end (transformers 4.x and 5.x)
            if cache.get_seq_length() > keep:
                cache.crop(keep - cache.get_seq_length())
        last = self._run(ids[keep:], cache, keep_last=True)[-1]
        self._prefixes = [*self._prefixes[-(self.KEPT_PREFIXES - 1) :], (ids, cache, last)]
        return cache, last

    @torch.inference_mode()
    def _score(self, context: str, continuation: str) -> tuple[float, bool]:
        ctx, cont = encode_pair(self.tokenizer, context, continuation)
        if not ctx or not cont:
            raise ValueError(f"nothing to score in {context[-40:]!r} + {continuation!r}")
        cache, first = self._context(ctx)
        logprobs = first[None]
        if len(cont) > 1:  # the continuation's later tokens, on a copy of the context's cache
            logprobs = torch.cat([logprobs, self._run(cont[:-1], copy.deepcopy(cache))])
        target = torch.tensor(cont)
        picked = logprobs.gather(1, target[:, None])[:, 0]
        greedy = bool((logprobs.argmax(-1) == target).all())
        return float(picked.double().sum()), greedy
