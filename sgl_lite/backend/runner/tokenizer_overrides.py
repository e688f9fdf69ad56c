"""SGLang's `--tokenizer-path` and `--chat-template`: a tokenizer from elsewhere, another template.

`chat_template` is Jinja source, a `.jinja` file, or a `.json` file holding a `chat_template`
field; the result replaces the tokenizer's own template, so `/v1/chat/completions` and the DSL's
derived template both follow it. SGLang's template names (chatml, llama-3-instruct, ...) are
the frontend's data: `launch_server` looks them up there and passes `jinja_from_roles`' Jinja
down, so this backend module never imports the frontend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def jinja_from_roles(
    roles: dict[str, tuple[str, str]], default_system_prompt: str | None = None, begin: str = ""
) -> str:
    """Jinja that renders messages as role prefix + content + role suffix, with a default
    system prompt when the first message is not one (JSON literals are valid Jinja string
    literals, so every marker survives escaping)."""
    prefix = json.dumps({r: p for r, (p, _) in roles.items()})
    suffix = json.dumps({r: s for r, (_, s) in roles.items()})
    system = json.dumps(default_system_prompt or "")
    return (
        f"{{%- set P = {prefix} -%}}{{%- set S = {suffix} -%}}{{{{ {json.dumps(begin)} }}}}"
        f"{{%- if messages and messages[0]['role'] != 'system' and {system} -%}}"
        f"{{{{ P['system'] + {system} + S['system'] }}}}{{%- endif -%}}"
        "{%- for m in messages -%}{{ P[m['role']] + m['content'] + S[m['role']] }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ P['assistant'] }}{%- endif -%}"
    )


def resolve_chat_template(value: str) -> str:
    """Jinja source for a `chat_template` value; ValueError naming what was expected."""
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"chat_template {value!r} is neither Jinja source nor a file; pass a .jinja file, "
            "a .json file with a 'chat_template' field, or Jinja (launch_server's "
            "--chat-template also takes SGLang's template names)"
        )
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text
    template = json.loads(text).get("chat_template")
    if not isinstance(template, str):
        raise ValueError(f"chat template file {path} has no string field 'chat_template'")
    return template


def load_tokenizer_with_overrides(
    model_folder: Path,
    tokenizer_path: str | None = None,
    chat_template: str | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedTokenizerBase:
    """The model's tokenizer, or the one at `tokenizer_path`, with `chat_template` applied."""
    from transformers import AutoTokenizer

    source = Path(tokenizer_path).expanduser() if tokenizer_path else model_folder
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ValueError(
            f"tokenizer_path {str(source)!r} has no loadable tokenizer: {exc}"
        ) from exc
    if chat_template is not None:
        tokenizer.chat_template = resolve_chat_template(chat_template)
    return tokenizer
