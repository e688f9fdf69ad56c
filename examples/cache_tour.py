"""A tour of RadixAttention's prefix cache on a live engine: insert, edge split, longest-prefix
match and LRU eviction, with the tree printed after each step.

    python examples/cache_tour.py [--svg cache.svg]

The engine gets a KV pool of only 192 tokens, so the last step has to evict. Every request is
greedy with a few new tokens; the whole tour takes seconds once the model is loaded.
"""

from __future__ import annotations

import argparse

import sgl_lite as sgl
from sgl_lite.backend.engine import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 3}
SHARED = "You are a museum guide. Answer each visitor in one short sentence.\nVisitor: "


def step(title: str, explanation: str) -> None:
    print(f"\n=== {title} " + "=" * max(60 - len(title), 0))
    print(explanation)


def ask(engine: Engine, prompt: str | None = None, input_ids: list[int] | None = None) -> dict:
    """One greedy request; prints how much of its prompt the cache already held."""
    meta = engine.generate(prompt, GREEDY, input_ids=input_ids)["meta_info"]
    print(
        f"  request: {meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} found in "
        f"the cache, {meta['completion_tokens']} generated"
    )
    return meta


def shared_nodes(engine: Engine) -> list[dict]:
    """Nodes with more than one continuation: the prefixes that requests share."""
    return [n for n in engine.cache_tree()["nodes"] if n["id"] and len(n["children"]) > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--svg", help="also draw the final tree into this SVG file")
    args = parser.parse_args()
    engine = Engine(max_total_tokens=192, log_level="warning")
    try:
        tour(engine)
        if args.svg:
            sgl.show_cache(engine, args.svg)
            print(f"\nthe final tree is drawn in {args.svg}")
    finally:
        engine.shutdown()


def tour(engine: Engine) -> None:
    step(
        "1. insert",
        "A finished request leaves its tokens in the tree: prompt and output, all but the\n"
        "last sampled token (its K/V was never computed). The first request finds nothing.",
    )
    first = ask(engine, SHARED + "Where is the Mona Lisa?")
    assert first["cached_tokens"] == 0
    sgl.show_cache(engine)

    step(
        "2. edge split",
        "A second prompt shares the guide's instructions but asks another question. Its walk\n"
        "down the tree stops in the middle of the first edge, so that edge is split in two:\n"
        "the shared prefix becomes its own node with both questions below it.",
    )
    second = ask(engine, SHARED + "Who painted the Night Watch?")
    assert second["cached_tokens"] > 0
    assert len(shared_nodes(engine)) == 1
    sgl.show_cache(engine)

    step(
        "3. longest-prefix match",
        "A follow-up to the first question walks the tree as far as its tokens agree: the\n"
        "instructions, then the first question. The old answer differs from the follow-up, so\n"
        "the walk ends at the question's node, only the rest is computed, and the rest becomes\n"
        "a new branch beside the old answer. The hit counts on the matched path go up, and so\n"
        "does its last-access time.",
    )
    follow_up = ask(engine, SHARED + "Where is the Mona Lisa? And how old is it?")
    assert follow_up["cached_tokens"] > second["cached_tokens"]
    sgl.show_cache(engine)

    step(
        "4. eviction",
        "The pool holds 192 tokens. An unrelated prompt a few tokens longer than the free pool\n"
        "makes the tree give back unlocked leaves, least recently used first: the first\n"
        "answer (last used in step 1), then the Night Watch branch (step 2). The follow-up\n"
        "that step 3 just used, and the shared instructions above it, stay. (Nodes are not\n"
        "merged back after an eviction: a node with one child is still a valid radix tree.)",
    )
    info = engine.get_server_info()
    free, before = info["pool_free_tokens"], info["evicted_tokens"]
    ids = engine.tokenizer.encode(" art" * (free + 4), add_special_tokens=False)[: free + 4]
    ask(engine, input_ids=ids)
    evicted = engine.get_server_info()["evicted_tokens"] - before
    print(f"  {free} slots were free; evicted {evicted} cached tokens to make room")
    texts = " ".join(n["text"] for n in engine.cache_tree(snippet_chars=500)["nodes"])
    assert 0 < evicted < info["cached_tokens"]
    assert "Night Watch" not in texts and "how old" in texts and "museum guide" in texts
    sgl.show_cache(engine)
    engine.check_integrity()


if __name__ == "__main__":
    main()
