"""RequestBuilder: checks a caller's generate() arguments and turns them into Req objects.

Everything a caller can get wrong is caught here, in the caller's thread, with an
`InvalidRequest` that names the field and says what is allowed, so bad input never reaches
the engine loop.
"""

from __future__ import annotations

import itertools
import uuid
from concurrent.futures import Future
from typing import Any

import torch

from sgl_lite.backend.config import EngineConfig
from sgl_lite.backend.constrained import Grammar, GrammarCompiler
from sgl_lite.backend.errors import InvalidRequest
from sgl_lite.backend.sampling_params import SamplingParams
from sgl_lite.backend.scheduler import custom_logits
from sgl_lite.backend.scheduler.logprobs import LogprobState
from sgl_lite.backend.types import Req

_rid_counter = itertools.count()


def new_rid() -> str:
    """A fresh request id."""
    return f"{uuid.uuid4().hex[:16]}-{next(_rid_counter)}"


class RequestBuilder:
    """Validation of inputs and construction of requests (with grammar compile started)."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: Any,
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

    def build(
        self,
        *,
        prompt: str | list[str] | None,
        input_ids: list[int] | list[list[int]] | None,
        sampling_params: dict | list[dict] | None,
        return_logprob: bool,
        logprob_start_len: int,
        top_logprobs_num: int,
        return_text_in_logprobs: bool,
        stream: bool,
        rid: str | list[str] | None,
        custom_logit_processor: str | list[str | None] | None = None,
        token_ids_logprob: list[int] | None = None,
    ) -> tuple[list[list[Req]], bool]:
        """Returns (the requests of each prompt (n each), whether the input was a list)."""
        chosen_ids = self._chosen_ids(token_ids_logprob) if return_logprob else None
        token_lists, batched = self._token_lists(prompt, input_ids)
        processors = self._processors(custom_logit_processor, len(token_lists))
        params_list = (
            sampling_params
            if isinstance(sampling_params, list)
            else ([sampling_params] * len(token_lists))
        )
        if len(params_list) != len(token_lists):
            raise InvalidRequest(
                "sampling_params",
                f"sampling_params has {len(params_list)} entries for {len(token_lists)} prompts",
            )
        rids = rid if isinstance(rid, list) else [rid] * len(token_lists)
        if len(rids) != len(token_lists):
            raise InvalidRequest(
                "rid", f"rid has {len(rids)} entries for {len(token_lists)} prompts"
            )
        if not isinstance(top_logprobs_num, int) or top_logprobs_num < 0:
            raise InvalidRequest(
                "top_logprobs_num",
                f"top_logprobs_num must be an int >= 0, got {top_logprobs_num!r}",
            )
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise InvalidRequest(
                "logprob_start_len",
                f"logprob_start_len must be -1 or >= 0, got {logprob_start_len!r}",
            )
        groups = []
        for ids, raw_params, req_rid, processor in zip(token_lists, params_list, rids, processors):
            params = SamplingParams.from_dict(raw_params)
            self._check_fits(ids, params, "prompt" if prompt is not None else "input_ids")
            if logprob_start_len > len(ids):
                raise InvalidRequest(
                    "logprob_start_len",
                    f"logprob_start_len {logprob_start_len} is past the prompt's {len(ids)} tokens",
                )
            # SGLang: -1 with return_logprob means "from the last prompt token" (one entry).
            start = logprob_start_len if logprob_start_len >= 0 else len(ids) - 1
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
                            start, top_logprobs_num, return_text_in_logprobs, chosen_ids
                        )
                        if return_logprob
                        else None,
                        stream=stream,
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
        return groups, batched

    def _chosen_ids(self, token_ids: Any) -> tuple[int, ...] | None:
        """SGLang's `token_ids_logprob`: ids whose logprobs each output position reports."""
        if token_ids is None or (isinstance(token_ids, list) and not token_ids):
            return None
        if not isinstance(token_ids, list) or any(
            isinstance(t, bool) or not isinstance(t, int) for t in token_ids
        ):
            raise InvalidRequest(
                "token_ids_logprob", f"token_ids_logprob must be a list of ints, got {token_ids!r}"
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(
                "token_ids_logprob",
                f"Token ID {bad[0]} is out of vocabulary (vocab size: {self.vocab_size})",
            )
        return tuple(token_ids)

    def _processors(
        self, wire: Any, prompts: int
    ) -> list[custom_logits.CustomLogitProcessor | None]:
        """Each prompt's custom logit processor, loaded (one string for all, or one per prompt;
        SGLang's), or a 400-worthy InvalidRequest: not enabled, no dill, a bad string."""
        if wire is None or wire == []:
            return [None] * prompts
        field = custom_logits.FIELD
        wires = wire if isinstance(wire, list) else [wire] * prompts
        if len(wires) != prompts:
            raise InvalidRequest(field, f"{field} has {len(wires)} entries for {prompts} prompts")
        if any(w is not None and not isinstance(w, str) for w in wires):
            raise InvalidRequest(field, f"{field} must be a string (or a list, one per prompt)")
        if all(w is None for w in wires):
            return [None] * prompts
        if not self.config.enable_custom_logit_processor:
            raise InvalidRequest(field, custom_logits.NOT_ENABLED)
        return [None if w is None else custom_logits.load_processor(w) for w in wires]

    def _token_lists(self, prompt: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest(
                "prompt" if prompt is None else "input_ids",
                "give exactly one of prompt (text) and input_ids",
            )
        if prompt is not None:
            batched = isinstance(prompt, list)
            texts = prompt if batched else [prompt]
            if not texts or not all(isinstance(t, str) for t in texts):
                raise InvalidRequest(
                    "prompt", "prompt must be a non-empty string or a list of them"
                )
            if any(not t for t in texts):
                raise InvalidRequest("prompt", "prompt must not be empty")
            return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts], batched
        if not isinstance(input_ids, list) or not input_ids:
            raise InvalidRequest(
                "input_ids", "input_ids must be a non-empty list of token ids (or of lists)"
            )
        batched = isinstance(input_ids[0], list)
        lists = input_ids if batched else [input_ids]
        for ids in lists:
            if not isinstance(ids, list) or not ids:
                raise InvalidRequest("input_ids", "input_ids must not contain an empty list")
            bad = [
                t
                for t in ids
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
            ]
            if bad:
                raise InvalidRequest(
                    "input_ids",
                    f"input_ids contains {bad[0]!r}, outside the vocabulary [0, {self.vocab_size})",
                )
        return lists, batched

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


def generate_args(
    prompt: str | list[str] | None = None,
    sampling_params: dict | list[dict] | None = None,
    input_ids: list[int] | list[list[int]] | None = None,
    return_logprob: bool = False,
    logprob_start_len: int = -1,
    top_logprobs_num: int = 0,
    return_text_in_logprobs: bool = False,
    stream: bool = False,
    rid: str | list[str] | None = None,
    custom_logit_processor: str | list[str | None] | None = None,
    token_ids_logprob: list[int] | None = None,
) -> dict[str, Any]:
    """`Engine.generate`'s arguments by name, positional ones in its order (one signature for
    every way in)."""
    return dict(locals())
