"""Prometheus metrics of the live evaluation (``service.live_eval``).

Kept beside ``service.metrics`` rather than in it: the same registry, the same
deployment contract (the dashboard and ``deploy/alerts.yml`` query these names).
Each worker process keeps its own window, so in multiprocess mode the gauges are
one series per live worker (``liveall``); the dashboard averages them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Probabilities of the scored positives and negatives, in twentieths.
PROBABILITY_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))

LIVE_AP = Gauge(
    "dygserve_live_ap",
    "average precision of the last N live samples (each negative weighs 1/K: the scale of a 1:1 test AP)",
    multiprocess_mode="liveall",
)
LIVE_AUC = Gauge(
    "dygserve_live_auc", "ROC AUC of the last N live samples", multiprocess_mode="liveall"
)
LIVE_MRR = Gauge(
    "dygserve_live_mrr",
    "mean reciprocal rank of each live positive among its K negatives, last N samples",
    multiprocess_mode="liveall",
)
LIVE_WINDOW = Gauge(
    "dygserve_live_window_samples",
    "live samples in the rolling window (the gauges mean little while it is small)",
    multiprocess_mode="liveall",
)
REFERENCE_AP = Gauge(
    "dygserve_checkpoint_test_ap",
    "the served checkpoint's test AP (transductive, random negatives) from its metrics.json",
    multiprocess_mode="liveall",
)
LIVE_SAMPLES = Counter(
    "dygserve_live_eval_samples", "ingested events scored as live samples against K negatives"
)
LIVE_SKIPPED = Counter(
    "dygserve_live_eval_skipped",
    "sampled events (or whole batches, reason batch_*) not scored, by reason",
    ["reason"],
)
LIVE_SCORE = Histogram(
    "dygserve_live_score",
    "probability given to live samples, positives and their negatives",
    ["label"],
    buckets=PROBABILITY_BUCKETS,
)

SKIP_REASONS = (
    "not_visible",  # an endpoint's state already holds an event at or after the sample's time
    "few_destinations",  # fewer than K known destinations could be drawn with exact visibility
    "batch_store_error",  # the apply failed on a store error: nothing to evaluate
    "batch_failed",  # the apply failed otherwise
    "batch_backlog",  # the evaluator was behind by live_eval_queue batches
    "batch_error",  # the evaluation itself failed (logged)
    "cpu_budget",  # the evaluator had used its share of a core (live_eval_cpu_budget)
    # transition counts: where a row's counterpart had been was not in the apply's hands
    "counterpart_unknown",
)
for _reason in SKIP_REASONS:  # every series exists from the start, at 0
    LIVE_SKIPPED.labels(reason=_reason)
for _label in ("positive", "negative"):
    LIVE_SCORE.labels(label=_label)
