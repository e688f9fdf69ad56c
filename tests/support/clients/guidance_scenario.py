"""Guidance's SGLang client against our server, run by .venv-clients' python
(tests/e2e/test_clients_guidance.py): `python guidance_scenario.py URL` runs
`guidance.models.experimental.SglangModel` programs in a chat (the OpenAI chat API with SGLang's
extra body fields): a regex (`extra_body.regex`), a `select` and a grammar of `gen`s (both sent
as llguidance's Lark in `extra_body.ebnf`), and a JSON Schema (`response_format` strict), and
prints one JSON line: each capture as the client read it back.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version


def main(url: str) -> None:
    """Runs the programs against `url` and prints the captures."""
    import guidance
    from guidance import assistant, gen, regex, select, user
    from guidance.models.experimental import SglangModel

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"],
    }
    model = SglangModel("default", base_url=f"{url}/v1", api_key="unused", echo=False)
    # NOTE: Guidance 0.3.1 sends a temperature only when it is truthy (`if node.temperature:`),
    # so 0.0 is dropped and the server samples at its default; the checks are the constraints'
    greedy = {"temperature": 0.0, "max_tokens": 24}
    out: dict[str, object] = {"__version__": version("guidance")}

    with user():
        lm = model + "What year is it?"
    with assistant():
        lm += regex(r"20[0-9]{2}", name="year")
    out["regex"] = lm["year"]

    with user():
        lm = model + "Is the sky blue? Answer yes or no."
    with assistant():
        lm += select(["yes", "no"], name="answer")
    out["select"] = lm["answer"]

    with user():
        lm = model + "Name a city and a number."
    with assistant():
        lm += (
            "City: "
            + gen(regex=r"[A-Z][a-z]{2,9}", name="city")
            + ", n="
            + gen(regex=r"[0-9]{1,3}", name="n")
        )
    out["grammar"] = {"city": lm["city"], "n": lm["n"], "text": str(lm)}

    with user():
        lm = model + "Which city is the Eiffel Tower in? Answer as JSON."
    with assistant():
        lm += guidance.json(schema=schema, name="obj", **greedy)
    out["json"] = lm["obj"]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
