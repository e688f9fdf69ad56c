"""The tokenizer protocols (sgl_lite/common/tokenizer.py) against the tokenizers the engine runs:
transformers' (the tiny BPE one, a `PreTrainedTokenizerFast`) and the tests' `ByteTokenizer`.

Statically, `as_protocols` and the typed assignment of a `ByteTokenizer` are the check:
`mypy tests/unit/test_tokenizer_protocol.py` rejects them if either tokenizer stops satisfying
its protocol (`make lint` checks transformers' `PreTrainedTokenizerBase` against `Tokenizer`
where `backend/engine/setup.py` loads one). At run time each
protocol method's every parameter, passed as the protocol allows (positional-only ones by
position, the others by name, one extra keyword where it takes `**kwargs`), must bind to the
tokenizer's own signature, and each member is called as the seams call it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from sgl_lite.common.tokenizer import ChatTokenizer, Tokenizer
from tests.support.fakes import BOS, EOS, ByteTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

TEXT = "The capital of France is Paris. é"  # a two-byte character too


def as_protocols(hf: PreTrainedTokenizerFast) -> tuple[Tokenizer, ChatTokenizer]:
    """The typed assignments mypy checks for transformers' tokenizer: it is both."""
    return hf, hf


def members(protocol: type) -> set[str]:
    """The protocol's public members, its bases' included."""
    return {
        name
        for cls in protocol.__mro__
        if getattr(cls, "_is_protocol", False) and cls is not object
        for name in vars(cls)
        if not name.startswith("_")
    }


def unbindable(protocol: type, tokenizer: object) -> list[str]:
    """The protocol members `tokenizer` lacks or whose parameters its signature cannot take."""
    problems = []
    for name in sorted(members(protocol)):
        declared = inspect.getattr_static(protocol, name)
        if not hasattr(tokenizer, name):
            problems.append(f"{name}: missing")
            continue
        if isinstance(declared, property):
            continue
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for p in list(inspect.signature(declared).parameters.values())[1:]:
            if p.kind is p.POSITIONAL_ONLY:
                args.append(None)
            elif p.kind is p.VAR_KEYWORD:
                kwargs["extra_template_variable"] = None
            else:
                kwargs[p.name] = None
        try:
            inspect.signature(getattr(tokenizer, name)).bind(*args, **kwargs)
        except TypeError as exc:
            problems.append(f"{name}: {exc}")
    return problems


def test_the_protocols_hold_what_the_seams_call():
    assert members(Tokenizer) == {"encode", "decode", "eos_token_id", "bos_token_id"}
    assert members(ChatTokenizer) == members(Tokenizer) | {"apply_chat_template"}


def test_transformers_tokenizer_satisfies_both(tiny_tokenizer):
    tok, chat = as_protocols(tiny_tokenizer)
    assert unbindable(Tokenizer, tok) == []
    assert unbindable(ChatTokenizer, chat) == []
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == TEXT
    im_start, im_end = tok.encode("<|im_start|><|im_end|>", add_special_tokens=False)
    assert (tok.bos_token_id, tok.eos_token_id) == (im_start, im_end)
    assert tok.decode([im_start, *ids], skip_special_tokens=True) == TEXT
    text = chat.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_byte_tokenizer_is_a_tokenizer_not_a_chat_tokenizer():
    tok: Tokenizer = ByteTokenizer()  # the typed assignment mypy checks
    assert unbindable(Tokenizer, tok) == []
    assert unbindable(ChatTokenizer, tok) == ["apply_chat_template: missing"]
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids) == TEXT
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS, EOS)
    assert tok.decode([BOS, *ids, EOS], skip_special_tokens=True) == TEXT


def test_a_tokenizer_whose_parameters_differ_is_caught():
    class Positional:
        eos_token_id = bos_token_id = None

        def encode(self, text: str) -> list[int]:  # no add_special_tokens
            return []

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return ""

        def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool) -> str:
            return ""  # `conversation` by another name, no template variables

    problems = unbindable(ChatTokenizer, Positional())
    assert [p.split(":")[0] for p in problems] == ["apply_chat_template", "encode"]
