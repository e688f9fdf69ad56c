"""fork: expand one prompt into parallel branches sharing its cached prefix, then join."""

import sgl_lite as sgl


@sgl.function
def tips(s, topic):
    s += sgl.user(f"Give me one tip about {topic}.")
    s += sgl.assistant("Here are two ideas.")
    forks = s.fork(2)
    forks += lambda i: sgl.user(f"Expand idea {i + 1} in one sentence.")
    forks += sgl.assistant(sgl.gen("detail", max_tokens=40, temperature=0.7))
    forks.join()
    s += sgl.user("Summarize: " + " / ".join(d.strip() for d in s["detail"]))
    s += sgl.assistant(sgl.gen("summary", max_tokens=48, temperature=0))


def main():
    runtime = sgl.Runtime()
    state = tips.run(topic="staying focused", backend=runtime)
    for i, d in enumerate(state["detail"]):
        print(f"branch {i}: {d.strip()}")
    print("summary:", state["summary"].strip())
    runtime.shutdown()


if __name__ == "__main__":
    main()
