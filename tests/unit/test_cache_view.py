"""cache_view: the exported radix tree as JSON, text and SVG, on a hand-built RadixCache."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

from sgl_lite.backend.engine import Engine
from sgl_lite.backend.kvcache.radix_cache import RadixCache
from sgl_lite.cache_view import (
    cached_sequences,
    render_svg,
    render_text,
    show_cache,
    snippet,
    tree_to_dict,
)
from sgl_lite.frontend.backends.engine import EngineBackend
from tests.support.fakes import ByteTokenizer, FakeRunner

SVG = "{http://www.w3.org/2000/svg}"


def decode(ids: list[int]) -> str:
    """A toy tokenizer: token t is the letter chr(ord('a') + t); 26 is a newline."""
    return "".join("\n" if t == 26 else chr(ord("a") + t) for t in ids)


def build() -> tuple[RadixCache, list[list[int]]]:
    """Two prompts sharing a prefix [0, 1, 2], a third one apart; one path locked."""
    cache = RadixCache()
    seqs = [[0, 1, 2, 3, 4], [0, 1, 2, 26, 5], [7, 8]]
    slot = 0
    for ids in seqs:
        new = torch.arange(slot, slot + len(ids))
        slot += len(ids)
        cache.insert(ids, new)
    cache.lock(cache.match_prefix([0, 1, 2, 26, 5]).node)
    return cache, seqs


def test_tree_to_dict_flattens_the_tree_in_pre_order_with_counts() -> None:
    cache, seqs = build()
    tree = tree_to_dict(cache.export(), decode)
    nodes = tree["nodes"]
    assert tree["num_nodes"] == len(nodes) - 1 == 4
    assert (tree["cached_tokens"], tree["protected_tokens"], tree["evictable_tokens"]) == (9, 5, 4)
    assert sum(n["num_tokens"] for n in nodes) == cache.cached_tokens
    shared = nodes[nodes[0]["children"][0]]
    assert shared["token_ids"] == [0, 1, 2] and shared["text"] == "abc"
    assert len(shared["children"]) == 2 and shared["lock_ref"] == 1 and shared["hits"] == 1
    for node in nodes[1:]:
        parent = nodes[node["parent"]]
        assert node["id"] in parent["children"] and node["id"] > parent["id"]
        assert node["depth"] == parent["depth"] + 1
        assert node["prefix_len"] == parent["prefix_len"] + node["num_tokens"]
    assert sorted(cached_sequences(tree)) == sorted(seqs)
    json.dumps(tree)  # plain JSON all the way down


def test_snippets_are_cut_to_the_requested_length() -> None:
    cache = RadixCache()
    cache.insert(list(range(20)), torch.arange(20))
    tree = tree_to_dict(cache.export(), decode, snippet_chars=5)
    assert tree["nodes"][1]["text"] == "abcd…"
    assert snippet("abc", 3) == "abc"
    with pytest.raises(ValueError, match="snippet_chars"):
        tree_to_dict(cache.export(), decode, snippet_chars=0)


def test_render_text_has_one_line_per_node_in_tree_shape() -> None:
    cache, _ = build()
    lines = render_text(tree_to_dict(cache.export(), decode)).splitlines()
    assert lines[0].startswith("radix cache: 9 tokens in 4 nodes (5 locked, 4 evictable")
    assert lines[1] == "root"
    assert lines[2].startswith('├── [3 tok] "abc"') and "shared by 2" in lines[2]
    assert "locked x1" in lines[2]
    assert lines[3].startswith('│   ├── [2 tok] "de"')
    assert lines[4].startswith('│   └── [2 tok] "⏎f"')  # the newline is shown, not printed
    assert lines[5].startswith('└── [2 tok] "hi"')
    assert len(lines) == 6


def test_render_svg_is_xml_with_a_box_and_an_edge_per_node() -> None:
    cache, _ = build()
    cache.insert([9, 10], torch.tensor([20, 21]))
    tree = tree_to_dict(cache.export(), lambda ids: decode(ids).replace("k", "<&\x01>"))
    root = ET.fromstring(render_svg(tree))
    assert root.tag == f"{SVG}svg"
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    assert len(groups) == tree["num_nodes"] + 1
    assert len(list(root.iter(f"{SVG}path"))) == tree["num_nodes"]
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert '"abc"' in texts and '"j<&·>"' in texts
    # A shared prefix gets a heavier border than a node with one continuation.
    widths = {g.get("id"): g.find(f"{SVG}rect").get("stroke-width") for g in groups}
    shared_id = tree["nodes"][0]["children"][0]
    assert widths[f"node-{shared_id}"] == "2.5" and widths["node-2"] == "1"


def test_render_of_an_empty_tree() -> None:
    tree = tree_to_dict(RadixCache().export(), decode)
    assert tree["num_nodes"] == 0 and cached_sequences(tree) == []
    assert render_text(tree).splitlines()[1:] == ["root"]
    ET.fromstring(render_svg(tree))


def test_show_cache_prints_text_or_writes_by_suffix(tmp_path, capsys) -> None:
    cache, _ = build()
    tree = tree_to_dict(cache.export(), decode)
    text = show_cache(tree)
    assert capsys.readouterr().out.strip() == text.strip()
    show_cache(tree, tmp_path / "c.svg")
    ET.parse(tmp_path / "c.svg")
    show_cache(tree, tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text()) == tree

    # An Engine, and an EngineBackend around one (its `.engine`): the real engine, fake runner.
    with Engine(runner=FakeRunner(num_slots=256), tokenizer=ByteTokenizer(), device="cpu") as eng:
        eng.generate(["cache me", "cache you"], {"max_new_tokens": 2, "temperature": 0})
        held = render_text(eng.cache_tree())
        assert "cache" in held
        assert show_cache(eng, tmp_path / "e.txt") == held
        assert show_cache(EngineBackend(engine=eng), tmp_path / "b.txt") == held
    with pytest.raises(TypeError, match="show_cache expects"):
        show_cache(42)
    with pytest.raises(RuntimeError, match="cannot reach"):
        show_cache("http://127.0.0.1:9")


def test_import_sgl_lite_stays_light_and_show_cache_is_exported() -> None:
    code = (
        "import sys, sgl_lite; assert 'torch' not in sys.modules, 'torch imported'; "
        "f = sgl_lite.show_cache; assert 'torch' not in sys.modules; print(f.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "sgl_lite.cache_view"
