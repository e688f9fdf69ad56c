"""Streaming: print tokens as they arrive, synchronously and with asyncio."""

import asyncio

import sgl_lite as sgl


@sgl.function
def story(s, subject):
    s += sgl.user(f"Write two sentences about {subject}.")
    s += sgl.assistant(sgl.gen("story", max_tokens=64, temperature=0))


async def stream_async(runtime):
    state = story.run(subject="a lighthouse", stream=True, backend=runtime)
    async for chunk in state.text_async_iter("story"):
        print(chunk, end="", flush=True)
    print()


def main():
    runtime = sgl.Runtime()
    state = story.run(subject="a robot", stream=True, backend=runtime)
    for chunk in state.text_iter("story"):
        print(chunk, end="", flush=True)
    print()
    asyncio.run(stream_async(runtime))
    runtime.shutdown()


if __name__ == "__main__":
    main()
