"""A view of the radix cache: the tree as JSON, as terminal text, and as an SVG drawing.

`tree_to_dict` flattens a `RadixCache.export()` into the JSON that `Engine.cache_tree()` and
`GET /cache_tree` return: a list of nodes in pre-order, each naming its parent and children by
id, so no consumer ever recurses as deep as the tree. `render_text` and `render_svg` draw that
dict; `show_cache` fetches it from an engine or a server URL and prints or saves it. The module
needs neither torch nor graphviz: the SVG is written by hand.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from sgl_lite.backend.kvcache.radix_cache import NodeExport, TreeExport

DEFAULT_SNIPPET_CHARS = 60


def snippet(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters (an ellipsis marks the cut)."""
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 0)] + "…"


def tree_to_dict(
    tree: TreeExport,
    decode: Callable[[list[int]], str],
    snippet_chars: int = DEFAULT_SNIPPET_CHARS,
) -> dict[str, Any]:
    """The JSON form of an exported tree; `decode` turns a node's token ids into text.

    Node 0 is the root (no tokens; its `hits` count every lookup). `prefix_len` is the number
    of tokens from the root to the end of the node, `text` a snippet of the node's own tokens.
    """
    if snippet_chars < 1:
        raise ValueError(f"snippet_chars must be >= 1, got {snippet_chars}")
    nodes: list[dict[str, Any]] = []
    stack: list[tuple[NodeExport, int | None, int, int]] = [(tree.root, None, 0, 0)]
    while stack:
        node, parent, depth, start = stack.pop()
        index = len(nodes)
        end = start + len(node.token_ids)
        nodes.append(
            {
                "id": index,
                "parent": parent,
                "depth": depth,
                "prefix_len": end,
                "num_tokens": len(node.token_ids),
                "token_ids": list(node.token_ids),
                "text": snippet(decode(list(node.token_ids)), snippet_chars)
                if node.token_ids
                else "",
                "lock_ref": node.lock_ref,
                "last_access": node.last_access,
                "hits": node.hits,
                "children": [],
            }
        )
        if parent is not None:
            nodes[parent]["children"].append(index)
        # Reversed, so the first child (smallest first token) is numbered first.
        stack.extend((child, index, depth + 1, end) for child in reversed(node.children))
    return {
        "num_nodes": len(nodes) - 1,
        "cached_tokens": tree.cached_tokens,
        "protected_tokens": tree.protected_tokens,
        "evictable_tokens": tree.cached_tokens - tree.protected_tokens,
        "evicted_tokens": tree.evicted_tokens,
        "lookups": tree.root.hits,
        "nodes": nodes,
    }


def cached_sequences(tree: dict[str, Any]) -> list[list[int]]:
    """Every root-to-leaf token path the tree holds (what a request could find cached)."""
    nodes = tree["nodes"]
    paths: dict[int, list[int]] = {0: []}
    leaves = []
    for node in nodes[1:]:  # pre-order: a parent comes before its children
        paths[node["id"]] = paths[node["parent"]] + node["token_ids"]
        if not node["children"]:
            leaves.append(paths[node["id"]])
    return leaves


# ----------------------------------------------------------------------------- text


def _label(node: dict[str, Any]) -> str:
    parts = [f"hits {node['hits']}", f"last use {node['last_access']}"]
    if node["lock_ref"]:
        parts.insert(1, f"locked x{node['lock_ref']}")
    if len(node["children"]) > 1:
        parts.append(f"shared by {len(node['children'])}")
    return "  ".join(parts)


def _printable(text: str) -> str:
    """Newlines and other control characters as visible marks, so one node is one line."""
    return "".join(
        "⏎" if c == "\n" else "⇥" if c == "\t" else "·" if ord(c) < 32 or c == "\x7f" else c
        for c in text
    )


def render_text(tree: dict[str, Any]) -> str:
    """The tree as indented lines, one per node, with token counts, hits and locks."""
    nodes = tree["nodes"]
    lines = [
        f"radix cache: {tree['cached_tokens']} tokens in {tree['num_nodes']} nodes "
        f"({tree['protected_tokens']} locked, {tree['evictable_tokens']} evictable, "
        f"{tree['evicted_tokens']} evicted so far), {tree['lookups']} "
        f"lookup{'' if tree['lookups'] == 1 else 's'}",
        "root",
    ]
    stack = [
        (child, "", i == len(nodes[0]["children"]) - 1)
        for i, child in enumerate(nodes[0]["children"])
    ][::-1]
    while stack:
        index, indent, last = stack.pop()
        node = nodes[index]
        branch = "└── " if last else "├── "
        text = json.dumps(_printable(node["text"]), ensure_ascii=False)
        lines.append(f"{indent}{branch}[{node['num_tokens']} tok] {text}  {_label(node)}")
        below = indent + ("    " if last else "│   ")
        kids = node["children"]
        stack.extend((kid, below, i == len(kids) - 1) for i, kid in reversed(list(enumerate(kids))))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- SVG

_BOX_W, _BOX_H, _GAP_X, _GAP_Y, _PAD = 230, 46, 50, 14, 20
_SVG_CHARS = 27  # what fits a box at 12 px monospace (about 7.2 px a character)


def _xml_text(text: str, keep_newlines: bool = False) -> str:
    """Text safe inside an XML element: control characters shown, markup escaped."""
    if keep_newlines:
        return "\n".join(escape(_printable(line)) for line in text.split("\n"))
    return escape(_printable(text))


def _layout(nodes: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(x, y) of each node's box: depth across, leaves in pre-order down, a parent centred on
    its children; iterative (reverse pre-order visits children before their parent)."""
    y = [0.0] * len(nodes)
    row = 0
    for node in nodes:
        if not node["children"]:
            y[node["id"]] = row * (_BOX_H + _GAP_Y)
            row += 1
    for node in reversed(nodes):
        kids = node["children"]
        if kids:
            y[node["id"]] = (y[kids[0]] + y[kids[-1]]) / 2
    return [(_PAD + n["depth"] * (_BOX_W + _GAP_X), _PAD + y[n["id"]]) for n in nodes]


def _fill(node: dict[str, Any], max_hits: int) -> str:
    if node["id"] == 0:
        return "#e5e7eb"
    if node["lock_ref"]:
        return "#fdba74"  # in use by a running request: cannot be evicted
    # Blue deepens with hits (log scale), so the prefixes that pay off stand out.
    t = math.log1p(node["hits"]) / math.log1p(max(max_hits, 1))
    light, dark = (219, 234, 254), (96, 165, 250)
    rgb = (round(a + (b - a) * t) for a, b in zip(light, dark))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def render_svg(tree: dict[str, Any]) -> str:
    """The tree as a standalone SVG document: one box per node, edges from each shared prefix
    to every continuation; locked nodes orange, blue by hit count, full text on hover."""
    nodes = tree["nodes"]
    pos = _layout(nodes)
    width = max(x for x, _ in pos) + _BOX_W + _PAD
    height = max(y for _, y in pos) + _BOX_H + _PAD
    max_hits = max((n["hits"] for n in nodes[1:]), default=0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="12">',
        f"<title>radix cache: {tree['cached_tokens']} tokens in {tree['num_nodes']} nodes</title>",
        '<g fill="none" stroke="#6b7280" stroke-width="1.5">',
    ]
    for node in nodes[1:]:
        (px, py), (cx, cy) = pos[node["parent"]], pos[node["id"]]
        x0, y0, x1, y1 = px + _BOX_W, py + _BOX_H / 2, cx, cy + _BOX_H / 2
        mid = (x0 + x1) / 2
        out.append(
            f'<path d="M{x0:.1f},{y0:.1f} C{mid:.1f},{y0:.1f} {mid:.1f},{y1:.1f} '
            f'{x1:.1f},{y1:.1f}"/>'
        )
    out.append("</g>")
    for node, (x, y) in zip(nodes, pos):
        shared = len(node["children"]) > 1
        if node["id"] == 0:
            head, info = "root", f"{tree['cached_tokens']} tokens, {tree['lookups']} lookups"
        else:
            head = f'"{snippet(node["text"], _SVG_CHARS)}"'
            info = f"{node['num_tokens']} tok · hits {node['hits']}"
            if node["lock_ref"]:
                info += f" · lock {node['lock_ref']}"
            if shared:
                info += f" · shared ×{len(node['children'])}"
        hover = f"{node['text']}\n\n{_label(node)}" if node["id"] else info
        out.append(
            f'<g class="node" id="node-{node["id"]}"><title>{_xml_text(hover, True)}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{_BOX_W}" height="{_BOX_H}" rx="6" '
            f'fill="{_fill(node, max_hits)}" stroke="#374151" '
            f'stroke-width="{2.5 if shared else 1}"/>'
            f'<text x="{x + 8:.1f}" y="{y + 18:.1f}">{_xml_text(head)}</text>'
            f'<text x="{x + 8:.1f}" y="{y + 36:.1f}" fill="#374151">{_xml_text(info)}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- program steps


@dataclass(frozen=True)
class CacheStep:
    """One gen/select of a program: its prompt tokens and how many of them the cache held."""

    kind: str  # "gen" or "select"
    name: str | None
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        """cached / prompt tokens (0 for an empty prompt)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @classmethod
    def from_meta(cls, kind: str, name: str | None, meta: dict[str, Any] | None) -> CacheStep:
        """From a step's meta_info. A select scores one request per choice: its cached count is
        the smallest of theirs, bounded by the shared prompt it reports as `prompt_tokens`."""
        meta = meta or {}
        prompt = int(meta.get("prompt_tokens") or 0)
        cached = meta.get("cached_tokens") or 0
        if isinstance(cached, list):
            cached = min(min((c or 0 for c in cached), default=0), prompt)
        return cls(kind, name, prompt, int(cached))


@dataclass(frozen=True)
class CacheReport:
    """Per-step prompt and cached tokens of a program run (`ProgramState.cache_report()`)."""

    steps: tuple[CacheStep, ...]

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, str | None, Any]]) -> CacheReport:
        """From (kind, name, meta_info) records in the order the steps ran."""
        return cls(tuple(CacheStep.from_meta(*r) for r in records))

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all steps."""
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens over all steps."""
        return sum(s.cached_tokens for s in self.steps)

    @property
    def hit_rate(self) -> float:
        """cached / prompt tokens over all steps."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def __str__(self) -> str:
        rows = [f"{'step':<28}{'prompt':>8}{'cached':>8}{'hit rate':>10}"]
        for s in self.steps:
            label = f"{s.kind}({s.name!r})" if s.name else s.kind
            rows.append(f"{label:<28}{s.prompt_tokens:>8}{s.cached_tokens:>8}{s.hit_rate:>10.1%}")
        rows.append(
            f"{'total':<28}{self.prompt_tokens:>8}{self.cached_tokens:>8}{self.hit_rate:>10.1%}"
        )
        return "\n".join(rows)


# ----------------------------------------------------------------------------- entry point


def fetch_tree(url: str, api_key: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """`GET {url}/cache_tree` from a running server; RuntimeError with the server's message."""
    request = urllib.request.Request(url.rstrip("/") + "/cache_tree")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        raise RuntimeError(f"GET {request.full_url} failed with {exc.code}: {body}") from None
    except urllib.error.URLError as exc:
        raise RuntimeError(f"cannot reach {request.full_url}: {exc.reason}") from None


def _tree_of(source: Any, api_key: str | None) -> dict[str, Any]:
    if isinstance(source, dict) and "nodes" in source:
        return source
    if isinstance(source, str):
        return fetch_tree(source, api_key)
    for candidate in (source, getattr(source, "engine", None)):  # an Engine, EngineBackend
        if candidate is not None and callable(getattr(candidate, "cache_tree", None)):
            return candidate.cache_tree()
    base_url = getattr(getattr(source, "backend", source), "base_url", None)
    if isinstance(base_url, str):  # a RuntimeEndpoint, or a Runtime around one
        return fetch_tree(base_url, api_key or getattr(source, "api_key", None))
    raise TypeError(
        "show_cache expects an Engine, a Runtime/RuntimeEndpoint, a server URL or a "
        f"cache_tree() dict, got {type(source).__name__}"
    )


def show_cache(source: Any, path: str | Path | None = None, *, api_key: str | None = None) -> str:
    """Shows what `source` (an Engine, a Runtime, a server URL) holds in its radix cache.

    With no `path` the text form is printed; a path ending in `.svg` gets the drawing, `.json`
    the raw tree, anything else the text form. Returns what was printed or written.
    """
    tree = _tree_of(source, api_key)
    if path is None:
        text = render_text(tree)
        print(text)
        return text
    path = Path(path)
    if path.suffix == ".svg":
        content = render_svg(tree)
    elif path.suffix == ".json":
        content = json.dumps(tree, ensure_ascii=False, indent=1)
    else:
        content = render_text(tree)
    path.write_text(content, encoding="utf-8")
    return content
