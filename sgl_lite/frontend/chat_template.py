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

from sgl_lite.common.tokenizer import ChatTokenizer

logger = logging.getLogger("sgl_lite")

# Probe contents: private-use characters, which no template strips as whitespace (`| trim`
# removes ASCII control characters such as \x1f) or escapes.
_MARK = "\ue000SGLMARK{}\ue001"


@dataclass(frozen=True, kw_only=True)
class ChatTemplate:
    """How roles render as text: each role's (prefix, suffix), stop strings, the default
    system prompt, and `begin_text` (what precedes the first message).

    `system_folded` marks templates without a system turn (Gemma, Mistral): the system text
    opens the first user turn (the system prefix is the user prefix, its suffix a separator),
    so a user message right after it gets no prefix of its own.
    """

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    stop_str: tuple[str, ...] = ()
    # None: no system message is inserted; "" (Llama 3.x) inserts an empty system block.
    default_system_prompt: str | None = None
    # Text the template puts before the first message that the tokenizer does not add itself.
    begin_text: str = ""
    system_folded: bool = False
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

    def prefix_after(self, previous_role: str | None, role: str) -> str:
        """The prefix of a `role` message that follows one of `previous_role` (None: first)."""
        if self.system_folded and previous_role == "system" and role == "user":
            return ""  # the folded system text already opened this user turn
        return self.get_prefix_and_suffix(role)[0]

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The prompt text for `messages`, inserting the default system prompt like the template."""
        out = [self.begin_text]
        if messages and messages[0]["role"] != "system" and self.default_system_prompt is not None:
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        previous = None
        for m in messages:
            suffix = self.get_prefix_and_suffix(m["role"])[1]
            out.append(self.prefix_after(previous, m["role"]) + m["content"] + suffix)
            previous = m["role"]
        if add_generation_prompt:
            out.append(self.prefix_after(previous, "assistant"))
        return "".join(out)


# --- derived from a tokenizer ---------------------------------------------------------------
def from_tokenizer(
    tokenizer: ChatTokenizer, name: str = "tokenizer", **template_kwargs: Any
) -> ChatTemplate:
    """Derives role markers from `tokenizer.chat_template` by rendering probe messages.

    `template_kwargs` reach the template as `apply_chat_template` passes them (e.g.
    `enable_thinking=False` for Qwen3, whose generation prompt then holds an empty think block).
    Falls back to the `default` template (with a warning) when the tokenizer has no template
    or its template cannot render the probes.
    """
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("tokenizer has no chat template; using sgl_lite's 'default' template")
        return TEMPLATES["default"]
    try:
        return _Probe(tokenizer, template_kwargs).derive(name)
    except Exception as exc:
        logger.warning(
            "cannot derive roles from the tokenizer's chat template (%s); "
            "using the 'default' template",
            exc,
        )
        return TEMPLATES["default"]


_M0, _M1, _M2, _M3 = (_MARK.format(i) for i in range(4))


def _between(text: str, before: str | None, after: str | None) -> str:
    """The text between two probe marks (None: the start / the end of `text`)."""
    start = 0 if before is None else text.index(before) + len(before)
    end = len(text) if after is None else text.index(after, start)
    return text[start:end]


def _cut(text: str, *, prefix: str = "", suffix: str = "") -> str:
    """`text` less `prefix` and `suffix`, which it must have (else the template is irregular)."""
    if not (text.startswith(prefix) and text.endswith(suffix)) or len(prefix + suffix) > len(text):
        raise ValueError(f"irregular template: {text!r} is not {prefix!r}...{suffix!r}")
    return text[len(prefix) : len(text) - len(suffix)]


class _Probe:
    """Renders probe conversations through the tokenizer's template and cuts out role markers.

    The DSL writes a conversation as begin_text, then prefix + content + suffix per message,
    then the generation prompt; every marker is cut from conversations that end in a user turn
    (what a model is asked to continue), so markers a template writes only after the final
    message (Phi's closing EOS, OLMo's last assistant turn without its newline, Qwen3's empty
    think block on a final assistant turn) do not leak into the middle of a DSL program.
    """

    def __init__(self, tokenizer: ChatTokenizer, kwargs: dict[str, Any]) -> None:
        self.tokenizer, self.kwargs = tokenizer, kwargs
        self.bos = getattr(tokenizer, "bos_token", None) or ""
        self.eos = getattr(tokenizer, "eos_token", None) or ""
        self.tail = ""
        self.tail = self._closing_tail()

    def render(self, roles: str, gen_prompt: bool = False) -> str:
        """`roles` like "sua u": s(ystem) u(ser) a(ssistant), contents _M0.._M3 in order."""
        names = {"s": "system", "u": "user", "a": "assistant"}
        messages = [
            {"role": names[r], "content": _MARK.format(i)}
            for i, r in enumerate(roles.replace(" ", ""))
        ]
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen_prompt, **self.kwargs
        )
        if not gen_prompt and self.tail and text.endswith(self.tail):
            text = text[: -len(self.tail)]
        return text

    def _closing_tail(self) -> str:
        """What the template appends to a conversation that is not continued (Phi: EOS)."""
        closed, open_ = self.render("u"), self.render("u", gen_prompt=True)
        after_closed, after_open = _between(closed, _M0, None), _between(open_, _M0, None)
        if self.eos and after_closed.endswith(self.eos) and self.eos not in after_open:
            return self.eos
        return ""

    def split_begin(self, head: str, conversation: str) -> tuple[str, str]:
        """Splits the text before the first message into (begin_text, first prefix).

        BOS is begin_text only where it appears once: SmolLM2's BOS is `<|im_start|>`, which
        opens every turn and so belongs to the role prefix.
        """
        if self.bos and head.startswith(self.bos) and conversation.count(self.bos) == 1:
            return self.bos, head[len(self.bos) :]
        return _split_begin(head)

    def derive(self, name: str) -> ChatTemplate:
        """The ChatTemplate the probes show; raises ValueError for a template it cannot cut."""
        try:
            sys_only = self.render("s")
        except Exception:  # Gemma 2 rejects a system message outright
            sys_only = ""
        if _M0 not in sys_only:
            return self._derive_folded(name)
        conversation = self.render("suau")
        begin, system_prefix = self.split_begin(_between(sys_only, None, _M0), conversation)
        system_suffix = _between(sys_only, _M0, None)
        user_block = _cut(self.render("su"), prefix=sys_only)
        user_prefix, user_suffix = _between(user_block, None, _M1), _between(user_block, _M1, None)
        assistant_prefix = _cut(_between(conversation, _M1, _M2), prefix=user_suffix)
        assistant_suffix = _cut(_between(conversation, _M2, _M3), suffix=user_prefix)
        roles = {
            "system": (system_prefix, system_suffix),
            "user": (user_prefix, user_suffix),
            "assistant": (assistant_prefix, assistant_suffix),
        }
        self._use_generation_prompt(roles, self.render("su", gen_prompt=True), _M1)
        # Default system prompt: the system block the template puts before a conversation
        # without one ("" for Llama 3.x, whose system block is always there).
        before_user = _cut(_between(self.render("u"), None, _M0), prefix=begin, suffix=user_prefix)
        default_system = None
        if before_user and before_user.startswith(system_prefix):
            default_system = _cut(before_user, prefix=system_prefix, suffix=system_suffix)
        return ChatTemplate(
            name=name,
            role_prefix_and_suffix=roles,
            stop_str=_stop_strings(assistant_suffix, self.eos),
            default_system_prompt=default_system,
            begin_text=begin,
        )

    def _derive_folded(self, name: str) -> ChatTemplate:
        """Templates without a system turn: user/assistant from a system-less conversation;
        the system text goes where the template puts it (Gemma 3, Mistral: opening the user
        turn) or, where the template rejects it (Gemma 2), where Gemma 3 puts it."""
        conversation = self.render("uau", gen_prompt=True)
        begin, user_prefix = self.split_begin(_between(conversation, None, _M0), conversation)
        user_suffix = _between(self.render("u"), _M0, None)
        assistant_prefix = _cut(_between(conversation, _M0, _M1), prefix=user_suffix)
        assistant_suffix = _cut(_between(conversation, _M1, _M2), suffix=user_prefix)
        roles = {
            "user": (user_prefix, user_suffix),
            "assistant": (assistant_prefix, assistant_suffix),
        }
        self._use_generation_prompt(roles, conversation, _M2)
        try:
            with_system = self.render("su")
        except Exception:
            with_system = ""
        if _M0 in with_system and _M1 in with_system:
            first = _cut(_between(with_system, None, _M0), prefix=begin)
            roles["system"] = (first, _between(with_system, _M0, _M1))
        else:
            roles["system"] = (user_prefix, "\n\n")
        return ChatTemplate(
            name=name,
            role_prefix_and_suffix=roles,
            stop_str=_stop_strings(assistant_suffix, self.eos),
            begin_text=begin,
            system_folded=True,
        )

    def _use_generation_prompt(
        self, roles: dict[str, tuple[str, str]], with_prompt: str, last_user_mark: str
    ) -> None:
        """gen() after assistant_begin must see exactly the template's generation prompt."""
        gen_prompt = _cut(_between(with_prompt, last_user_mark, None), prefix=roles["user"][1])
        if gen_prompt != roles["assistant"][0]:
            logger.info(
                "chat template's generation prompt %r differs from its assistant prefix %r; "
                "using the generation prompt",
                gen_prompt,
                roles["assistant"][0],
            )
            roles["assistant"] = (gen_prompt, roles["assistant"][1])


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
