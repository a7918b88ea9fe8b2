"""Prometheus metrics. Names are part of the deployment contract: the Grafana
dashboard in deploy/ queries exactly these.

With several workers, prometheus-client runs in multiprocess mode: the CLI sets
PROMETHEUS_MULTIPROC_DIR before any worker imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from model.kernels.dispatch import KERNEL_PATHS
from state_store.base import STORE_ERROR_REASONS, StoreMemory

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

EVENTS_INGESTED = Counter(
    "dygserve_events_ingested",
    "events accepted into the log (applied before the answer, or behind it with wait=false)",
)
EVENTS_APPLIED = Counter(
    "dygserve_events_applied",
    "logged events whose endpoints' states are committed (by the request, in the background or by a re-drive)",
)
EVENTS_REJECTED = Counter("dygserve_events_rejected", "events refused", ["reason"])
EVENTS_DUPLICATE = Counter("dygserve_events_duplicate", "events whose id was seen before")
INGEST_LATENCY = Histogram(
    "dygserve_ingest_latency_seconds", "POST /v1/events latency", buckets=LATENCY_BUCKETS
)
SCORE_LATENCY = Histogram(
    "dygserve_score_latency_seconds", "scoring latency", ["route"], buckets=LATENCY_BUCKETS
)
BATCH_SIZE = Histogram(
    "dygserve_batch_size", "events or pairs per request", ["kind"], buckets=BATCH_BUCKETS
)
COLD_REBUILDS = Counter("dygserve_cold_rebuilds", "node states rebuilt from history")
ADVANCED_DURING_APPEND = Counter(
    "dygserve_advanced_during_append_nodes",
    "node states whose advance ran while their batch's append was in Redis and was kept"
    " (service/overlapped_advance.py)",
)
APPLY_CONFLICTS = Counter(
    "dygserve_apply_conflicts",
    "node states whose compare-and-set another writer won (re-read, then applied again or"
    " found already holding the events)",
)
STORE_LATENCY = Histogram(
    "dygserve_store_latency_seconds", "state-store calls", ["op"], buckets=LATENCY_BUCKETS
)
MODEL_INFO = Gauge(
    "dygserve_model_info", "the loaded model version", ["version"], multiprocess_mode="liveall"
)
KERNEL_PATH = Gauge(
    "dygserve_kernel_path",
    "1 for the computation that advances node states (mamba-ssm, torch-cuda, torch-cpu)",
    ["path"],
    multiprocess_mode="liveall",
)
IN_FLIGHT = Gauge(
    "dygserve_in_flight_requests", "requests in progress", multiprocess_mode="livesum"
)
HTTP_REQUESTS = Counter("dygserve_http_requests", "HTTP requests", ["route", "status"])
STORE_ERRORS = Counter(
    "dygserve_store_errors",
    "store errors with a name, answered 503 (state_store.base.STORE_ERROR_REASONS)",
    ["reason"],
)


# Label values created at start, so that a panel that divides by them (the 5xx ratio,
# rejected events by reason, store errors by reason) shows 0 rather than "no data"
# before the first such event. Statuses: one per class a panel selects, plus the 503
# that the service sheds load and refuses on a store error with.
PRECREATED_STATUSES = ("200", "400", "500", "503")
REJECT_REASONS = ("late", "future")  # state_store.common: late_reason, future_reason


def precreate_series(routes: Iterable[str]) -> None:
    """Every (route, status) of ``PRECREATED_STATUSES``, every reject reason and store
    error reason, at 0 (a ``labels()`` call alone exports the series)."""
    for route in routes:
        for status in PRECREATED_STATUSES:
            HTTP_REQUESTS.labels(route=route, status=status)
    for reason in REJECT_REASONS:
        EVENTS_REJECTED.labels(reason=reason)
    for reason in STORE_ERROR_REASONS:
        STORE_ERRORS.labels(reason=reason)


STALE_CATCHUPS = Counter(
    "dygserve_stale_catchups",
    "node states of a version that was not serving, caught up from their blob on a read",
)
# Per worker (liveall: one series per pid): 1 while it serves another version than
# the store's serving key, i.e. during the bounded mixed-version window of a reload.
MODEL_BEHIND_STORE = Gauge(
    "dygserve_model_behind_store",
    "1 while this worker serves another version than the store's serving version",
    multiprocess_mode="liveall",
)
# Node classification (checkpoints with a node head): answers and their latency by route.
NODES_CLASSIFIED = Counter("dygserve_nodes_classified", "nodes classified", ["route"])
CLASSIFY_LATENCY = Histogram(
    "dygserve_classify_latency_seconds",
    "node-classification latency",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
for _route in ("get_classify", "post_classify"):  # series at 0 from the start (the dashboard)
    NODES_CLASSIFIED.labels(route=_route)
    CLASSIFY_LATENCY.labels(route=_route)


def set_model_version(version: str, previous: str | None = None) -> None:
    if previous is not None and previous != version:
        MODEL_INFO.labels(version=previous).set(0)
    MODEL_INFO.labels(version=version).set(1)


def set_kernel_path(path: str) -> None:
    """1 for ``path``, 0 for the other paths (model/kernels/dispatch.py, KERNEL_PATHS)."""
    for p in {*KERNEL_PATHS, path}:
        KERNEL_PATH.labels(path=p).set(1 if p == path else 0)


class StoreMemoryCollector(Collector):
    """The store's memory use, limit and eviction count, from the last sample
    (``service.store_info``: taken in the background at most every
    ``store_info_interval_s``, never per request). Nothing before the first sample, or
    for a store without such figures (the embedded one).

    A collector, not Gauges: the eviction count is the server's own counter (it resets
    only when Redis restarts, which ``rate`` handles), and in multiprocess mode every
    worker exports the same store's figures with no per-process files to merge."""

    def __init__(self) -> None:
        self.sample: StoreMemory | None = None

    def collect(self) -> Iterator[Metric]:
        m = self.sample
        if m is None:
            return
        yield GaugeMetricFamily(
            "dygserve_store_memory_used_bytes", "memory the state store uses", value=m.used_bytes
        )
        yield GaugeMetricFamily(
            "dygserve_store_memory_max_bytes",
            "the state store's memory limit (Redis maxmemory; 0 = none)",
            value=m.max_bytes,
        )
        yield CounterMetricFamily(
            "dygserve_store_evicted_keys",
            "keys the state store evicted since it started (Redis evicted_keys)",
            value=m.evicted_keys,
        )


STORE_MEMORY = StoreMemoryCollector()


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(STORE_MEMORY)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    REGISTRY.register(STORE_MEMORY)
