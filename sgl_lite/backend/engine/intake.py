"""RequestBuilder: checks a `GenerateInput` against the model and turns it into Req objects.

Everything a caller can get wrong is caught in the caller's thread, with an `InvalidRequest`
that names the field and says what is allowed, so bad input never reaches the engine loop:
the shape of the call when its `GenerateInput` is built (inputs.py), what needs the vocabulary,
the context, the pool and the config here.
"""

from __future__ import annotations

import itertools
import uuid
from concurrent.futures import Future
from typing import Any

import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.constrained import Grammar, GrammarCompiler
from sgl_lite.backend.engine.inputs import GenerateInput
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler import custom_logits
from sgl_lite.backend.scheduler.logprobs import LogprobState
from sgl_lite.backend.types import Req
from sgl_lite.common.tokenizer import Tokenizer

_rid_counter = itertools.count()


def new_rid() -> str:
    """A fresh request id."""
    return f"{uuid.uuid4().hex[:16]}-{next(_rid_counter)}"


class RequestBuilder:
    """Validation of inputs and construction of requests (with grammar compile started)."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: Tokenizer,
        *,
        vocab_size: int,
        context_length: int,
        pool_size: int,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.pool_size = pool_size
        self._compiler: GrammarCompiler | None = None

    @property
    def compiler(self) -> GrammarCompiler:
        """The grammar compiler, built on first use (it indexes the whole vocabulary)."""
        if self._compiler is None:
            self._compiler = GrammarCompiler(
                self.tokenizer,
                whitespace_pattern=self.config.constrained_json_whitespace_pattern,
                timeout_s=self.config.grammar_compile_timeout,
                backend=self.config.grammar_backend,
            )
        return self._compiler

    @property
    def compile_stats(self) -> dict[str, Any] | None:
        """The grammar compiler's build statistics (`CompileStats.snapshot`); None before the
        first constrained request built the compiler."""
        return None if self._compiler is None else self._compiler.stats.snapshot()

    def close(self) -> None:
        """Lets the grammar compiler's idle index worker processes go (engine shutdown)."""
        if self._compiler is not None:
            self._compiler.close()

    def max_new_tokens_room(self, prompt_len: int) -> int:
        """The most new tokens a prompt of `prompt_len` tokens may ask for."""
        return max(min(self.context_length, self.pool_size - 1) - prompt_len, 0)

    def build(self, inp: GenerateInput) -> list[list[Req]]:
        """The requests of each prompt of `inp` (n each), their grammars' compiles started.

        `inp` has been checked for shape; this checks what needs the vocabulary, the context
        and the config (an InvalidRequest naming the field), before anything is queued."""
        chosen_ids = self._chosen_ids(inp.token_ids_logprob) if inp.return_logprob else None
        token_lists = self._token_lists(inp)
        processors = self._processors(inp.processors)
        prompt_field = "prompt" if inp.prompt is not None else "input_ids"
        groups = []
        for ids, params, req_rid, processor in zip(token_lists, inp.params, inp.rids, processors):
            self._check_fits(ids, params, prompt_field)
            if inp.logprob_start_len > len(ids):
                raise InvalidRequest(
                    "logprob_start_len",
                    f"logprob_start_len {inp.logprob_start_len} is past the prompt's {len(ids)} "
                    "tokens",
                )
            # SGLang: -1 with return_logprob means "from the last prompt token" (one entry).
            start = inp.logprob_start_len if inp.logprob_start_len >= 0 else len(ids) - 1
            grammar = self._start_grammar(params)
            notes = () if params.constraint is None else self.compiler.notes(*params.constraint)
            base = req_rid or new_rid()
            groups.append(
                [
                    Req(
                        rid=base + (f"-{i}" if params.n > 1 else ""),
                        input_ids=list(ids),
                        sampling_params=params,
                        logprobs=LogprobState(
                            start, inp.top_logprobs_num, inp.return_text_in_logprobs, chosen_ids
                        )
                        if inp.return_logprob
                        else None,
                        stream=inp.stream,
                        grammar_future=grammar,
                        constraint_notes=notes,
                        custom_logit_processor=processor,
                        generator=None
                        if params.sampling_seed is None
                        else torch.Generator().manual_seed(params.sampling_seed + i),
                    )
                    for i in range(params.n)
                ]
            )
        return groups

    def _chosen_ids(self, token_ids: list[int] | None) -> tuple[int, ...] | None:
        """SGLang's `token_ids_logprob`: ids whose logprobs each output position reports."""
        if not token_ids:
            return None
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(
                "token_ids_logprob",
                f"Token ID {bad[0]} is out of vocabulary (vocab size: {self.vocab_size})",
            )
        return tuple(token_ids)

    def _processors(
        self, wires: tuple[str | None, ...]
    ) -> list[custom_logits.CustomLogitProcessor | None]:
        """Each prompt's custom logit processor, loaded, or a 400-worthy InvalidRequest: not
        enabled, no dill, a bad string."""
        if all(w is None for w in wires):
            return [None] * len(wires)
        if not self.config.enable_custom_logit_processor:
            raise InvalidRequest(custom_logits.FIELD, custom_logits.NOT_ENABLED)
        return [None if w is None else custom_logits.load_processor(w) for w in wires]

    def _token_lists(self, inp: GenerateInput) -> list[list[int]]:
        """Each prompt's token ids: text tokenized, given ids checked against the vocabulary."""
        lists = []
        for prompt in inp.prompts:
            if isinstance(prompt, str):
                lists.append(self.tokenizer.encode(prompt, add_special_tokens=False))
                continue
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequest(
                    "input_ids",
                    f"input_ids contains {bad[0]!r}, outside the vocabulary [0, {self.vocab_size})",
                )
            lists.append(list(prompt))
        return lists

    def _check_fits(self, ids: list[int], params: SamplingParams, prompt_field: str) -> None:
        # NOTE: each message opens with SGLang's own wording (clients match on it), then ours
        total = len(ids) + params.max_new_tokens
        if len(ids) > self.context_length:
            raise InvalidRequest(
                prompt_field,
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens); shorten the prompt",
            )
        if total > self.context_length:
            raise InvalidRequest(
                "max_new_tokens",
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens: the prompt's {len(ids)} tokens + max_new_tokens "
                f"{params.max_new_tokens} = {total}; shorten the prompt or lower max_new_tokens",
            )
        if total >= self.pool_size:
            raise InvalidRequest(
                "max_new_tokens",
                f"prompt + max_new_tokens = {total} tokens does not fit the KV pool "
                f"({self.pool_size} tokens); raise max_total_tokens",
            )
        # NOTE: a stop id past the vocabulary can never be sampled, so it never matches and is
        # accepted (as SGLang does: its tests send Llama-3's ids to every model); a negative
        # one is no token id of any tokenizer.
        bad = [t for t in params.stop_token_ids if t < 0]
        if bad:
            raise InvalidRequest(
                "stop_token_ids", f"stop_token_ids contains {bad[0]}, not a token id (< 0)"
            )
        bad = [t for t, _ in params.logit_bias if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(
                "logit_bias", f"logit_bias names token {bad[0]}, outside [0, {self.vocab_size})"
            )

    def _start_grammar(self, params: SamplingParams) -> Future[Grammar] | None:
        if params.constraint is None:
            return None
        kind, pattern = params.constraint
        try:
            self.compiler.validate(kind, pattern)
        except ValueError as exc:  # GrammarError: the pattern itself is at fault
            raise InvalidRequest(kind, str(exc)) from None
        return self.compiler.submit(kind, pattern)
