"""JSONSchemaBench's scoring, the paper's reference figures and the report tables.

What counts as a success is decided here and nowhere else: an output is empirically covered
only when it parses as JSON and validates against its schema with Draft 2020-12 and format
checking, as the paper's evaluation does; anything else (a violation, unparsable text, a
refusal, a timeout) scores 0. Nothing here runs a model or compiles a grammar.

Source of the method: Geng et al., "Generating Structured Outputs from Language Models:
Benchmark and Studies", arXiv:2501.10868 (2025), and its evaluation code
(github.com/epfl-dlab/jsonschemabench, core/evaluator.py at 8003e84, read, not copied).
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jsonschema
from jsonschema import Draft202012Validator, FormatChecker

PAPER = (
    "Geng et al., Generating Structured Outputs from Language Models: Benchmark and Studies, "
    "arXiv:2501.10868 (2025), Table 4 (empirical coverage; Llama-3.1-8B-Instruct)"
)
# Table 4's empirical coverage: the best framework per sub-dataset, XGrammar and Outlines
# (None: "NA" in the paper). Github_trivial and Github_ultra are not in the table.
PAPER_TABLE4: dict[str, dict[str, Any]] = {
    "Glaiveai2K": {"best": 0.96, "best_by": "Guidance", "xgrammar": 0.93, "outlines": 0.95},
    "Github_easy": {"best": 0.86, "best_by": "Guidance", "xgrammar": 0.79, "outlines": 0.59},
    "Snowplow": {"best": 0.82, "best_by": "Guidance", "xgrammar": None, "outlines": 0.36},
    "Github_medium": {"best": 0.69, "best_by": "Guidance", "xgrammar": 0.52, "outlines": 0.29},
    "Kubernetes": {"best": 0.91, "best_by": "Guidance", "xgrammar": 0.07, "outlines": 0.57},
    "WashingtonPost": {"best": 0.94, "best_by": "llama.cpp", "xgrammar": 0.64, "outlines": 0.22},
    "Github_hard": {"best": 0.41, "best_by": "Guidance", "xgrammar": 0.28, "outlines": 0.03},
    "JsonSchemaStore": {"best": 0.38, "best_by": "llama.cpp", "xgrammar": 0.33, "outlines": 0.09},
}

# The outcomes of one request; only "valid" scores 1.
STATUSES = (
    "valid",  # parses and validates
    "violation",  # parses, fails validation
    "invalid_json",  # does not parse (e.g. cut at max_new_tokens)
    "schema_invalid",  # the schema fails Draft 2020-12's metaschema: the paper scores 0
    "refused",  # the engine refused the schema or its compile failed or timed out
    "prompt_too_long",  # the schema does not fit the model's context in the prompt
    "error",  # anything else the engine raised
)


def format_checker() -> FormatChecker:
    """jsonschema's default format checker with ipv4, ipv6 and uuid checked by the standard
    library, as the paper's evaluation registers them, and `time` checked as Draft 2020-12
    defines it (`_is_rfc3339_time`). Which other formats are checked depends on the optional
    packages installed (see `checked_formats`).

    NOTE: the paper's three checkers return None, which jsonschema reads as "not this format",
    so there every string under those formats fails, valid or not; here a valid one passes.
    """
    checker = FormatChecker()
    parsers = {"ipv4": ipaddress.IPv4Address, "ipv6": ipaddress.IPv6Address, "uuid": uuid.UUID}
    for name, parse in parsers.items():

        def check(value: object, parse: Any = parse) -> bool:
            if isinstance(value, str):
                parse(value)  # raises ValueError when it is not one
            return True

        checker.checks(name, raises=ValueError)(check)
    checker.checks("time")(_is_rfc3339_time)
    return checker


# RFC 3339's full-time (Draft 2020-12's `time`): a time of day with a fraction and an offset
_FULL_TIME = re.compile(
    r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
)


def _is_rfc3339_time(value: object) -> bool:
    """Draft 2020-12's `time` (RFC 3339 full-time, offset required). NOTE: a plain
    FormatChecker, the paper's, checks `time` as Draft 3 did (`%H:%M:%S` exactly), so there
    every RFC 3339 time fails and an offset-less one, invalid under 2020-12, passes; no string
    satisfies both (and jsonschema's own 2020-12 check needs the absent rfc3339-validator)."""
    return not isinstance(value, str) or _FULL_TIME.fullmatch(value) is not None


FORMAT_CHECKER = format_checker()


def checked_formats() -> list[str]:
    """The format names the validator checks in this environment."""
    return sorted(FORMAT_CHECKER.checkers)


class Verdict(NamedTuple):
    """How one output scores: `status` (one of STATUSES) and why, when it is not valid."""

    status: str
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "valid"


def judge(text: str, schema: dict[str, Any]) -> Verdict:
    """The paper's check of one output: `json.loads(text)` whole (no span extraction), then
    Draft 2020-12 with format checking whatever `$schema` says; a schema that is not valid
    under 2020-12 scores 0, and so does any exception the validator raises."""
    try:
        instance = json.loads(text)
    except ValueError as exc:
        return Verdict("invalid_json", f"{exc}")
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return Verdict("schema_invalid", f"not a Draft 2020-12 schema: {exc.message}")
    validator = Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except Exception as exc:  # e.g. a pattern Python's re cannot compile
        return Verdict("violation", f"validator raised {type(exc).__name__}: {exc}")
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        return Verdict("violation", f"at {where}: {error.message[:300]}")
    return Verdict("valid")


# --- refusal reasons, grouped by the keyword they name -----------------------------------------
_KEYWORD = re.compile(r"keyword '([^']+)' at (\S+)")
_LLG_KEYS = re.compile(r'Unimplemented keys: \["([^"]+)"')
_CLASSES = (
    (r"timed out|took [\d.]+ s", "(compile timeout)"),
    (r"not a valid JSON Schema", "(schema fails its own metaschema)"),
    (r"no answer|worker exited", "(compiler crashed or hung)"),
    (r"matches no text", "(matches no text)"),
    (r"expands to a regex over", "(regex too large: $ref/optional-property expansion)"),
    (r"look-?around|look-?ahead|look-?behind", "pattern (look-around)"),
    (r"json_schema pattern .*anchor", "pattern (anchor)"),
    (r"regex parse error|json_schema pattern", "pattern (regex syntax)"),
    (r"patternProperty regexes", "patternProperties"),
    (r"prefixItems", "prefixItems/minItems"),
    (r"Integer exceeds maximum limit", "minimum/maximum (beyond 64-bit)"),
    (r"Schema 'false'", "(false schema)"),
    (r"[Uu]nsatisfiable", "(unsatisfiable, per llguidance)"),
    (r"intersection stack level", "(allOf/$ref intersection too deep)"),
    (r"\$ref|Resource '.*' is not present", "$ref"),
)


def refusal_keyword(message: str) -> str:
    """The keyword a refusal names (`keyword 'X' at /path`, llguidance's unimplemented keys),
    else a class in parentheses (timeout, invalid schema, crash), else "(other)"."""
    for regex in (_KEYWORD, _LLG_KEYS):
        match = regex.search(message)
        if match is not None:
            return match[1]
    for pattern, name in _CLASSES:
        if re.search(pattern, message):
            return name
    return "(other)"


def group_refusals(messages: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """(schema id, message) pairs grouped by `refusal_keyword`, largest group first, each with
    its count and up to three examples."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, message in messages:
        groups[refusal_keyword(message)].append((name, message))
    return [
        {
            "keyword": key,
            "count": len(items),
            "examples": [{"schema": n, "message": m[:400]} for n, m in items[:3]],
        }
        for key, items in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


# --- figures -----------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def coverage(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Declared and empirical coverage and compliance of one (backend, sub-dataset) cell, the
    paper's way: empirical over every schema, compliance = empirical over the declared ones."""
    n = len(records)
    declared = [r for r in records if r["declared"]]
    out: dict[str, Any] = {"n": n, "declared": len(declared) / n if n else None}
    if any("status" in r for r in records):
        valid = sum(r.get("status") == "valid" for r in records)
        valid_declared = sum(r.get("status") == "valid" for r in declared)
        out["empirical"] = valid / n if n else None
        out["compliance"] = valid_declared / len(declared) if declared else None
        out["statuses"] = dict(Counter(r.get("status", "not run") for r in records))
    return out


def compile_times(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Compile time p50/p95/max (seconds) over the schemas that compiled, and the counts."""
    seconds = [r["compile_s"] for r in records if r["declared"]]
    return {
        "accepted": len(seconds),
        "refused": sum(not r["declared"] and not r["timed_out"] for r in records),
        "timed_out": sum(r["timed_out"] for r in records),
        "p50_s": percentile(seconds, 50),
        "p95_s": percentile(seconds, 95),
        "max_s": max(seconds) if seconds else None,
        "chosen": dict(Counter(r["chosen"] for r in records if r["declared"])),
        "accepted_with_notes": sum(bool(r.get("compile_notes")) for r in records if r["declared"]),
        "notes": dict(
            Counter(n for r in records if r["declared"] for n in r.get("compile_notes", ()))
        ),
    }


def _f(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.2f}"


def coverage_table(summary: dict[str, dict[str, dict[str, Any]]], backends: list[str]) -> str:
    """Rows: sub-datasets; per backend declared / empirical / compliance; then Table 4's
    empirical coverage (best framework, XGrammar, Outlines)."""
    head = f"{'sub-dataset':<16}{'n':>4} "
    head += "".join(f"| {b:<18}" for b in backends)
    head += "| paper: best (by)       xgr   outl"
    sub = " " * 21 + "".join("| decl  emp   compl " for _ in backends) + "|"
    lines = [head, sub, "-" * len(head)]
    subs = list(next(iter(summary.values()))) if summary else []
    for name in subs:
        cells = [summary[b][name] for b in backends]
        row = f"{name:<16}{cells[0]['n']:>4} "
        for c in cells:
            row += f"| {_f(c['declared'])} {_f(c.get('empirical'))} {_f(c.get('compliance'))} "
        paper = PAPER_TABLE4.get(name)
        if paper is None:
            row += "| (not in Table 4)"
        else:
            xgr = "  NA " if paper["xgrammar"] is None else _f(paper["xgrammar"])
            row += f"| {_f(paper['best'])} ({paper['best_by']:<10}) {xgr} {_f(paper['outlines'])}"
        lines.append(row)
    return "\n".join(lines)


def compile_table(times: dict[str, dict[str, Any]]) -> str:
    """Per backend: accepted / refused / timed out, compile p50 / p95 / max, how many accepted
    schemas the backend logged warnings for ("noted": xgrammar says what it ignores), and which
    backend built the accepted schemas (under "auto")."""
    lines = [
        f"{'backend':<12}{'accepted':>9}{'refused':>8}{'timeout':>8}"
        f"{'p50 s':>8}{'p95 s':>8}{'max s':>8}{'noted':>7}  built by"
    ]
    for backend, t in times.items():
        chosen = ", ".join(f"{k} {v}" for k, v in sorted(t["chosen"].items()))
        lines.append(
            f"{backend:<12}{t['accepted']:>9}{t['refused']:>8}{t['timed_out']:>8}"
            f"{_f(t['p50_s']):>8}{_f(t['p95_s']):>8}{_f(t['max_s']):>8}"
            f"{t['accepted_with_notes']:>7}  {chosen}"
        )
    return "\n".join(lines)


# --- why an output scored 0 ------------------------------------------------------------------
CUT = "output is cut after"  # the grammar backends' budget_cut violation (grammar_guide.py)


def miss_cause(record: dict[str, Any]) -> str | None:
    """Why one scored record is not valid, None when it is: "engine: ..." for what the engine
    refused or broke, "budget: ..." for an output the closer could not finish within
    max_new_tokens, "benchmark: ..." for a schema or prompt the run cannot take, and
    "BUG: ..." for an output the engine passed as valid that the judge fails (a compliance
    bug: there must be none)."""
    status = record.get("status")
    if status in (None, "valid"):
        return None
    if status == "refused":
        keyword = refusal_keyword(record.get("reason") or record.get("refusal") or "")
        return "engine: compile timeout" if keyword == "(compile timeout)" else "engine: refused"
    if status == "prompt_too_long":
        return "benchmark: prompt over the context"
    if status == "schema_invalid":
        return "benchmark: schema fails Draft 2020-12"
    if status == "error":
        return "engine: error"
    reported = record.get("engine_violation")
    if reported is None:
        return "BUG: passed as valid"
    if reported.startswith(CUT):
        return "budget: cut at max_new_tokens"
    return "engine: violation reported"


def miss_causes(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many of `records` missed for each `miss_cause`, largest first."""
    counts = Counter(c for r in records if (c := miss_cause(r)) is not None)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def markdown_table(result: dict[str, Any], backend: str) -> str:
    """One backend's figures per sub-dataset beside Table 4 (XGrammar's and the best
    framework's empirical coverage), with every miss counted by `miss_cause`, as markdown."""
    lines = [
        "| sub-dataset | n | declared | empirical | compliance | paper: XGrammar | paper: best "
        "| misses by cause |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sub, cell in result["summary"][backend].items():
        records = [r for r in result["records"] if r["backend"] == backend and r["sub"] == sub]
        paper = PAPER_TABLE4.get(sub)
        xgr = "–" if paper is None else ("NA" if paper["xgrammar"] is None else paper["xgrammar"])
        best = "–" if paper is None else f"{paper['best']} ({paper['best_by']})"
        causes = "; ".join(f"{k} {v}" for k, v in miss_causes(records).items()) or "none"
        lines.append(
            f"| {sub} | {cell['n']} | {_f(cell['declared']).strip()} "
            f"| {_f(cell.get('empirical')).strip()} | {_f(cell.get('compliance')).strip()} "
            f"| {xgr} | {best} | {causes} |"
        )
    return "\n".join(lines)


def rescore(result: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> int:
    """Judges again, in place, every record of a saved run whose output was judged and is kept
    whole (`text` under the 2,000 characters a record keeps), against `schemas` by
    "sub/file"; recomputes `summary`. Returns how many statuses changed."""
    changed = 0
    for r in result["records"]:
        text = r.get("text")
        if r.get("status") not in ("valid", "violation", "invalid_json") or text is None:
            continue
        if len(text) >= 2000:  # cut when it was saved: its verdict stands
            continue
        verdict = judge(text, schemas[f"{r['sub']}/{r['schema']}"])
        changed += verdict.status != r["status"]
        r["status"], r["reason"] = verdict.status, verdict.reason
    for backend, cells in result["summary"].items():
        for sub in cells:
            cells[sub] = coverage(
                [r for r in result["records"] if r["backend"] == backend and r["sub"] == sub]
            )
    return changed
