"""engine.cache_tree() and GET /cache_tree against the live radix cache of the embedded SmolLM2."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx

import sgl_lite as sgl
from sgl_lite.cache_view import cached_sequences, show_cache
from sgl_lite.server import create_app
from tests.support.server import serve

GREEDY = {"temperature": 0, "max_new_tokens": 4}
SYSTEM = "You are a terse assistant. Answer in one word.\nQuestion: "


def match_len(tree: dict, ids: list[int]) -> int:
    """Longest prefix of `ids` held by the JSON tree (the radix walk, done on the copy)."""
    nodes, node, pos = tree["nodes"], tree["nodes"][0], 0
    while True:
        child = next(
            (
                nodes[c]
                for c in node["children"]
                if pos < len(ids) and nodes[c]["token_ids"][0] == ids[pos]
            ),
            None,
        )
        if child is None:
            return pos
        key = child["token_ids"]
        common = 0
        while common < len(key) and pos + common < len(ids) and key[common] == ids[pos + common]:
            common += 1
        pos += common
        if common < len(key):
            return pos
        node = child


def path_nodes(tree: dict, ids: list[int]) -> list[dict]:
    """The nodes wholly on the path of `ids`."""
    nodes, node, pos, out = tree["nodes"], tree["nodes"][0], 0, []
    while True:
        kids = [nodes[c] for c in node["children"]]
        child = next((k for k in kids if ids[pos : pos + k["num_tokens"]] == k["token_ids"]), None)
        if child is None:
            return out
        out.append(child)
        node, pos = child, pos + child["num_tokens"]


def test_cache_tree_matches_the_cache_after_a_scripted_sequence(idle_engine, smollm_tokenizer):
    eng, tok = idle_engine, smollm_tokenizer
    prompts = [SYSTEM + "Capital of France?", SYSTEM + "Colour of the sky?", "Unrelated text"]
    ids = [tok.encode(p) for p in prompts]
    outs = [eng.generate(input_ids=i, sampling_params=GREEDY) for i in ids]
    tree = eng.cache_tree(snippet_chars=10_000)
    info = eng.get_server_info()

    # Token counts: the JSON holds exactly what the tree holds.
    assert tree["cached_tokens"] == info["cached_tokens"]
    assert sum(n["num_tokens"] for n in tree["nodes"]) == info["cached_tokens"]
    # A finished request leaves its prompt and output in the tree, all but the last sampled
    # token (whose K/V was never computed).
    expected = {tuple((i + o["output_ids"])[:-1]) for i, o in zip(ids, outs)}
    assert set(map(tuple, cached_sequences(tree))) == expected
    # The shared system prompt is one node with both questions below it.
    common = 0
    while ids[0][common] == ids[1][common]:
        common += 1
    (shared,) = [n for n in tree["nodes"] if n["prefix_len"] == common and n["id"]]
    assert len(shared["children"]) == 2 and shared["depth"] == 1
    # Snippets decode the node's own tokens: along a path they spell the sequence.
    for seq in cached_sequences(tree):
        assert "".join(n["text"] for n in path_nodes(tree, seq)) == tok.decode(seq)
    assert tree["protected_tokens"] == 0 and all(n["lock_ref"] == 0 for n in tree["nodes"])

    # Re-sending the first prompt finds what the JSON said was cached, and counts hits.
    before = {n["prefix_len"]: n["hits"] for n in path_nodes(tree, ids[0])}
    again = eng.generate(input_ids=ids[0], sampling_params=GREEDY)
    hit = again["meta_info"]["cached_tokens"]
    assert hit == min(match_len(tree, ids[0]), len(ids[0]) - 1) > len(SYSTEM) // 8
    after = eng.cache_tree()
    for node in path_nodes(after, ids[0]):
        if node["prefix_len"] in before and node["prefix_len"] <= hit:  # on the matched part
            assert node["hits"] > before[node["prefix_len"]]
    assert after["lookups"] > tree["lookups"]


def test_cache_tree_shows_the_locks_of_a_running_request(idle_engine, smollm_tokenizer):
    eng, tok = idle_engine, smollm_tokenizer
    ids = tok.encode(SYSTEM + "Name a planet.")
    stream = eng.generate(
        input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 64}, stream=True
    )
    try:
        first = next(stream)
        tree = eng.cache_tree()
    finally:
        stream.close()  # aborts the request: its slots come back
    assert first["meta_info"]["finish_reason"] is None
    locked = [n for n in tree["nodes"] if n["lock_ref"] > 0]
    assert locked and tree["protected_tokens"] == sum(n["num_tokens"] for n in locked)
    # The locked nodes are one path from the root, along the running request's tokens.
    deepest = max(locked, key=lambda n: n["depth"])
    assert [n["id"] for n in path_nodes(tree, ids + first["output_ids"])][: len(locked)] == [
        n["id"] for n in sorted(locked, key=lambda n: n["depth"])
    ]
    assert deepest["depth"] == len(locked)


def test_get_cache_tree_over_http_behind_the_api_key(idle_engine, smollm_tokenizer, tmp_path):
    eng = idle_engine
    eng.generate(SYSTEM + "Largest ocean?", GREEDY)
    eng.generate(SYSTEM + "Smallest prime?", GREEDY)
    with serve(create_app(eng, api_key="sk-test")) as url:
        assert httpx.get(f"{url}/cache_tree").status_code == 401
        auth = {"Authorization": "Bearer sk-test"}
        response = httpx.get(f"{url}/cache_tree", headers=auth, timeout=30)
        assert response.status_code == 200
        assert response.json() == eng.cache_tree()
        bad = httpx.get(f"{url}/cache_tree?snippet_chars=0", headers=auth, timeout=30)
        assert bad.status_code == 400 and "snippet_chars" in bad.json()["error"]["message"]
        svg = show_cache(url, tmp_path / "cache.svg", api_key="sk-test")
        text = show_cache(url, tmp_path / "cache.txt", api_key="sk-test")
        endpoint = sgl.RuntimeEndpoint(url, api_key="sk-test")  # the DSL's client works too
        assert show_cache(endpoint, tmp_path / "again.txt") == text
    root = ET.fromstring(svg)
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "node"]
    tree = eng.cache_tree()
    assert len(groups) == tree["num_nodes"] + 1 >= 4
    assert "shared ×2" in svg and "shared by 2" in text


def test_cache_tour_example_runs_its_four_steps(tmp_path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    svg = tmp_path / "tour.svg"
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "cache_tour.py"), "--svg", str(svg)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for title in ("1. insert", "2. edge split", "3. longest-prefix match", "4. eviction"):
        assert f"=== {title}" in done.stdout
    assert "shared by 2" in done.stdout and "evicted so far" in done.stdout
    ET.parse(svg)
