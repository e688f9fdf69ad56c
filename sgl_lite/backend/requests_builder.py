"""RequestBuilder: checks a caller's generate() arguments and turns them into Req objects.

Everything a caller can get wrong is caught here, in the caller's thread, with a ValueError that
names the field and what is allowed, so bad input never reaches the engine loop.
"""

from __future__ import annotations

import itertools
import uuid

import torch
from transformers import PreTrainedTokenizerBase

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.model_runner import ModelRunner
from sgl_lite.backend.request import Req
from sgl_lite.backend.sampling_params import SamplingParams

_rid_counter = itertools.count()


def new_rid() -> str:
    """A fresh request id."""
    return f"{uuid.uuid4().hex[:16]}-{next(_rid_counter)}"


class RequestBuilder:
    """Validation of inputs and construction of requests (with grammar compile started)."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: PreTrainedTokenizerBase,
        runner: ModelRunner,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = runner.vocab_size
        self.context_length = runner.context_length
        self.pool_size = runner.pool.num_slots
        self._compiler = None

    @property
    def compiler(self):
        """The grammar compiler, built on first use (it indexes the whole vocabulary)."""
        if self._compiler is None:
            from sgl_lite.backend.constrained import GrammarCompiler

            self._compiler = GrammarCompiler(
                self.tokenizer,
                whitespace_pattern=self.config.constrained_json_whitespace_pattern,
                timeout_s=self.config.grammar_compile_timeout,
                backend=self.config.grammar_backend,
            )
        return self._compiler

    def build(
        self,
        *,
        prompt,
        input_ids,
        sampling_params,
        return_logprob,
        logprob_start_len,
        top_logprobs_num,
        return_text_in_logprobs,
        stream,
        rid,
    ) -> tuple[list[Req], bool]:
        """Returns (requests, whether the input was a list)."""
        token_lists, batched = self._token_lists(prompt, input_ids)
        params_list = (
            sampling_params
            if isinstance(sampling_params, list)
            else ([sampling_params] * len(token_lists))
        )
        if len(params_list) != len(token_lists):
            raise ValueError(
                f"sampling_params has {len(params_list)} entries for {len(token_lists)} prompts"
            )
        rids = rid if isinstance(rid, list) else [rid] * len(token_lists)
        if len(rids) != len(token_lists):
            raise ValueError(f"rid has {len(rids)} entries for {len(token_lists)} prompts")
        if not isinstance(top_logprobs_num, int) or top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be an int >= 0, got {top_logprobs_num!r}")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be -1 or >= 0, got {logprob_start_len!r}")
        reqs = []
        for ids, raw_params, req_rid in zip(token_lists, params_list, rids):
            params = SamplingParams.from_dict(raw_params)
            self._check_fits(ids, params)
            if logprob_start_len > len(ids):
                raise ValueError(
                    f"logprob_start_len {logprob_start_len} is past the prompt's {len(ids)} tokens"
                )
            # SGLang: -1 with return_logprob means "from the last prompt token" (one entry).
            start = logprob_start_len if logprob_start_len >= 0 else len(ids) - 1
            grammar = self._start_grammar(params)
            for i in range(params.n):
                seed = params.sampling_seed
                reqs.append(
                    Req(
                        rid=(req_rid or new_rid()) + (f"-{i}" if params.n > 1 else ""),
                        input_ids=list(ids),
                        sampling_params=params,
                        return_logprob=return_logprob,
                        logprob_start_len=start if return_logprob else -1,
                        top_logprobs_num=top_logprobs_num,
                        return_text_in_logprobs=return_text_in_logprobs,
                        stream=stream,
                        grammar_future=grammar,
                        generator=None if seed is None else torch.Generator().manual_seed(seed + i),
                    )
                )
        return reqs, batched

    def _token_lists(self, prompt, input_ids) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt (text) and input_ids")
        if prompt is not None:
            batched = isinstance(prompt, list)
            texts = prompt if batched else [prompt]
            if not texts or not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a non-empty string or a list of them")
            if any(not t for t in texts):
                raise ValueError("prompt must not be empty")
            return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts], batched
        if not isinstance(input_ids, list) or not input_ids:
            raise ValueError("input_ids must be a non-empty list of token ids (or of lists)")
        batched = isinstance(input_ids[0], list)
        lists = input_ids if batched else [input_ids]
        for ids in lists:
            if not isinstance(ids, list) or not ids:
                raise ValueError("input_ids must not contain an empty list")
            bad = [
                t
                for t in ids
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
            ]
            if bad:
                raise ValueError(
                    f"input_ids contains {bad[0]!r}, outside the vocabulary [0, {self.vocab_size})"
                )
        return lists, batched

    def _check_fits(self, ids: list[int], params: SamplingParams) -> None:
        total = len(ids) + params.max_new_tokens
        if total > self.context_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the context length {self.context_length}; shorten the prompt or lower "
                "max_new_tokens"
            )
        if total >= self.pool_size:
            raise ValueError(
                f"prompt + max_new_tokens = {total} tokens does not fit the KV pool "
                f"({self.pool_size} tokens); raise max_total_tokens"
            )
        bad = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids contains {bad[0]}, outside [0, {self.vocab_size})")

    def _start_grammar(self, params: SamplingParams):
        if params.constraint is None:
            return None
        kind, pattern = params.constraint
        self.compiler.validate(kind, pattern)
        return self.compiler.submit(kind, pattern)
