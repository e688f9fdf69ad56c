"""JSON extraction with a schema and a typed integer, constrained by the engine's FSM."""

import json

import sgl_lite as sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "price": {"type": "number"},
        "in_stock": {"type": "boolean"},
    },
    "required": ["product", "price", "in_stock"],
}


@sgl.function
def extract(s, text):
    s += sgl.user(f"Extract product, price and in_stock as JSON from: {text}")
    s += sgl.assistant(sgl.gen("item", max_tokens=64, json_schema=SCHEMA, temperature=0))
    s += sgl.user("How many words were in the text? Answer with a number.")
    s += sgl.assistant(sgl.gen_int("words", max_tokens=6, temperature=0))


def main():
    runtime = sgl.Runtime()
    texts = [
        "The blue kettle costs $24.99 and ships today.",
        "Sold out: the walnut desk lamp, was 59 euros.",
    ]
    for state in extract.run_batch([{"text": t} for t in texts], backend=runtime):
        print(json.loads(state["item"]), "| words:", state["words"])
    runtime.shutdown()


if __name__ == "__main__":
    main()
