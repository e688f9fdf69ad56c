"""`python -m bench.json_schema_suite`: the official JSON Schema Test Suite as an exactness oracle
for every grammar backend, with no model (issue 37, "exact or refused").

For each schema of the vendored draft 2020-12 files (tests/data/json_schema_test_suite, see its
README) and each backend, the compiler either refuses the schema or serves a constraint; for
every test instance of a served schema the constraint's matcher is asked whether it accepts the
instance's JSON text, laid out as our grammars write JSON (json.dumps' separators; every order of
every object's keys, since a backend writes properties in its own order; strings with and
without non-ASCII escaped), and the answer is compared with the suite's `valid`:

- accepted, invalid: the mask lets invalid output through. Counted before the final check
  (fidelity.check_output, which runs on every constrained output) and after it (the texts it
  passes too: output returned as valid that is not). After the final check it must be 0.
- rejected, valid: coverage lost (the backend writes a subset), allowed and counted.

The automaton is checked by its regex (the source its token index is built from; `--index`
walks the real token index instead), llguidance and xgrammar by their own matchers over the
tiny test tokenizer, `auto` by whichever of those its plan picks. The table is printed as
Markdown (`--by-file` adds one row per suite file); `--json PATH` writes the counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

SUITE = Path(__file__).resolve().parents[1] / "tests/data/json_schema_test_suite/draft2020-12"
BACKENDS = ("outlines", "llguidance", "xgrammar", "auto")
MAX_ORDERS = 24  # key orders tried per instance (every order up to 4 keys)
OUTCOMES = (
    "accepted_valid",
    "accepted_invalid_caught",  # the matcher accepts it, the final check reports it
    "accepted_invalid",  # the matcher accepts it and the final check passes it
    "rejected_valid",
    "rejected_invalid",
)
_KEYWORD = re.compile(r"keyword '([^']+)'")

Accepts = Callable[[str], bool]


class Instance(NamedTuple):
    """One test of the suite: its description, the instance and whether it is valid."""

    description: str
    data: Any
    valid: bool


class Case(NamedTuple):
    """One schema of the suite with its instances; `file` is relative to the draft folder."""

    file: str
    description: str
    schema: Any
    tests: tuple[Instance, ...]


def load_cases(root: Path = SUITE, *, optional: bool = True) -> list[Case]:
    """Every schema of the suite's files under `root` (with `optional/` unless told not),
    in file order."""
    cases = []
    for path in sorted(root.rglob("*.json")):
        name = path.relative_to(root).as_posix()
        if not optional and name.startswith("optional/"):
            continue
        for group in json.loads(path.read_text(encoding="utf-8")):
            tests = tuple(Instance(t["description"], t["data"], t["valid"]) for t in group["tests"])
            cases.append(Case(name, group["description"], group["schema"], tests))
    return cases


def texts(value: Any, max_orders: int = MAX_ORDERS, *, compact: bool = False) -> list[str]:
    """`value` as JSON text in json.dumps' layout: at most `max_orders` orders of each object's
    keys, and, where they differ, with non-ASCII characters written raw as well as escaped;
    `compact`: with no space after `,` and `:` as well (a whitespace pattern that allows none)."""
    out: list[str] = []
    for item, key in [(", ", ": "), *([(",", ":")] if compact else [])]:
        for ascii_only in (True, False):
            found = _texts(value, ascii_only, max_orders, item, key)
            out += [t for t in itertools.islice(found, max_orders) if t not in out]
    return out


def _texts(value: Any, ascii_only: bool, max_orders: int, item: str, key: str) -> Iterator[str]:
    if isinstance(value, dict):
        options = [
            [
                json.dumps(k, ensure_ascii=ascii_only) + key + t
                for t in itertools.islice(_texts(v, ascii_only, max_orders, item, key), max_orders)
            ]
            for k, v in value.items()
        ]
        for order in itertools.permutations(options):
            for picks in itertools.product(*order):
                yield "{" + item.join(picks) + "}"
    elif isinstance(value, list):
        items = [
            list(itertools.islice(_texts(v, ascii_only, max_orders, item, key), 2)) for v in value
        ]
        for picks in itertools.product(*items):
            yield "[" + item.join(picks) + "]"
    else:
        yield json.dumps(value, ensure_ascii=ascii_only)


def matcher_for(compiler: Any, schema: Any, *, index: bool = False) -> tuple[str, Accepts] | str:
    """(the backend the compiler serves `schema` with, what its constraint accepts), or the
    refusal's message. A text is accepted when the backend's matcher takes all its tokens and
    may then stop; the automaton: when its regex matches the text whole, or, with `index`, when
    its token index (outlines-core's, built as the engine builds it) takes the text's tokens."""
    from sgl_lite.backend.constrained import GrammarError

    try:
        backend, source = compiler.plan("json_schema", schema)
    except GrammarError as exc:
        return str(exc) or type(exc).__name__
    tokenizer = compiler.tokenizer
    if backend == "outlines" and index:
        try:
            grammar = compiler.compile("json_schema", schema)
        except GrammarError as exc:
            return str(exc)

        def index_accepts(text: str) -> bool:
            state = grammar.initial_state
            for token_id in tokenizer.encode(text, add_special_tokens=False):
                state = grammar.next_state(state, token_id)
                if state is None:
                    return False
            return bool(grammar.is_accepting(state))

        return backend, index_accepts
    if backend == "outlines":
        regex = re.compile(source)
        return backend, lambda text: regex.fullmatch(text) is not None
    if backend == "llguidance":
        from llguidance import LLMatcher

        from sgl_lite.backend.constrained.matchers.llguidance_backend import ll_tokenizer

        matcher = LLMatcher(ll_tokenizer(tokenizer), source)  # validate_tokens only reads it
        if matcher.is_error():
            return f"llguidance cannot build the grammar: {matcher.get_error()}"

        def ll_accepts(text: str) -> bool:
            ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            return bool(matcher.validate_tokens(ids) == len(ids))

        return backend, ll_accepts
    if backend == "xgrammar":
        import xgrammar as xgr

        from sgl_lite.backend.constrained.matchers.xgrammar_backend import xg_compiler

        try:
            compiled = xg_compiler(tokenizer, compiler.vocab).compile_grammar(source)
        except Exception as exc:  # as XGGrammar: a build that fails is a refusal
            return f"xgrammar cannot compile the grammar: {exc}"

        def xg_accepts(text: str) -> bool:
            matcher = xgr.GrammarMatcher(compiled)
            ids = tokenizer.encode(text, add_special_tokens=False)
            return all(matcher.accept_token(i) for i in ids) and bool(matcher.is_completed())

        return backend, xg_accepts
    raise ValueError(f"unknown backend {backend!r}")


def outcome(accepts: Accepts, schema: Any, test: Instance, *, compact: bool = False) -> str:
    """Which of OUTCOMES one instance has under a served schema (`compact`: see texts)."""
    from sgl_lite.backend.constrained import check_output

    accepted = [t for t in texts(test.data, compact=compact) if accepts(t)]
    if not accepted:
        return "rejected_valid" if test.valid else "rejected_invalid"
    if test.valid:
        return "accepted_valid"
    # NOTE: the final check sees the text, as in the engine: each accepted layout is checked
    if all(check_output("json_schema", schema, t) is not None for t in accepted):
        return "accepted_invalid_caught"
    return "accepted_invalid"


@dataclass
class Tally:
    """One backend's counts over some of the suite."""

    schemas: int = 0
    refused: int = 0
    refused_unnamed: int = 0  # refusals whose message names no keyword
    served_by: Counter[str] = field(default_factory=Counter)  # auto: which backend served
    refused_keywords: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    # (file, schema description, instance description) of every accepted-invalid instance
    accepted_invalid: list[tuple[str, str, str]] = field(default_factory=list)
    caught: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def compiled(self) -> int:
        """Schemas served."""
        return self.schemas - self.refused

    @property
    def accepted_invalid_before(self) -> int:
        """Invalid instances the matcher accepts (the final check then reports them)."""
        return self.outcomes["accepted_invalid_caught"] + self.outcomes["accepted_invalid"]

    def as_dict(self) -> dict[str, Any]:
        """The counts as plain JSON."""
        return {
            "schemas": self.schemas,
            "compiled": self.compiled,
            "refused": self.refused,
            "refused_unnamed": self.refused_unnamed,
            "served_by": dict(self.served_by),
            "refused_keywords": dict(self.refused_keywords.most_common()),
            "outcomes": {k: self.outcomes[k] for k in OUTCOMES},
            "accepted_invalid_before_final_check": self.accepted_invalid_before,
            "accepted_invalid_after_final_check": self.outcomes["accepted_invalid"],
            "accepted_invalid_instances": [list(x) for x in self.accepted_invalid],
            "caught_instances": [list(x) for x in self.caught],
        }


def evaluate(compiler: Any, cases: Iterable[Case], *, index: bool = False) -> dict[str, Tally]:
    """Per suite file, one Tally of `compiler`'s answers on `cases` (`index`: see
    matcher_for)."""
    tallies: dict[str, Tally] = {}
    for case in cases:
        tally = tallies.setdefault(case.file, Tally())
        tally.schemas += 1
        found = matcher_for(compiler, case.schema, index=index)
        if isinstance(found, str):
            tally.refused += 1
            keyword = _KEYWORD.search(found)
            if keyword is None:
                tally.refused_unnamed += 1
            tally.refused_keywords[keyword[1] if keyword else "(unnamed)"] += 1
            continue
        backend, accepts = found
        tally.served_by[backend] += 1
        for test in case.tests:
            compact = compiler.whitespace_pattern is not None
            result = outcome(accepts, case.schema, test, compact=compact)
            tally.outcomes[result] += 1
            where = (case.file, case.description, test.description)
            if result == "accepted_invalid":
                tally.accepted_invalid.append(where)
            elif result == "accepted_invalid_caught":
                tally.caught.append(where)
    return tallies


def total(tallies: Iterable[Tally]) -> Tally:
    """The sum of some tallies."""
    out = Tally()
    for t in tallies:
        out.schemas += t.schemas
        out.refused += t.refused
        out.refused_unnamed += t.refused_unnamed
        out.served_by.update(t.served_by)
        out.refused_keywords.update(t.refused_keywords)
        out.outcomes.update(t.outcomes)
        out.accepted_invalid += t.accepted_invalid
        out.caught += t.caught
    return out


def compiler_for(backend: str, whitespace: str | None = None) -> Any:
    """A GrammarCompiler over the tiny test tokenizer (json.dumps' layout unless a
    `whitespace` pattern is given, as --constrained-json-whitespace-pattern gives it)."""
    from sgl_lite.backend.constrained import GrammarCompiler
    from tests.support.tiny import build_tiny_tokenizer

    return GrammarCompiler(build_tiny_tokenizer(), backend=backend, whitespace_pattern=whitespace)


HEADER = (
    "| backend | schemas compiled | refused (no keyword named) | instances checked "
    "| accepted-invalid, before final check | after final check | rejected-valid |\n"
    "|---|---|---|---|---|---|---|"
)


def row(name: str, t: Tally) -> str:
    """One Markdown row of the table."""
    checked = sum(t.outcomes.values())
    return (
        f"| {name} | {t.compiled} / {t.schemas} | {t.refused} ({t.refused_unnamed}) | {checked} "
        f"| {t.accepted_invalid_before} | {t.outcomes['accepted_invalid']} "
        f"| {t.outcomes['rejected_valid']} |"
    )


def by_file(results: dict[str, dict[str, Tally]]) -> str:
    """One Markdown row per suite file (its keyword), one cell per backend: schemas compiled of
    the file's, then accepted-invalid instances (before the final check; after it, if any) and
    rejected-valid ones."""
    backends = list(results)
    lines = [
        "| file | " + " | ".join(f"`{b}`" for b in backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    files = sorted({f for tallies in results.values() for f in tallies})
    for name in files:
        cells = []
        for b in backends:
            t = results[b][name]
            after = t.outcomes["accepted_invalid"]
            leak = f"{t.accepted_invalid_before}" + (f" ({after} passed)" if after else "")
            cells.append(f"{t.compiled}/{t.schemas} · {leak} · {t.outcomes['rejected_valid']}")
        lines.append(f"| {name.removesuffix('.json')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the oracle and prints the per-backend table; exit 1 if any backend returns an
    invalid instance as valid (accepted-invalid after the final check)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS)
    parser.add_argument("--no-optional", action="store_true", help="skip optional/ files")
    parser.add_argument("--by-file", action="store_true", help="a row per file as well")
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument(
        "--whitespace",
        help="a whitespace pattern, as --constrained-json-whitespace-pattern (e.g. '[ ]?'); "
        "texts are then offered compact as well",
    )
    parser.add_argument(
        "--index",
        action="store_true",
        help="check the automaton with its token index, not its regex (builds every index)",
    )
    args = parser.parse_args(argv)
    cases = load_cases(optional=not args.no_optional)
    results: dict[str, dict[str, Tally]] = {}
    print(f"{len(cases)} schemas, {sum(len(c.tests) for c in cases)} instances, {SUITE}")
    print(HEADER)
    for backend in args.backend or BACKENDS:
        started = time.perf_counter()
        compiler = compiler_for(backend, args.whitespace)
        results[backend] = evaluate(compiler, cases, index=args.index)
        print(row(backend, total(results[backend].values())), end="")
        print(f" <!-- {time.perf_counter() - started:.1f} s -->", file=sys.stdout)
    for backend, tallies in results.items():
        t = total(tallies.values())
        refusals = ", ".join(f"{k} {n}" for k, n in t.refused_keywords.most_common())
        print(f"\n{backend}: served by {dict(t.served_by)}; refusals by keyword: {refusals}")
        for where in t.accepted_invalid:
            print(f"  ACCEPTED INVALID (final check passes it): {' / '.join(where)}")
    if args.by_file:
        print("\n" + by_file(results))
    if args.json is not None:
        out = {b: {f: t.as_dict() for f, t in tallies.items()} for b, tallies in results.items()}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    bad = any(total(t.values()).outcomes["accepted_invalid"] for t in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
