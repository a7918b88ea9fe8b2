"""Prometheus metrics. Names are part of the deployment contract: the Grafana
dashboard in deploy/ queries exactly these.

With several workers, prometheus-client runs in multiprocess mode: the CLI sets
PROMETHEUS_MULTIPROC_DIR before any worker imports this module.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from model.kernels.dispatch import KERNEL_PATHS

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


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
