"""The same DSL against a server: start `python -m sgl_lite.launch_server --port 30000`, then

python examples/server_client.py --url http://127.0.0.1:30000
"""

import argparse

import sgl_lite as sgl


@sgl.function
def qa(s, question):
    s += sgl.system("Answer briefly.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=48, temperature=0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    questions = ["What is the capital of Italy?", "What is the boiling point of water?"]
    for state in qa.run_batch([{"question": q} for q in questions]):
        print(
            state["answer"].strip(),
            "|",
            state.get_meta_info("answer").get("cached_tokens"),
            "cached tokens",
        )
    print("cache hit rate", sgl.get_server_info().get("cache_hit_rate"))


if __name__ == "__main__":
    main()
