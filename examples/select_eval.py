"""A small multiple-choice evaluation with select, comparing the three choice methods."""

import sgl_lite as sgl

QUESTIONS = [
    ("What color is the sky on a clear day?", ["blue", "green", "red"], "blue"),
    ("Which animal barks?", ["cat", "dog", "fish"], "dog"),
    ("What is 2 + 2?", ["3", "4", "5"], "4"),
    ("Which is a fruit?", ["carrot", "apple", "potato"], "apple"),
]


@sgl.function
def answer(s, question, choices, method):
    s += sgl.user(question + " Choose from: " + ", ".join(choices) + ".")
    s += sgl.assistant(sgl.select("choice", choices=choices, choices_method=method))


def main():
    runtime = sgl.Runtime()
    for method in (
        sgl.token_length_normalized,
        sgl.greedy_token_selection,
        sgl.unconditional_likelihood_normalized,
    ):
        batch = [{"question": q, "choices": c, "method": method} for q, c, _ in QUESTIONS]
        states = answer.run_batch(batch, backend=runtime)
        correct = sum(s["choice"] == gold for s, (_, _, gold) in zip(states, QUESTIONS))
        print(
            f"{method.name:38s} accuracy {correct}/{len(QUESTIONS)}", [s["choice"] for s in states]
        )
    print("cache hit rate", runtime.get_server_info().get("cache_hit_rate"))
    runtime.shutdown()


if __name__ == "__main__":
    main()
