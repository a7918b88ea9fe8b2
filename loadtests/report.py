"""What a load run measured: the recorder that collects samples while the run goes, and
the report dataclass it turns into (written as JSON, read back by the plots and docs)."""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROUTE_EVENTS = "POST /v1/events"
ROUTE_SCORE_GET = "GET /v1/score"
ROUTE_SCORE_POST = "POST /v1/score"
SCORE_ROUTES = (ROUTE_SCORE_GET, ROUTE_SCORE_POST)


@dataclass
class LatencyStats:
    """Latency of one route, in milliseconds, over every answered request (any status)."""

    count: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0

    @classmethod
    def from_seconds(cls, samples: list[float] | np.ndarray) -> LatencyStats:
        a = np.asarray(samples, dtype=np.float64) * 1e3
        if a.size == 0:
            return cls()
        p50, p95, p99 = np.percentile(a, [50, 95, 99])
        return cls(
            count=int(a.size),
            mean_ms=float(a.mean()),
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            max_ms=float(a.max()),
        )


@dataclass
class LoadReport:
    """The result of one replay run (all counts are totals over the run)."""

    url: str
    dataset: str
    started_at: float  # unix time
    elapsed_s: float
    stop_reason: str  # "max_events" | "duration" | "data_exhausted" | "stopped"
    config: dict[str, Any] = field(default_factory=dict)
    # ingestion (events are counted once each, however many attempts they took)
    events_sent: int = 0  # events in batches handed to a client
    events_answered: int = 0  # events in batches answered 200
    events_accepted: int = 0
    events_duplicate: int = 0
    events_rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    events_failed: int = 0  # events in batches that never got a 200 (errors)
    event_batches: int = 0
    # scoring
    score_requests: dict[str, int] = field(default_factory=dict)  # route -> answered 200
    score_pairs: int = 0  # pairs in score answers with status 200
    score_target_rate: float = 0.0
    # rates over elapsed_s
    events_per_s: float = 0.0  # events answered (accepted + duplicate + rejected) per second
    accepted_per_s: float = 0.0
    score_requests_per_s: float = 0.0
    pairs_per_s: float = 0.0
    # per route
    requests: dict[str, int] = field(default_factory=dict)  # route -> attempts
    latency: dict[str, LatencyStats] = field(default_factory=dict)
    status_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # route -> status -> n
    errors_by_status: dict[str, int] = field(default_factory=dict)  # non-200 status / transport
    errors: int = 0
    error_samples: dict[str, str] = field(default_factory=dict)  # status -> first body (truncated)
    retries: int = 0
    # per-second series: {"t": [...], "width": [...], "events": [...], "accepted": [...],
    # "score_requests": [...], "pairs": [...], "errors": [...]}: counts completed within each
    # bucket [t, t + width) (divide by width for a rate)
    timeline: dict[str, list[float]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadReport:
        d = dict(d)
        d["latency"] = {k: LatencyStats(**v) for k, v in d.get("latency", {}).items()}
        return cls(**d)

    @classmethod
    def read_json(cls, path: str | Path) -> LoadReport:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def summary(self) -> str:
        lines = [
            f"{self.dataset} -> {self.url}: {self.elapsed_s:.1f}s ({self.stop_reason})",
            f"  events: sent {self.events_sent}, accepted {self.events_accepted}, "
            f"duplicate {self.events_duplicate}, rejected {self.events_rejected}"
            f"{' ' + str(dict(self.rejected_by_reason)) if self.rejected_by_reason else ''}, "
            f"failed {self.events_failed}",
            f"  events/s {self.events_per_s:.1f} (accepted/s {self.accepted_per_s:.1f}); "
            f"score req/s {self.score_requests_per_s:.1f} (target {self.score_target_rate:g}); "
            f"pairs/s {self.pairs_per_s:.1f}",
        ]
        for route, s in self.latency.items():
            lines.append(
                f"  {route:<16} n={s.count:<7} p50 {s.p50_ms:8.2f} ms  p95 {s.p95_ms:8.2f} ms  "
                f"p99 {s.p99_ms:8.2f} ms  max {s.max_ms:8.2f} ms"
            )
        if self.errors:
            lines.append(
                f"  errors: {self.errors} {self.errors_by_status} (retries {self.retries})"
            )
        return "\n".join(lines)


class Recorder:
    """Collects per-request samples during a run (single event loop: no locking needed)."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.t0 = clock()
        self.started_at = time.time()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, Counter[str]] = defaultdict(Counter)
        self.events_sent = 0
        self.events_answered = 0
        self.events_accepted = 0
        self.events_duplicate = 0
        self.events_rejected = 0
        self.rejected_by_reason: Counter[str] = Counter()
        self.events_failed = 0
        self.event_batches = 0
        self.score_ok: Counter[str] = Counter()
        self.score_pairs = 0
        self.retries = 0
        self.error_samples: dict[str, str] = {}
        # per-second buckets
        self._series: dict[str, defaultdict[int, float]] = {
            k: defaultdict(float)
            for k in ("events", "accepted", "score_requests", "pairs", "errors")
        }

    def now(self) -> float:
        """Seconds since the start of the run."""
        return self.clock() - self.t0

    def _bucket(self, name: str, n: float = 1.0) -> None:
        self._series[name][int(self.now())] += n

    def request(self, route: str, status: str, latency_s: float) -> None:
        """One HTTP attempt; ``status`` is the code as a string or ``transport:<Error>``."""
        if latency_s >= 0 and not status.startswith("transport:"):
            self.latencies[route].append(latency_s)
        self.status[route][status] += 1
        if status != "200":
            self._bucket("errors")

    def error_sample(self, status: str, text: str) -> None:
        """Keep the first answer body seen for each error status (to explain a 4xx)."""
        if status not in self.error_samples:
            self.error_samples[status] = text[:500]

    def events_batch_done(
        self, n: int, accepted: int, duplicates: int, rejected_reasons: list[str]
    ) -> None:
        self.events_answered += n
        self.events_accepted += accepted
        self.events_duplicate += duplicates
        self.events_rejected += len(rejected_reasons)
        self.rejected_by_reason.update(rejected_reasons)
        self._bucket("events", n)
        self._bucket("accepted", accepted)

    def events_batch_failed(self, n: int) -> None:
        self.events_failed += n

    def score_done(self, route: str, pairs: int) -> None:
        self.score_ok[route] += 1
        self.score_pairs += pairs
        self._bucket("score_requests")
        self._bucket("pairs", pairs)

    def timeline(self, elapsed: float) -> dict[str, list[float]]:
        n = max(1, math.ceil(elapsed))
        out: dict[str, list[float]] = {
            "t": [float(i) for i in range(n)],
            # seconds each bucket covers (the last one is usually partial)
            "width": [1.0] * (n - 1) + [max(1e-3, elapsed - (n - 1))],
        }
        for k, s in self._series.items():
            out[k] = [float(s.get(i, 0.0)) for i in range(n)]
        return out

    def build(
        self,
        *,
        url: str,
        dataset: str,
        stop_reason: str,
        config: dict[str, Any],
        score_target_rate: float,
        elapsed: float | None = None,
    ) -> LoadReport:
        elapsed = self.now() if elapsed is None else elapsed
        el = max(elapsed, 1e-9)
        errors_by_status: Counter[str] = Counter()
        for c in self.status.values():
            for st, n in c.items():
                if st != "200":
                    errors_by_status[st] += n
        score_total = sum(self.score_ok.values())
        return LoadReport(
            url=url,
            dataset=dataset,
            started_at=self.started_at,
            elapsed_s=elapsed,
            stop_reason=stop_reason,
            config=config,
            events_sent=self.events_sent,
            events_answered=self.events_answered,
            events_accepted=self.events_accepted,
            events_duplicate=self.events_duplicate,
            events_rejected=self.events_rejected,
            rejected_by_reason=dict(self.rejected_by_reason),
            events_failed=self.events_failed,
            event_batches=self.event_batches,
            score_requests={r: int(self.score_ok.get(r, 0)) for r in SCORE_ROUTES},
            score_pairs=self.score_pairs,
            score_target_rate=score_target_rate,
            events_per_s=self.events_answered / el,
            accepted_per_s=self.events_accepted / el,
            score_requests_per_s=score_total / el,
            pairs_per_s=self.score_pairs / el,
            requests={r: int(sum(c.values())) for r, c in self.status.items()},
            latency={r: LatencyStats.from_seconds(v) for r, v in self.latencies.items()},
            status_counts={r: dict(c) for r, c in self.status.items()},
            errors_by_status=dict(errors_by_status),
            errors=int(sum(errors_by_status.values())),
            error_samples=dict(self.error_samples),
            retries=self.retries,
            timeline=self.timeline(elapsed),
        )
