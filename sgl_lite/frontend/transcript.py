"""Transcript: a program's text and chat messages, built by adding text and role markers.

Shared by the interpreter (which runs programs) and the tracer (which finds a batch's constant
prefix), so both render roles and the default system prompt the same way.
"""

from __future__ import annotations

import copy

from sgl_lite.frontend.backends.base import Prompt
from sgl_lite.frontend.chat_template import ChatTemplate


class Transcript:
    """The text and closed messages built so far, and the role that is open."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.text = template.begin_text
        self.messages: list[dict[str, str]] = []
        self.role: str | None = None
        self.role_start = 0

    def copy(self) -> Transcript:
        """An independent copy (for a fork)."""
        other = copy.copy(self)
        other.messages = [dict(m) for m in self.messages]
        return other

    def fill(self, text: str) -> None:
        """Appends text (to the open message, if any)."""
        self.text += text

    def role_begin(self, role: str) -> None:
        """Opens a message of `role` (after the default system message, if one is due)."""
        if self.role is not None:
            raise ValueError(
                f"nested roles: {role} begins while {self.role} is open; end {self.role} first"
            )
        default = self.template.default_system_prompt
        if not self.messages and role != "system" and default is not None:
            # NOTE: as the tokenizer's template does: a conversation that does not start with
            # a system message gets the template's default one.
            self.role_begin("system")
            self.fill(default)
            self.role_end("system")
        previous = self.messages[-1]["role"] if self.messages else None
        prefix = self.template.prefix_after(previous, role)
        self.text += prefix
        self.role, self.role_start = role, len(self.text)

    def role_end(self, role: str) -> None:
        """Closes the open message, which must be of `role`."""
        if self.role != role:
            raise ValueError(
                f"{role}_end() without a matching {role}_begin() (the open role is {self.role!r})"
            )
        content = self.text[self.role_start :]
        self.text += self.template.get_prefix_and_suffix(role)[1]
        self.messages.append({"role": role, "content": content})
        self.role = None

    def prompt(self) -> Prompt:
        """What a backend gets: the text, the closed messages and the open one."""
        return Prompt(
            text=self.text,
            messages=tuple(dict(m) for m in self.messages),
            open_role=self.role,
            open_content=self.text[self.role_start :] if self.role else "",
        )
