"""SGLang's launch flags that mean nothing on this engine: accepted, logged once, listed apart.

SGLang's deployment guides pass GPU and scheduler tuning knobs (`--cuda-graph-max-bs`,
`--enable-torch-compile`, ...). A command line written for SGLang should start this server as
written, so each such flag is accepted as a no-op with the reason it changes nothing here;
`launch_server` logs the ones given at start-up and lists them in their own `--help` group.
This is the one list of them.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple


class IgnoredFlag(NamedTuple):
    """An SGLang flag accepted as a no-op: a GPU or scheduler tuning knob with nothing to tune
    here. `only`: the values that are no-ops (others are refused); empty means any."""

    flag: str
    takes_value: bool
    why: str
    only: tuple[str, ...] = ()
    many: bool = False  # takes a list of values (`--cuda-graph-bs 1 2 4`)


_NO_CUSTOM_KERNELS = "this engine runs its own torch code; there is no kernel backend to choose"
_GRAPH_SIZES = "CUDA graphs are captured at fixed batch sizes (1, 2, 4, ... 32)"
_ONE_DEVICE = "one device per process: there is no collective communication to tune"
IGNORED_FLAGS: tuple[IgnoredFlag, ...] = (
    IgnoredFlag("--cuda-graph-max-bs", True, _GRAPH_SIZES),
    IgnoredFlag("--cuda-graph-bs", True, _GRAPH_SIZES, many=True),
    IgnoredFlag("--disable-cuda-graph-padding", False, "graphs always pad to a captured size"),
    IgnoredFlag(
        "--disable-overlap-schedule",
        False,
        "scheduling does not overlap the forward pass; grammar masks do (--disable-overlap-masks)",
    ),
    IgnoredFlag("--enable-torch-compile", False, "the model runs eagerly (or from CUDA graphs)"),
    IgnoredFlag("--torch-compile-max-bs", True, "the model is never torch.compile'd"),
    IgnoredFlag("--attention-backend", True, _NO_CUSTOM_KERNELS),
    IgnoredFlag("--prefill-attention-backend", True, _NO_CUSTOM_KERNELS),
    IgnoredFlag("--decode-attention-backend", True, _NO_CUSTOM_KERNELS),
    IgnoredFlag("--sampling-backend", True, _NO_CUSTOM_KERNELS),
    IgnoredFlag(
        "--kv-cache-dtype",
        True,
        "the KV cache is kept in the weights' dtype (--dtype); only 'auto' is accepted",
        only=("auto",),
    ),
    IgnoredFlag(
        "--schedule-conservativeness",
        True,
        "a prompt is admitted when it fits and decode preempts when slots run short: no "
        "new-token estimate to tune",
    ),
    IgnoredFlag(
        "--enable-mixed-chunk",
        False,
        "prefill batches always carry the running requests' decode tokens",
    ),
    IgnoredFlag("--enable-p2p-check", False, _ONE_DEVICE),
    IgnoredFlag("--disable-custom-all-reduce", False, _ONE_DEVICE),
    IgnoredFlag("--stream-interval", True, "every token is streamed as it is decoded"),
    IgnoredFlag("--skip-server-warmup", False, "the server sends no warm-up request"),
    IgnoredFlag("--log-requests", False, "requests are not logged; --log-level debug logs access"),
    IgnoredFlag("--log-requests-level", True, "requests are not logged"),
    IgnoredFlag("--decode-log-interval", True, "no periodic decode log; see /metrics"),
    IgnoredFlag("--enable-metrics", False, "/metrics is always served"),
    IgnoredFlag(
        "--enable-cache-report", False, "usage always reports prompt_tokens_details.cached_tokens"
    ),
    IgnoredFlag(
        "--is-embedding",
        False,
        "the model is served as a generation model: /v1/rerank ranks by its yes/no answer (as "
        "SGLang's decoder-only rerankers do), and there are no embeddings (/v1/embeddings, "
        "/encode); generation endpoints stay on",
    ),
)


def ignored_dest(flag: IgnoredFlag) -> str:
    """The argparse destination of a no-op flag (`ignored_cuda_graph_max_bs`)."""
    return "ignored_" + flag.flag.lstrip("-").replace("-", "_")


def ignored_flags(args: argparse.Namespace) -> list[IgnoredFlag]:
    """The no-op flags the command line gave (see IGNORED_FLAGS)."""
    return [f for f in IGNORED_FLAGS if getattr(args, ignored_dest(f)) not in (None, False)]
