"""Chat templates: role prefixes/suffixes, stop strings and the default system prompt.

For a local tokenizer the template is derived from the tokenizer's own Jinja chat template by
rendering probe messages and cutting out the role markers, so the frontend's text is exactly
what `apply_chat_template` would produce. For remote backends SGLang's named templates are
chosen from the model path the server reports. This module knows nothing about backends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("sgl_lite")

_MARK = "\x1fSGLMARK{}\x1f"


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """How roles render as text: each role's (prefix, suffix), stop strings, the default
    system prompt, and `begin_text` (what precedes the first message)."""

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    stop_str: tuple[str, ...] = ()
    default_system_prompt: str | None = None
    # Text the template puts before the first message that the tokenizer does not add itself.
    begin_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def get_prefix_and_suffix(self, role: str) -> tuple[str, str]:
        """The text before and after a message of `role`."""
        try:
            return self.role_prefix_and_suffix[role]
        except KeyError:
            raise ValueError(
                f"chat template {self.name!r} has no role {role!r}; roles: "
                f"{sorted(self.role_prefix_and_suffix)}"
            ) from None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The prompt text for `messages`, inserting the default system prompt like the template."""
        out = [self.begin_text]
        if messages and messages[0]["role"] != "system" and self.default_system_prompt:
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        for m in messages:
            prefix, suffix = self.get_prefix_and_suffix(m["role"])
            out.append(prefix + m["content"] + suffix)
        if add_generation_prompt:
            out.append(self.get_prefix_and_suffix("assistant")[0])
        return "".join(out)


# --- derived from a tokenizer ---------------------------------------------------------------
def from_tokenizer(tokenizer: Any, name: str = "tokenizer") -> ChatTemplate:
    """Derives role markers from `tokenizer.chat_template` by rendering probe messages.

    Falls back to the `default` template (with a warning) when the tokenizer has no template
    or its template cannot render the probes (e.g. one that rejects a system message).
    """
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("tokenizer has no chat template; using sgl_lite's 'default' template")
        return TEMPLATES["default"]
    try:
        return _derive(tokenizer, name)
    except Exception as exc:
        logger.warning(
            "cannot derive roles from the tokenizer's chat template (%s); "
            "using the 'default' template",
            exc,
        )
        return TEMPLATES["default"]


def _render(tokenizer: Any, messages: list[dict[str, str]], gen_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt)


def _derive(tokenizer: Any, name: str) -> ChatTemplate:
    m0, m1, m2 = (_MARK.format(i) for i in range(3))
    sys_only = _render(tokenizer, [{"role": "system", "content": m0}])
    head, system_suffix = sys_only.split(m0)
    begin_text, system_prefix = _split_begin(head)
    roles = {"system": (system_prefix, system_suffix)}
    # A system message first, then each role: the text after the system block is that role's.
    for role, mark in (("user", m1), ("assistant", m2)):
        full = _render(
            tokenizer, [{"role": "system", "content": m0}, {"role": role, "content": mark}]
        )
        block = full.split(m0, 1)[1][len(system_suffix) :]
        prefix, suffix = block.split(mark)
        roles[role] = (prefix, suffix)
    # gen() after assistant_begin must see exactly the template's generation prompt.
    with_prompt = _render(
        tokenizer,
        [{"role": "system", "content": m0}, {"role": "user", "content": m1}],
        gen_prompt=True,
    )
    gen_prompt = with_prompt.split(m1, 1)[1][len(roles["user"][1]) :]
    if gen_prompt and gen_prompt != roles["assistant"][0]:
        logger.warning(
            "chat template's generation prompt %r differs from its assistant prefix "
            "%r; using the generation prompt",
            gen_prompt,
            roles["assistant"][0],
        )
        roles["assistant"] = (gen_prompt, roles["assistant"][1])
    # Default system prompt: the system block the template puts before a conversation without one.
    user_only = _render(tokenizer, [{"role": "user", "content": m1}])
    before_user = user_only.split(roles["user"][0] + m1, 1)[0][len(begin_text) :]
    default_system = None
    if before_user.startswith(system_prefix) and before_user.endswith(system_suffix):
        default_system = before_user[len(system_prefix) : len(before_user) - len(system_suffix)]
    stop = _stop_strings(roles["assistant"][1], getattr(tokenizer, "eos_token", None))
    # NOTE: begin_text (e.g. a BOS string) stays in the prompt text: the engine tokenizes
    # without adding special tokens, so the template's own BOS must be there.
    return ChatTemplate(
        name=name,
        role_prefix_and_suffix=roles,
        stop_str=stop,
        default_system_prompt=default_system or None,
        begin_text=begin_text,
    )


def _split_begin(head: str) -> tuple[str, str]:
    """Splits the text before the first message's content into (begin_text, system prefix).

    Templates put BOS or other preamble before the role header, which goes to begin_text.
    """
    for token in ("<|im_start|>", "<|start_header_id|>", "<|system|>", "[INST]"):
        i = head.find(token)
        if i > 0:
            return head[:i], head[i:]
    return "", head


def _stop_strings(assistant_suffix: str, eos: str | None) -> tuple[str, ...]:
    stops = []
    stripped = assistant_suffix.strip()
    if stripped:
        stops.append(stripped)
    if eos and eos not in stops:
        stops.append(eos)
    return tuple(stops)


# --- SGLang's named templates ----------------------------------------------------------------
_CHATML = {
    "system": ("<|im_start|>system\n", "<|im_end|>\n"),
    "user": ("<|im_start|>user\n", "<|im_end|>\n"),
    "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
}

TEMPLATES: dict[str, ChatTemplate] = {
    t.name: t
    for t in (
        ChatTemplate(
            name="default",
            role_prefix_and_suffix={
                "system": ("SYSTEM:", "\n"),
                "user": ("USER:", "\n"),
                "assistant": ("ASSISTANT:", "\n"),
            },
        ),
        ChatTemplate(name="chatml", role_prefix_and_suffix=_CHATML, stop_str=("<|im_end|>",)),
        ChatTemplate(
            name="qwen",
            role_prefix_and_suffix=_CHATML,
            stop_str=("<|im_end|>",),
            default_system_prompt="You are a helpful assistant.",
        ),
        ChatTemplate(
            name="smollm2",
            role_prefix_and_suffix=_CHATML,
            stop_str=("<|im_end|>",),
            default_system_prompt="You are a helpful AI assistant named SmolLM, "
            "trained by Hugging Face",
        ),
        ChatTemplate(
            name="llama-3-instruct",
            role_prefix_and_suffix={
                "system": ("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>"),
                "user": ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
                "assistant": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
            },
            stop_str=("<|eot_id|>",),
        ),
        ChatTemplate(
            name="llama-2-chat",
            role_prefix_and_suffix={
                "system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
                "user": ("[INST] ", " [/INST]"),
                "assistant": ("", " </s><s>"),
            },
            stop_str=("[INST]",),
        ),
        ChatTemplate(
            name="mistral",
            role_prefix_and_suffix={
                "system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"),
                "user": ("[INST] ", " [/INST]"),
                "assistant": ("", " </s><s>"),
            },
            stop_str=("</s>",),
        ),
    )
}


def get_chat_template(name: str) -> ChatTemplate:
    """One of SGLang's named templates (`TEMPLATES`)."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(TEMPLATES)}") from None


def get_chat_template_by_model_path(model_path: str | None) -> ChatTemplate:
    """SGLang-style guess from a model path; `default` when nothing matches."""
    path = (model_path or "").lower()
    if path in ("", "default") or "smollm" in path:
        return TEMPLATES["smollm2"] if path else TEMPLATES["default"]
    if "qwen" in path:
        return TEMPLATES["qwen"]
    if ("llama-3" in path or "llama3" in path) and "instruct" in path:
        return TEMPLATES["llama-3-instruct"]
    if "llama-2" in path and "chat" in path:
        return TEMPLATES["llama-2-chat"]
    if "mistral" in path or "mixtral" in path:
        return TEMPLATES["mistral"]
    if any(k in path for k in ("chatml", "hermes", "tinyllama", "yi-")):
        return TEMPLATES["chatml"]
    return TEMPLATES["default"]
