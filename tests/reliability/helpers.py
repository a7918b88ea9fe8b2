"""Shared pieces of the reliability tests: a multi-client ingest driver that retries
with the same event ids, and the exactly-once verification (stored log vs. client
outcomes, per-node counts over HTTP, states vs. a clean sequential replay).

Everything talks to real processes: redis-server (tests.support.redis_server) and the
service (`python -m service.cli serve`, tests.support.service_process), over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import torch

from service.engine import ModelRuntime
from state_store.applier import apply_logged, logged_events
from state_store.base import LoggedEvent, NewEvent
from state_store.config import RedisStoreConfig
from state_store.memory import InMemoryStore
from state_store.redis_store import RedisStore
from tests.support.service_process import ServiceProcess, start_service
from tests.support.store_model import read_whole_log
from training.data import read_edge_stream

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CHECKPOINT = REPO / "checkpoints" / "default"
STATE_TOL = 1e-5  # elementwise, relative to 1 + |reference| (see verify_exactly_once)


# ----------------------------------------------------------------------------- data


def uci_events(data_dir: Path, n: int, prefix: str = "uci") -> list[dict[str, Any]]:
    """The first ``n`` UCI interactions (time order) as wire events with stable ids."""
    s = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=n)
    return [
        {"src": str(a), "dst": str(b), "t": float(t), "event_id": f"{prefix}-{i}"}
        for i, (a, b, t) in enumerate(zip(s.src, s.dst, s.t, strict=True))
    ]


def batches_of(rows: list[Any], size: int) -> list[list[Any]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def wait_until(
    pred: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except Exception:  # noqa: BLE001 - a probe that fails counts as "not yet"
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        time.sleep(interval)


def serve(workdir: Path, env: dict[str, str], timeout: float = 90.0) -> ServiceProcess:
    """The real service in its own process (a fresh log folder per start)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return start_service(workdir, env, timeout=timeout)


# ----------------------------------------------------------------------------- driver


@dataclass
class Batch:
    index: int
    events: list[dict[str, Any]]
    attempts: list[str] = field(default_factory=list)  # per attempt: status code or exception name
    response: dict[str, Any] | None = None  # the 200 answer (the last attempt)
    first_sent: float | None = None
    acked_at: float | None = None

    @property
    def rejected(self) -> dict[int, str]:
        return {r["index"]: r["reason"] for r in (self.response or {}).get("rejected", [])}

    @property
    def failed_attempts(self) -> int:
        return sum(a != "200" for a in self.attempts)


class Driver:
    """``n_clients`` sender threads fed by one ordered sequencer of batches.

    A sender takes the next batch (in time order) and POSTs it to ``self.url``; until it
    gets a 200 it retries the SAME batch (same event ids). After a failed attempt it
    waits for ``self.up`` (the test clears it while the service is down and may change
    ``self.url``), then retries. With ``retry=False`` a failed batch is left for the test
    to look at and re-driven with ``resume()``. 4xx answers other than 429 fail the run.
    """

    def __init__(
        self,
        batches: list[list[dict[str, Any]]],
        url: str,
        n_clients: int = 8,
        timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        pause_s: float = 0.0,
        keepalive: bool = True,
    ) -> None:
        self.batches = [Batch(i, b) for i, b in enumerate(batches)]
        self.url = url
        self.n_clients = n_clients
        self.timeout = timeout
        self.headers = headers or {}
        self.pause_s = pause_s
        # keepalive=False: a new connection per request, so the kernel spreads them
        # over all of uvicorn's worker processes (kept-alive ones stick to one)
        self.limits = httpx.Limits() if keepalive else httpx.Limits(max_keepalive_connections=0)
        self.up = threading.Event()
        self.up.set()
        self._next = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.statuses: Counter[str] = Counter()
        self.slowest_answer_s = 0.0
        self.retry_after_seen: list[str] = []

    # --- progress
    @property
    def acked(self) -> int:
        return sum(b.response is not None for b in self.batches)

    def done(self) -> bool:
        return all(b.response is not None for b in self.batches)

    # --- run
    def start(self) -> Driver:
        for k in range(self.n_clients):
            t = threading.Thread(target=self._sender, name=f"sender-{k}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, (
            f"senders still running after {timeout}s: {alive}; errors {self.errors[:5]}"
        )
        assert not self.errors, self.errors[:5]

    def _take(self) -> Batch | None:
        with self._lock:
            if self._next >= len(self.batches):
                return None
            b = self.batches[self._next]
            self._next += 1
            return b

    def _sender(self) -> None:
        with httpx.Client(timeout=self.timeout, headers=self.headers, limits=self.limits) as client:
            while True:
                b = self._take()
                if b is None:
                    return
                try:
                    self._send_until_acked(client, b)
                except Exception as e:  # noqa: BLE001 - reported by join()
                    self.errors.append(f"batch {b.index}: {type(e).__name__}: {e}")
                    return
                if self.pause_s:
                    time.sleep(self.pause_s)

    def _send_until_acked(self, client: httpx.Client, b: Batch) -> None:
        while True:
            self.up.wait()
            url = self.url
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            t0 = time.monotonic()
            if b.first_sent is None:
                b.first_sent = t0
            try:
                r = client.post(f"{url}/v1/events", json={"events": b.events})
                outcome = str(r.status_code)
            except httpx.TimeoutException as e:
                outcome = "timeout"
                self.errors.append(
                    f"batch {b.index}: no answer within {self.timeout}s ({type(e).__name__})"
                )
            except httpx.HTTPError as e:
                outcome = type(e).__name__
                r = None
            finally:
                with self._lock:
                    self.in_flight -= 1
                    self.slowest_answer_s = max(self.slowest_answer_s, time.monotonic() - t0)
            b.attempts.append(outcome)
            self.statuses[outcome] += 1
            if outcome == "200":
                b.response = r.json()
                b.acked_at = time.monotonic()
                return
            if r is not None and r.status_code == 503:
                self.retry_after_seen.append(r.headers.get("retry-after", ""))
            if r is not None and 400 <= r.status_code < 500 and r.status_code != 429:
                raise AssertionError(f"refused with {r.status_code}: {r.text[:300]}")
            if outcome == "timeout":
                raise AssertionError("request hung")
            time.sleep(0.1)

    # --- accounting
    def outcome_summary(self) -> dict[str, int]:
        acked = [b for b in self.batches if b.response is not None]
        return {
            "events_sent": sum(len(b.events) for b in self.batches),
            "batches": len(self.batches),
            "batches_retried": sum(b.failed_attempts > 0 for b in self.batches),
            "failed_attempts": sum(b.failed_attempts for b in self.batches),
            "accepted": sum(b.response["accepted"] for b in acked),
            "duplicates": sum(b.response["duplicates"] for b in acked),
            "rejected": sum(len(b.response["rejected"]) for b in acked),
            "max_in_flight": self.max_in_flight,
        }


# ----------------------------------------------------------------------------- verification


def redis_store(url: str) -> RedisStore:
    return RedisStore(RedisStoreConfig(url=url))


def check_log_against_outcomes(log: list[LoggedEvent], batches: list[Batch]) -> dict[str, int]:
    """Every event a client saw accepted or reported as duplicate is in the log exactly
    once; every event it saw rejected is not; the log holds nothing else."""
    ids = [e.event_id for e in log]
    assert len(ids) == len(set(ids)), "an event id is logged twice"
    assert [e.seq for e in log] == list(range(1, len(log) + 1)), "seqs are not 1..n (log trimmed?)"
    logged, refused = set(), {}
    for b in batches:
        assert b.response is not None, f"batch {b.index} never acknowledged"
        rej = b.rejected
        assert b.response["accepted"] + b.response["duplicates"] + len(rej) == len(b.events)
        for i, e in enumerate(b.events):
            if i in rej:
                refused[e["event_id"]] = rej[i]
            else:
                logged.add(e["event_id"])
    in_log = set(ids)
    lost = logged - in_log
    assert not lost, f"{len(lost)} acknowledged events are not in the log, e.g. {sorted(lost)[:5]}"
    wrongly = in_log & set(refused)
    assert not wrongly, f"{len(wrongly)} rejected events were logged, e.g. {sorted(wrongly)[:5]}"
    assert in_log == logged, f"{len(in_log - logged)} logged events no client was told about"
    reasons = Counter(r.split(":", 1)[0] for r in refused.values())
    return {
        "logged": len(in_log),
        "rejected": len(refused),
        **{f"rejected_{k}": v for k, v in reasons.items()},
    }


def replay(log: list[LoggedEvent], runtime: ModelRuntime, batch: int = 2000) -> InMemoryStore:
    """A clean sequential replay of a stored log through the same model on a fresh store."""
    ref = InMemoryStore(history_cap=10**9)
    for chunk in batches_of(log, batch):
        new = [NewEvent(e.src, e.dst, e.t, e.features, e.event_id) for e in chunk]
        res = ref.append_events(new)
        assert res.seqs == [e.seq for e in chunk], "the replay must reproduce the stored seqs"
        with torch.no_grad():
            apply_logged(ref, runtime.version, logged_events(new, res), runtime.advance_blobs)
    return ref


def node_counts(log: list[LoggedEvent]) -> Counter[str]:
    c: Counter[str] = Counter()
    for e in log:
        c[e.src] += 1
        if e.dst != e.src:
            c[e.dst] += 1
    return c


def verify_exactly_once(
    redis_url: str, service_url: str, runtime: ModelRuntime, pending_timeout: float = 30.0
) -> dict[str, Any]:
    """No pending events; each node's events_applied (over HTTP) equals its history
    length and its number of logged events; the stored states equal a clean sequential
    replay of the stored log (same t_last/seq/count, max abs difference <= STATE_TOL)."""
    store = redis_store(redis_url)
    try:
        wait_until(lambda: store.pending(1) == [], pending_timeout, 0.2, "the pending set to drain")
        log = read_whole_log(store)
        counts = node_counts(log)
        nodes = sorted(counts)
        with httpx.Client(base_url=service_url, timeout=30.0) as c:
            for n in nodes:
                s = c.get(f"/v1/nodes/{quote(n, safe='')}").json()
                assert s["cached"], (n, s)
                assert s["events_applied"] == s["history_length"] == counts[n], (n, s, counts[n])
        ref = replay(log, runtime)
        got = store.read_states(runtime.version, nodes)
        want = ref.read_states(runtime.version, nodes)
        assert all(b is not None for b in got) and all(b is not None for b in want)
        a, b = runtime.codec.decode_many(got), runtime.codec.decode_many(want)  # type: ignore[arg-type]
        assert torch.equal(a.n_events, b.n_events), "event counts differ from the replay"
        assert torch.equal(a.last_seq, b.last_seq), "watermark seqs differ from the replay"
        assert torch.equal(a.t_last, b.t_last), "watermark times differ from the replay"
        assert bool(torch.isfinite(a.h).all()) and bool(torch.isfinite(a.conv).all())
        diff = max(float((a.h - b.h).abs().max()), float((a.conv - b.conv).abs().max()))
        scaled = max(
            float(((a.h - b.h).abs() / (1 + b.h.abs())).max()),
            float(((a.conv - b.conv).abs() / (1 + b.conv.abs())).max()),
        )
        # Counts and watermarks are compared exactly above (a lost, doubled or reordered
        # event shows there). The arrays are float32 and reach |h| ~ 18 on UCI, where one
        # ulp is 1.9e-6; the row results of a matmul depend on the batch shape, so two
        # CLEAN sequential replays of one log cut into batches of 1 and of 2000 already
        # differ by 4.5e-6 absolute, 1.5e-6 scaled by 1 + |h| (docs/RELIABILITY.md).
        # Hence the tolerance: |a - b| <= STATE_TOL * (1 + |b|) elementwise.
        assert scaled <= STATE_TOL, f"state difference {scaled} (scaled by 1+|h|) > {STATE_TOL}"
        return {
            "log": log,
            "nodes": len(nodes),
            "events_logged": len(log),
            "max_abs_diff": diff,
            "max_scaled_diff": scaled,
            "max_abs_h": float(b.h.abs().max()),
        }
    finally:
        store.close()
