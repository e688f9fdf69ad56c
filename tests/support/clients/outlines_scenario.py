"""Outlines 1.x against our server, run by .venv-clients' python
(tests/e2e/test_clients_outlines.py): `python outlines_scenario.py URL` drives
`outlines.from_sglang` (a pydantic model's JSON Schema, a regex, a choice, a Lark grammar, a
streamed regex), `outlines.from_openai` (the pydantic model as a strict `response_format`) and
`outlines.from_vllm` (vLLM's `structured_outputs`: json, regex, choice), and prints one JSON
line: each output as the client returned it, and the pydantic instance where the output type is
a model.
"""

from __future__ import annotations

import json
import sys
import warnings
from importlib.metadata import version
from typing import Literal

import openai
import outlines
from outlines.types import CFG, Regex
from pydantic import BaseModel, Field


class Person(BaseModel):
    """What the JSON scenarios ask for."""

    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)


PROMPT = "Extract the person as JSON: Alice is 30 years old."
DATE = r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"
# Lark (llguidance's dialect): SGLang's `ebnf` field as Outlines' from_sglang sends it
LARK = """
start: answer " " NUMBER
answer: "yes" | "no"
NUMBER: /[0-9]{1,3}/
"""


def main(url: str) -> None:
    """Runs every scenario against `url` and prints the outcomes."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    greedy = {"max_tokens": 48, "temperature": 0}
    out: dict[str, object] = {"__version__": version("outlines")}

    sglang = outlines.from_sglang(client, "default")
    text = sglang(PROMPT, Person, **greedy)
    out["sglang_json"] = {"text": text, "parsed": Person.model_validate_json(text).model_dump()}
    out["sglang_regex"] = sglang("Write today's date:", Regex(DATE), **greedy)
    out["sglang_choice"] = sglang(
        "Is the sky blue? Answer yes or no.", Literal["yes", "no"], **greedy
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Outlines warns that SGLang reads its Lark as EBNF
        out["sglang_lark"] = sglang("Is water wet? Then a number.", CFG(LARK), **greedy)
    chunks = list(sglang.stream("Write today's date:", Regex(DATE), **greedy))
    out["sglang_regex_stream"] = {"chunks": len(chunks), "text": "".join(chunks)}

    oai = outlines.from_openai(client, "default")
    text = oai(PROMPT, Person, **greedy)
    out["openai_json"] = {"text": text, "parsed": Person.model_validate_json(text).model_dump()}

    vllm = outlines.from_vllm(client, "default")
    text = vllm(PROMPT, Person, **greedy)
    out["vllm_json"] = {"text": text, "parsed": Person.model_validate_json(text).model_dump()}
    out["vllm_regex"] = vllm("Write today's date:", Regex(DATE), **greedy)
    out["vllm_choice"] = vllm("Is the sky blue? Answer yes or no.", Literal["yes", "no"], **greedy)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
