"""Streamed meta info as SGLang's stream reports it: logprob lists hold only the new entries.

Backends report a generation's meta info cumulatively (each chunk has every entry so far);
`ProgramState.text_async_iter(var, return_meta_data=True)` hands SGLang programs the slices.
"""

from __future__ import annotations

from typing import Any

# The logprob lists a streamed meta info carries only the new entries of, as SGLang's server
# streams them; `<key>_length` (for output_token_logprobs) counts every entry so far.
_INCREMENTAL_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def incremental_meta(meta: dict[str, Any], sent: dict[str, int]) -> dict[str, Any]:
    """`meta` (cumulative, as backends report it) with each incremental key sliced to the
    entries not yet yielded; `sent` remembers how many were."""
    out = dict(meta)
    for key in _INCREMENTAL_KEYS:
        if isinstance(meta.get(key), list):
            out[key] = meta[key][sent.get(key, 0) :]
            sent[key] = len(meta[key])
    if isinstance(meta.get("output_token_logprobs"), list):
        out["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return out
