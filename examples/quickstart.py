"""sgl_lite quickstart: a multi-step pipeline, a JSON extraction with a schema, and a select
evaluation, all on the embedded SmolLM2 model (no arguments; SGL_LITE_NUM_THREADS sets threads).

    python examples/quickstart.py
"""

import json

import sgl_lite as sgl


@sgl.function
def pipeline(s, topic):
    s += sgl.system("You are a concise assistant.")
    s += sgl.user(f"Give one short fact about {topic}.")
    s += sgl.assistant(sgl.gen("fact", max_tokens=48, temperature=0))
    s += sgl.user("Now turn that fact into a question for a quiz.")
    s += sgl.assistant(sgl.gen("question", max_tokens=48, temperature=0))


PERSON_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "city": {"type": "string"},
        },
        "required": ["name", "age", "city"],
    }
)


@sgl.function
def extract(s, text):
    s += sgl.user(f"Extract the person as JSON (name, age, city): {text}")
    s += sgl.assistant(sgl.gen("json", max_tokens=64, json_schema=PERSON_SCHEMA, temperature=0))


@sgl.function
def classify(s, review):
    s += sgl.user(f"Is this review positive or negative?\n{review}")
    s += sgl.assistant("The review is " + sgl.select("label", choices=["positive", "negative"]))


def cache_line():
    info = sgl.get_server_info()
    return f"cache hit rate {info.get('cache_hit_rate', 0):.1%}"


def main():
    runtime = sgl.Runtime()
    sgl.set_default_backend(runtime)

    state = pipeline.run(topic="the Moon")
    print("== pipeline ==")
    print("fact:    ", state["fact"].strip())
    print("question:", state["question"].strip())
    print("tokens:  ", state.get_meta_info("question"))
    print(cache_line())

    print("== JSON extraction ==")
    state = extract.run(text="Maria Lopez, 34, moved to Lisbon last spring.")
    print(json.loads(state["json"]))
    print(cache_line())

    print("== select evaluation ==")
    reviews = [
        ("I loved every minute of it.", "positive"),
        ("Terrible service, never again.", "negative"),
        ("Great value and friendly staff.", "positive"),
        ("The food was cold and bland.", "negative"),
    ]
    states = classify.run_batch([{"review": r} for r, _ in reviews], progress_bar=True)
    correct = sum(s["label"] == gold for s, (_, gold) in zip(states, reviews))
    for s, (r, gold) in zip(states, reviews):
        print(f"  {s['label']:8s} (gold {gold:8s}) {r}")
    print(f"accuracy {correct}/{len(reviews)}; {cache_line()}")
    runtime.shutdown()


if __name__ == "__main__":
    main()
