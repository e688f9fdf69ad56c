"""ServerMetrics: the Prometheus families of one app, in its own CollectorRegistry.

Names: a family SGLang also exports keeps SGLang's own name (`sglang:time_to_first_token_seconds`,
`sglang:cache_hit_rate`, ...), so SGLang's Grafana dashboards and alerts read an sgl_lite server
unchanged; families SGLang does not have are `sgl_lite:`-prefixed. Every family carries the
`model_name` label (the served model name), as in SGLang and vLLM.

Request latencies are measured where SGLang measures them, on the receiving side: the bridge
hands each output the engine publishes to a `RequestTracker` as it arrives (TTFT, inter-token
latency, end-to-end latency, token counts), so the engine loop does no metrics work. Engine
state (queues, KV pool, cache hit rate, grammar compile times) is read from
`engine.get_server_info()` at scrape time, so gauges are never stale.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from sgl_lite.backend.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# SGLang's default buckets (python/sglang/srt/metrics/collector.py)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS[:-1], 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    *(0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08),
    *(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0),
)


def grammar_refused(error: Any) -> bool:
    """Whether a refusal was the request's constraint's (`Engine.refused_for_constraint`: the
    pattern itself, or a budget its compiled grammar cannot fit)."""
    return Engine.refused_for_constraint(error)


LABEL = "model_name"

# (name, help, how to read it from engine.get_server_info())
_ENGINE_GAUGES = (
    ("sglang:num_running_reqs", "Requests in the running batch", "num_running_reqs"),
    ("sglang:num_queue_reqs", "Requests in the waiting queue", "num_waiting_reqs"),
    (
        "sgl_lite:num_queued_reqs",
        "Requests submitted and not yet running (what --max-queued-requests bounds)",
        "num_queued_reqs",
    ),
    (
        "sglang:cache_hit_rate",
        "Prompt tokens served from the radix cache / prompt tokens scheduled",
        "cache_hit_rate",
    ),
    ("sgl_lite:radix_cached_tokens", "Tokens held by the radix cache", "cached_tokens"),
)
_ENGINE_COUNTERS = (
    ("sglang:num_retracted_reqs", "Running requests preempted to free KV slots", "preemptions"),
    ("sgl_lite:radix_evicted_tokens", "Tokens evicted from the radix cache", "evicted_tokens"),
)


_NO_BUILDS = {"count": 0, "sum": 0.0, "failures": 0, "buckets": [["+Inf", 0]]}


class _EngineCollector(Collector):
    """Gauges and counters of engine state, read from one `get_server_info()` per scrape."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self) -> Iterator[Any]:
        info = self.engine.get_server_info()
        labels = [self.model_name]
        for name, doc, key in _ENGINE_GAUGES:
            yield _gauge(name, doc, labels, info.get(key, 0))
        for name, doc, key in _ENGINE_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=[LABEL])
            family.add_metric(labels, float(info.get(key, 0)))
            yield family
        used, free = info.get("pool_used_tokens", 0), info.get("pool_free_tokens", 0)
        total = used + free
        # SGLang's "used" leaves out what the radix cache could evict on demand.
        in_use = used - info.get("evictable_tokens", 0)
        yield _gauge("sglang:max_total_num_tokens", "KV pool slots", labels, total)
        yield _gauge(
            "sglang:num_used_tokens", "KV pool slots in use (not evictable cache)", labels, in_use
        )
        usage = in_use / total if total else 0.0
        yield _gauge("sglang:token_usage", "num_used_tokens / max_total_num_tokens", labels, usage)
        yield _gauge(
            "sgl_lite:kv_pool_used_tokens", "KV pool slots taken, cache included", labels, used
        )
        # None until the first constrained request builds the compiler: zero builds until then
        stats = info.get("grammar_compiles") or _NO_BUILDS
        yield from _grammar_families(stats, labels)


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[LABEL])
    family.add_metric(labels, float(value))
    return family


def _grammar_families(stats: dict[str, Any], labels: list[str]) -> Iterator[Any]:
    """The compile-time histogram and failure count of the engine's grammar builds."""
    hist = HistogramMetricFamily(
        "sglang:grammar_compilation_time_seconds",
        "Grammar builds (regex / JSON Schema / EBNF to automaton), in seconds",
        labels=[LABEL],
    )
    buckets = [(_le(bound), float(count)) for bound, count in stats["buckets"]]
    hist.add_metric(labels, buckets, sum_value=float(stats["sum"]))
    yield hist
    failed = CounterMetricFamily(
        "sgl_lite:grammar_build_failures", "Grammar builds that failed", labels=[LABEL]
    )
    failed.add_metric(labels, float(stats["failures"]))
    yield failed


def _le(bound: float | str) -> str:
    return bound if isinstance(bound, str) else repr(float(bound))


class RequestTracker:
    """The timings of one submission's requests, fed with each output as it arrives."""

    def __init__(self, metrics: ServerMetrics, started: float, num_requests: int) -> None:
        self.metrics = metrics
        self.started = started
        self.last_time = [started] * num_requests
        self.last_tokens = [0] * num_requests

    def output(self, i: int, meta: dict[str, Any], reason: Any = None) -> None:
        """Request `i` published `meta` (its meta_info so far); `reason` its FinishReason."""
        now = time.perf_counter()
        tokens = meta["completion_tokens"]
        new = tokens - self.last_tokens[i]
        if new > 0:
            if self.last_tokens[i] == 0:
                self.metrics.ttft.observe(now - self.started)
            else:
                self.metrics.observe_inter_token(now - self.last_time[i], new)
            self.last_time[i], self.last_tokens[i] = now, tokens
        if meta["finish_reason"] is not None:
            self.metrics.observe_finished(meta, now - self.started, reason)


class ServerMetrics:
    """The metrics of one server; `render()` is the body of `GET /metrics`."""

    def __init__(self, engine: Any, model_name: str = "default") -> None:
        self.model_name = model_name
        self.registry = reg = CollectorRegistry(auto_describe=False)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, [LABEL], registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, [LABEL], buckets=buckets, registry=reg).labels(model_name)

        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter(
            "sglang:generation_tokens", "Tokens generated by finished requests"
        )
        self.cached_tokens = counter(
            "sglang:cached_tokens", "Prompt tokens of finished requests served from the cache"
        )
        self.num_requests = counter("sglang:num_requests", "Generation requests finished")
        self.num_aborted = counter("sglang:num_aborted_requests", "Requests that ended in abort")
        self.num_constrained = counter(
            "sglang:num_so_requests", "Structured-output (constrained) requests finished"
        )
        self.grammar_aborted = counter(
            "sglang:num_grammar_aborted",
            "Requests refused for their constraint: it did not compile, timed out, or cannot "
            "fit in max_new_tokens",
        )
        self.ttft = histogram(
            "sglang:time_to_first_token_seconds", "From arrival to the first token", TTFT_BUCKETS
        )
        self.inter_token = histogram(
            "sglang:inter_token_latency_seconds",
            "Time per output token after the first",
            ITL_BUCKETS,
        )
        self.e2e_latency = histogram(
            "sglang:e2e_request_latency_seconds", "From arrival to the last token", E2E_BUCKETS
        )
        self.finished = Counter(
            "sgl_lite:requests_finished",
            "Generation requests finished, by finish reason",
            [LABEL, "finish_reason"],
            registry=reg,
        )
        # Constrained outputs (Guide.meta_info, constrained/protocols.py): closed by the budget,
        # or failing the final check against their constraint (never passed off as success).
        self.budget_closed = counter(
            "sgl_lite:budget_closed", "Constrained outputs the token budget closed"
        )
        self.constraint_violations = counter(
            "sgl_lite:constraint_violations",
            "Constrained outputs that failed validation against their constraint",
        )
        self.rejected = counter(
            "sgl_lite:rejected_requests",
            "Generation requests refused because the queue was full (503 / 429)",
        )
        self.http_requests = Counter(
            "sgl_lite:http_requests",
            "HTTP responses by route and status",
            [LABEL, "route", "status"],
            registry=reg,
        )
        reg.register(_EngineCollector(engine, model_name))

    def track(self, started: float, num_requests: int) -> RequestTracker:
        """A tracker for a submission of `num_requests` that arrived at `started`."""
        return RequestTracker(self, started, num_requests)

    def observe_inter_token(self, interval: float, new_tokens: int) -> None:
        """`new_tokens` arrived `interval` seconds after the previous ones (each one observes
        interval / new_tokens, as SGLang counts a multi-token step)."""
        per_token = interval / new_tokens
        for _ in range(new_tokens):
            self.inter_token.observe(per_token)

    def observe_finished(self, meta: dict[str, Any], latency: float, reason: Any = None) -> None:
        """Records one finished request: its meta_info, its latency, its FinishReason."""
        kind = (meta.get("finish_reason") or {}).get("type", "unknown")
        self.finished.labels(self.model_name, kind).inc()
        self.num_requests.inc()
        self.prompt_tokens.inc(meta.get("prompt_tokens", 0))
        self.generation_tokens.inc(meta.get("completion_tokens", 0))
        self.cached_tokens.inc(meta.get("cached_tokens", 0))
        self.e2e_latency.observe(latency)
        if kind == "abort":
            self.num_aborted.inc()
            if grammar_refused(getattr(reason, "error", None)):
                self.grammar_aborted.inc()
        if "budget_closed" in meta:  # present exactly for finished constrained outputs
            self.num_constrained.inc()
            self.budget_closed.inc(bool(meta["budget_closed"]))
            self.constraint_violations.inc(meta.get("constraint_violation") is not None)

    def observe_invalid(self, error: Any) -> None:
        """A request refused at submission (an InvalidRequest): counted if its grammar was."""
        if grammar_refused(error):
            self.grammar_aborted.inc()

    def observe_rejected(self) -> None:
        """Counts one request refused for overload."""
        self.rejected.inc()

    def observe_http(self, route: str, status: int) -> None:
        """Counts one HTTP response."""
        self.http_requests.labels(self.model_name, route, str(status)).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of everything (blocks on the engine for its gauges)."""
        return generate_latest(self.registry)
