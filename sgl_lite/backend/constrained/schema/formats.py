"""Regexes for the JSON Schema string formats the automaton enforces (inside the quotes).

Each pattern is a subset of what the format allows, chosen so that `jsonschema`'s format
checker accepts every match (dates are real calendar dates: 29 February is left out rather than
tracking leap years). A format JSON Schema defines but not listed here is refused by the schema
compiler; a name no draft defines (`KNOWN_FORMATS`) is an annotation, as the specification
says of unknown formats: schema_normalize drops it and the response's meta info says so.
"""

from __future__ import annotations

_DAY_31 = "(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
_DAY_30 = "(0[469]|11)-(0[1-9]|[12][0-9]|30)"
_DAY_FEB = "02-(0[1-9]|1[0-9]|2[0-8])"
_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"  # NOTE: no year 0000
DATE = f"{_YEAR}-({_DAY_31}|{_DAY_30}|{_DAY_FEB})"
_OFFSET = "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
# NOTE: no `{m,n}` inside a `(...)?`: xgrammar 0.2's regex reader lets such a group match
# without its first part (`(\.[0-9]{1,6})?` took "13" for a fraction)
TIME = rf"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?)?{_OFFSET}"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = "([a-z0-9]|[a-z0-9][a-z0-9-]{0,20}[a-z0-9])"
# NOTE: no "--" anywhere (reserved at a label's 3rd and 4th characters, where `xn--` starts an
# A-label that must then be valid Punycode), and a last label that starts with a letter
_HOST = "[a-z0-9]{1,20}(-[a-z0-9]{1,20}){0,2}"
_TOP = "[a-z][a-z0-9]{0,19}(-[a-z0-9]{1,20}){0,2}"

STRING_FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": f"{DATE}T{TIME}",
    "email": rf"[a-z0-9]+([._+-][a-z0-9]+){{0,4}}@{_LABEL}(\.{_LABEL}){{0,3}}\.[a-z]{{2,8}}",
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "hostname": rf"({_HOST}\.){{0,3}}{_TOP}",
    "uri": rf"https?://{_LABEL}(\.{_LABEL}){{0,4}}(/[A-Za-z0-9._~-]{{1,32}}){{0,8}}/?",
}

# Every format name some JSON Schema draft defines (draft 3 to 2020-12). Any other name is an
# annotation: validators ignore it, so it constrains nothing.
KNOWN_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid",
        "uri-template", "json-pointer", "relative-json-pointer", "regex",
        # draft 3's
        "utc-millisec", "color", "style", "phone", "ip-address", "host-name",
    }
)  # fmt: skip
