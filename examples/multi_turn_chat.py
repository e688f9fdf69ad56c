"""Multi-turn chat: each turn reuses the previous ones from the prefix cache."""

import sgl_lite as sgl


@sgl.function
def chat(s, questions):
    s += sgl.system("You are a helpful assistant. Answer in one sentence.")
    for i, q in enumerate(questions):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=48, temperature=0))


def main():
    runtime = sgl.Runtime()
    questions = [
        "What is the largest planet?",
        "How many moons does it have?",
        "Which one is the biggest?",
    ]
    state = chat.run(questions=questions, backend=runtime)
    for m in state.messages():
        print(f"{m['role']:>9}: {m['content']}")
    for i in range(len(questions)):
        meta = state.get_meta_info(f"answer_{i}")
        print(f"turn {i}: prompt {meta['prompt_tokens']} tokens, cached {meta['cached_tokens']}")
    runtime.shutdown()


if __name__ == "__main__":
    main()
