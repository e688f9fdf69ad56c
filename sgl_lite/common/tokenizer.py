"""What sgl_lite calls on a tokenizer: `Tokenizer` (the engine's needs) and `ChatTokenizer` (plus
the chat template, for the server's chat routes and the frontend's role markers).

Structural protocols, so transformers' tokenizers (both) and the tests' `ByteTokenizer`
(`Tokenizer`) satisfy them without inheriting anything. They live in `sgl_lite.common`
(standard library only) because every layer that hands a tokenizer on imports from here: the
engine, the scheduler's detokenizer, the server and the frontend, which may not import
`sgl_lite.backend`.

Members hold only what the code calls. Others it reads with `getattr` and a default
(`chat_template`, `bos_token`, `all_special_tokens`, ...), so they are optional and not here.
`decode` and `apply_chat_template` return `str | Any`: the seams call them for text (one id
list; `tokenize=False`), while transformers declares a union for its batched and tokenized
forms; the `Any` member keeps transformers' tokenizers assignable and callers still see `str`.
Not `runtime_checkable`: nothing needs `isinstance`, and from Python 3.12 that check looks
attributes up statically, missing transformers' special-token ids (served by `__getattr__`).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

__all__ = ["ChatTokenizer", "Tokenizer"]


class Tokenizer(Protocol):
    """Text to token ids and back, and the special ids the engine ends or starts a sequence
    with: what the engine, its detokenizer and select scoring call."""

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id (a finish reason besides the model config's), if any."""
        ...

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id (select's unconditional scores start with it), if any."""
        ...

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]:
        """`text`'s token ids. Callers always say whether to add special tokens: the default
        differs between tokenizers (transformers: True)."""
        ...

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool = False) -> str | Any:
        """The text of `ids` (special tokens left out with `skip_special_tokens`)."""
        ...


class ChatTokenizer(Tokenizer, Protocol):
    """A `Tokenizer` that renders a conversation through its chat template: what the server's
    chat, responses, rerank and /tokenize routes and the frontend's `from_tokenizer` call."""

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        *,
        tokenize: Literal[False],
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | Any:
        """The conversation as prompt text; `kwargs` are extra template variables (`tools`,
        `continue_final_message`, a request's `chat_template_kwargs`). `conversation` is
        transformers' name for it: beside `**kwargs` it may not be positional-only."""
        ...
