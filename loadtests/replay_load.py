"""Replay a real edge stream against a running dygserve service and measure it.

One ordered producer cuts the dataset (time-ordered rows) into consecutive batches and
hands them to ``--concurrency`` client tasks that POST them to ``/v1/events``. With
``--ordering gated`` (the default) a batch is handed out only when no batch still in
flight touches one of its nodes, so every node sees its events in stream order however
many clients run (batches over disjoint nodes go in parallel). ``--ordering free`` drops
that guard; the service then refuses out-of-order events per node, and those refusals
are counted as ``rejected`` (by reason), never as errors.

Meanwhile ``--score-concurrency`` tasks send score queries at ``--score-rate`` requests
per second in total: ``GET /v1/score`` for one pair and/or ``POST /v1/score`` with
``--score-batch`` pairs, each pair drawn from recently acknowledged events (half real
pairs, half a recent source with another recent destination), at the current stream
time (the latest acknowledged event time).

The run stops at ``--max-events`` events, after ``--duration`` seconds, or when the data
run out (``--loop`` replays the stream again shifted past its end, for soaks). Only
loopback hosts are accepted unless ``--allow-remote``.

    python -m loadtests.replay_load --url http://127.0.0.1:8000 \\
        --data ../shared/data/uci/edges.csv.gz --out runs/load

Writes ``report.json`` (see ``loadtests.report.LoadReport``), ``latency_hist.png`` and
``throughput.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import functools
import gzip
import io
import ipaddress
import os
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from loadtests.report import (
    ROUTE_EVENTS,
    ROUTE_SCORE_GET,
    ROUTE_SCORE_POST,
    LoadReport,
    Recorder,
)
from service.client import (
    AsyncDygserveClient,
    Attempt,
    ClientConfig,
    DygserveError,
    InvalidResponse,
    RetryPolicy,
)

NON_FEATURE_COLUMNS = ("src", "dst", "ts", "label")  # as training/data.py: label is no feature
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
ROUTES = {
    ("POST", "/v1/events"): ROUTE_EVENTS,
    ("GET", "/v1/score"): ROUTE_SCORE_GET,
    ("POST", "/v1/score"): ROUTE_SCORE_POST,
}


# --------------------------------------------------------------------------- data


@dataclass
class EventTable:
    """A time-ordered slice of a dataset, ready to be sent (ids as strings, t float64)."""

    src: list[str]
    dst: list[str]
    t: np.ndarray  # float64, non-decreasing
    features: list[list[float]] | None
    feature_names: tuple[str, ...]
    name: str
    first_row: int = 0

    def __len__(self) -> int:
        return len(self.src)


def resolve_data_path(data: str | Path) -> Path:
    """A CSV path, a dataset folder, or a bare dataset name under ``$DYGSERVE_DATA``
    (default ``../shared/data`` beside the repository)."""
    p = Path(data)
    if p.is_dir():
        p = p / "edges.csv.gz"
    if p.exists():
        return p
    if len(p.parts) == 1:
        root = Path(
            os.environ.get("DYGSERVE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
        )
        cand = root / str(data) / "edges.csv.gz"
        if cand.exists():
            return cand
    raise FileNotFoundError(f"dataset not found: {data}")


def dataset_name(path: Path) -> str:
    return path.parent.name if path.name.startswith("edges.csv") else path.name.split(".")[0]


def read_events(
    path: str | Path, features: str = "auto", limit: int | None = None, start_row: int = 0
) -> EventTable:
    """Read ``src,dst,ts[,label][,extra...]`` rows (gzip or plain CSV) in file order.

    ``features``: ``auto`` = every column other than src/dst/ts/label (the convention of
    ``training/data.py``: ``f0..f3`` for MOOC, ``rating``, ``day``); ``none``; or a comma list
    of column names. ``limit`` rows are read after skipping ``start_row``.
    """
    path = resolve_data_path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as raw:
        fh = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader)]
        if header[:3] != ["src", "dst", "ts"]:
            raise ValueError(f"{path}: expected columns src,dst,ts first, got {header[:3]}")
        if features == "auto":
            fcols = [i for i, h in enumerate(header) if h not in NON_FEATURE_COLUMNS]
        elif features in ("none", ""):
            fcols = []
        else:
            names = [c.strip() for c in features.split(",") if c.strip()]
            missing = [c for c in names if c not in header]
            if missing:
                raise ValueError(f"{path}: no feature column(s) {missing}; columns are {header}")
            fcols = [header.index(c) for c in names]
        src: list[str] = []
        dst: list[str] = []
        ts: list[float] = []
        feats: list[list[float]] = []
        for i, row in enumerate(reader):
            if i < start_row:
                continue
            if limit is not None and len(src) >= limit:
                break
            src.append(row[0].strip())
            dst.append(row[1].strip())
            ts.append(float(row[2]))
            if fcols:
                feats.append([float(row[j]) for j in fcols])
    t = np.asarray(ts, dtype=np.float64)
    if t.size and not np.all(np.isfinite(t)):
        raise ValueError(f"{path}: non-finite timestamps")
    if t.size > 1 and np.any(np.diff(t) < 0):  # the shared files are sorted; be safe anyway
        order = np.argsort(t, kind="stable")
        src = [src[k] for k in order]
        dst = [dst[k] for k in order]
        feats = [feats[k] for k in order] if fcols else feats
        t = t[order]
    return EventTable(
        src=src,
        dst=dst,
        t=t,
        features=feats if fcols else None,
        feature_names=tuple(header[j] for j in fcols),
        name=dataset_name(path),
        first_row=start_row,
    )


# --------------------------------------------------------------------------- config


def is_loopback_url(url: str) -> bool:
    """True when the URL's host is a loopback address or a loopback name (no DNS lookup)."""
    host = urlsplit(url).hostname
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    ingest_url: str | None = None  # where the events go, when not to url (ClientConfig)
    data: str = ""
    out: str = "runs/load"
    batch_size: int = 100
    concurrency: int = 4
    event_rate: float = 0.0  # events/s cap, 0 = as fast as the service answers
    max_events: int = 50_000
    duration: float = 60.0
    score_rate: float = 20.0  # score requests/s in total, 0 = no scoring
    score_mode: str = "mixed"  # get | post | mixed
    score_batch: int = 16  # pairs per POST /v1/score
    score_concurrency: int = 2
    recent_window: int = 1024  # acknowledged events kept to draw score pairs from
    features: str = "auto"
    start_row: int = 0
    loop: bool = False
    ordering: str = "gated"  # gated | free
    event_ids: bool = True
    wait: bool = True  # False: POST /v1/events?wait=false (answered once logged, applied behind)
    retries: int = 2  # per request, on 502/503/504 and transport errors (service.client)
    timeout: float = 30.0
    api_key: str | None = None
    allow_remote: bool = False
    wait_ready: float = 0.0  # seconds to wait for /readyz before starting, 0 = don't
    max_errors: int = 100  # stop early after this many failed requests (0 = never)
    seed: int = 0
    plots: bool = True
    progress: float = 0.0  # seconds between progress lines on stderr, 0 = quiet
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def validate(self) -> None:
        for flag, url in (("--url", self.url), ("--ingest-url", self.ingest_url)):
            if url is None:
                continue
            if not self.allow_remote and not is_loopback_url(url):
                raise ValueError(
                    f"refusing non-loopback target {url!r}: pass --allow-remote to load a remote host"
                )
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"{flag} must be http(s)://..., got {url!r}")
        if self.batch_size < 1 or self.concurrency < 1:
            raise ValueError("--batch-size and --concurrency must be >= 1")
        if self.max_events < 0 or self.duration <= 0:
            raise ValueError("--max-events must be >= 0 and --duration > 0")
        if self.score_mode not in ("get", "post", "mixed"):
            raise ValueError("--score-mode must be get, post or mixed")
        if self.ordering not in ("gated", "free"):
            raise ValueError("--ordering must be gated or free")
        if self.score_rate < 0 or self.event_rate < 0:
            raise ValueError("rates must be >= 0")
        if self.score_rate > 0 and (self.score_concurrency < 1 or self.score_batch < 1):
            raise ValueError("--score-concurrency and --score-batch must be >= 1")

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["api_key"] = "***" if self.api_key else None
        return d


# --------------------------------------------------------------------------- the run


@dataclass
class _Batch:
    index: int
    rows: range
    shift: float  # time added to every event (loop passes)
    pass_no: int
    nodes: frozenset[str]
    events: list[dict[str, Any]]
    t: np.ndarray  # shifted times of the rows


def _iter_batches(table: EventTable, cfg: LoadConfig) -> Iterator[tuple[range, float, int]]:
    """Consecutive row ranges in stream order, cut at ``max_events`` in total."""
    n = len(table)
    if n == 0:
        return
    span = float(table.t[-1] - table.t[0])
    period = span + max(1.0, span * 1e-3)  # the next pass starts strictly after this one
    sent = 0
    pass_no = 0
    while True:
        for lo in range(0, n, cfg.batch_size):
            left = cfg.max_events - sent
            if left <= 0:
                return
            hi = min(n, lo + cfg.batch_size, lo + left)
            sent += hi - lo
            yield range(lo, hi), pass_no * period, pass_no
        if not cfg.loop:
            return
        pass_no += 1


def _make_batch(
    table: EventTable, cfg: LoadConfig, index: int, rows: range, shift: float, pass_no: int
) -> _Batch:
    t = table.t[rows.start : rows.stop] + shift
    events: list[dict[str, Any]] = []
    feats = table.features
    for k, i in enumerate(rows):
        ev: dict[str, Any] = {"src": table.src[i], "dst": table.dst[i], "t": float(t[k])}
        if feats is not None:
            ev["features"] = feats[i]
        if cfg.event_ids:
            ev["event_id"] = f"{cfg.run_id}-{pass_no}-{table.first_row + i}"
        events.append(ev)
    nodes = frozenset(table.src[rows.start : rows.stop]) | frozenset(
        table.dst[rows.start : rows.stop]
    )
    return _Batch(index, rows, shift, pass_no, nodes, events, t)


class _Run:
    def __init__(
        self,
        cfg: LoadConfig,
        table: EventTable,
        rec: Recorder,
        stop: asyncio.Event,
    ) -> None:
        self.cfg = cfg
        self.table = table
        self.client: AsyncDygserveClient | None = None  # set by run_load, hooked to observe()
        self.rec = rec
        self.stop = stop  # no new batches / queries
        self.rng = random.Random(cfg.seed)
        self.recent: deque[tuple[str, str]] = deque(maxlen=max(1, cfg.recent_window))
        self.current_t: float | None = None
        self.inflight: set[str] = set()
        self.cond = asyncio.Condition()
        self.queue: asyncio.Queue[_Batch | None] = asyncio.Queue(maxsize=cfg.concurrency)
        self.stop_reason = "data_exhausted"
        self.failed_requests = 0

    # ---- helpers
    def _free_or_stopped(self, nodes: frozenset[str]) -> bool:
        """A gated batch may go: none of its nodes is in flight (or the run stops)."""
        return self.stop.is_set() or self.inflight.isdisjoint(nodes)

    def _note_failure(self) -> None:
        self.failed_requests += 1
        if (
            self.cfg.max_errors
            and self.failed_requests >= self.cfg.max_errors
            and not self.stop.is_set()
        ):
            self.stop_reason = "too_many_errors"
            self.stop.set()

    @property
    def http(self) -> AsyncDygserveClient:
        assert self.client is not None, "run_load sets the client"
        return self.client

    def observe(self, attempt: Attempt) -> None:
        """The client's hook: every HTTP attempt, retries included, is recorded."""
        route = ROUTES.get((attempt.method, attempt.path))
        if route is None:  # /readyz while waiting for the service
            return
        if attempt.status is None:
            status, latency = f"transport:{attempt.error}", -1.0
        else:
            status, latency = str(attempt.status), attempt.latency_s
        self.rec.request(route, status, latency)
        if attempt.retry_in_s is not None:
            self.rec.retries += 1
        if status != "200":
            self.rec.error_sample(status, attempt.detail or "")
            self._note_failure()

    def _invalid_body(self, exc: InvalidResponse) -> None:
        # Recorded as a 200 by observe(); the body is what failed.
        self.rec.error_sample("invalid_body", str(exc))
        self._note_failure()

    async def _sleep_or_stop(self, delay: float, ev: asyncio.Event) -> bool:
        """Sleep ``delay`` seconds; True when ``ev`` was set meanwhile."""
        if delay <= 0:
            return ev.is_set()
        try:
            await asyncio.wait_for(ev.wait(), timeout=delay)
            return True
        except TimeoutError:
            return False

    # ---- ingestion
    async def producer(self) -> None:
        cfg = self.cfg
        t_start = time.perf_counter()
        dispatched = 0
        try:
            for index, (rows, shift, pass_no) in enumerate(_iter_batches(self.table, cfg)):
                if self.stop.is_set():
                    break
                if cfg.event_rate > 0:
                    due = t_start + dispatched / cfg.event_rate
                    if await self._sleep_or_stop(due - time.perf_counter(), self.stop):
                        break
                batch = _make_batch(self.table, cfg, index, rows, shift, pass_no)
                if cfg.ordering == "gated":
                    async with self.cond:
                        await self.cond.wait_for(
                            functools.partial(self._free_or_stopped, batch.nodes)
                        )
                    if self.stop.is_set():
                        break
                    self.inflight |= batch.nodes
                await self.queue.put(batch)
                dispatched += len(rows)
            else:
                self.stop_reason = (
                    "max_events" if dispatched >= cfg.max_events else "data_exhausted"
                )
        finally:
            for _ in range(cfg.concurrency):
                await self.queue.put(None)

    async def _release(self, batch: _Batch) -> None:
        if self.cfg.ordering == "gated":
            self.inflight -= batch.nodes
            async with self.cond:
                self.cond.notify_all()

    async def ingest_worker(self) -> None:
        while True:
            batch = await self.queue.get()
            if batch is None:
                return
            try:
                if self.stop.is_set():
                    continue  # handed out but never sent: not counted
                await self._send_batch(batch)
            finally:
                await self._release(batch)

    async def _send_batch(self, batch: _Batch) -> None:
        n = len(batch.rows)
        self.rec.events_sent += n
        self.rec.event_batches += 1
        try:
            result = await self.http.ingest(batch.events, wait=self.cfg.wait)
        except InvalidResponse as exc:
            self._invalid_body(exc)
            self.rec.events_batch_failed(n)
            return
        except DygserveError:  # each failed attempt was recorded by observe()
            self.rec.events_batch_failed(n)
            return
        bad = {r.index for r in result.rejected}
        self.rec.events_batch_done(
            n, result.accepted, result.duplicates, [r.reason for r in result.rejected]
        )
        lo = batch.rows.start
        for k in range(n):
            if k not in bad:
                self.recent.append((self.table.src[lo + k], self.table.dst[lo + k]))
        ok_t = [float(batch.t[k]) for k in range(n) if k not in bad]
        if ok_t:
            tmax = max(ok_t)
            if self.current_t is None or tmax > self.current_t:
                self.current_t = tmax

    # ---- scoring
    def _pair(self) -> tuple[str, str]:
        a = self.recent[self.rng.randrange(len(self.recent))]
        if self.rng.random() < 0.5:
            return a
        b = self.recent[self.rng.randrange(len(self.recent))]
        return a[0], b[1]

    def _pairs(self, n: int) -> list[tuple[str, str]]:
        return [self._pair() for _ in range(n)]

    async def score_worker(self, k: int, score_stop: asyncio.Event) -> None:
        cfg = self.cfg
        interval = cfg.score_concurrency / cfg.score_rate
        next_t = time.perf_counter() + interval * k / cfg.score_concurrency
        while not score_stop.is_set():
            now = time.perf_counter()
            if next_t - now < -1.0:  # fell behind by over a second: do not burst to catch up
                next_t = now
            if await self._sleep_or_stop(next_t - now, score_stop):
                return
            next_t += interval
            if not self.recent or self.current_t is None:
                continue
            t = self.current_t
            post = cfg.score_mode == "post" or (
                cfg.score_mode == "mixed" and self.rng.random() < 0.5
            )
            try:
                if post:
                    pairs = [{"src": s, "dst": d, "t": t} for s, d in self._pairs(cfg.score_batch)]
                    answer = await self.http.score_pairs(pairs)
                    self.rec.score_done(ROUTE_SCORE_POST, len(answer.scores))
                else:
                    s, d = self._pair()
                    await self.http.score(s, d, t)
                    self.rec.score_done(ROUTE_SCORE_GET, 1)
            except InvalidResponse as exc:
                self._invalid_body(exc)
            except DygserveError:  # recorded by observe()
                pass

    async def progress(self, every: float, done: asyncio.Event) -> None:
        while not await self._sleep_or_stop(every, done):
            r = self.rec
            el = max(r.now(), 1e-9)
            print(
                f"[{el:6.1f}s] events {r.events_answered} ({r.events_answered / el:.0f}/s), "
                f"rejected {r.events_rejected}, score pairs {r.score_pairs} "
                f"({r.score_pairs / el:.0f}/s), failed requests {self.failed_requests}",
                file=sys.stderr,
                flush=True,
            )


async def run_load(
    cfg: LoadConfig,
    table: EventTable | None = None,
    stop: asyncio.Event | None = None,
    on_recorder: Callable[[Recorder], None] | None = None,
) -> tuple[LoadReport, dict[str, list[float]]]:
    """Run one replay; returns the report and the raw latency samples (seconds) per route.

    ``stop`` ends the run early from outside (stop reason ``stopped``)."""
    cfg.validate()
    if table is None:
        table = read_events(
            cfg.data,
            cfg.features,
            limit=None if cfg.loop else cfg.max_events,
            start_row=cfg.start_row,
        )
    rec = Recorder()
    stop_ev = asyncio.Event()
    run = _Run(cfg, table, rec, stop_ev)
    async with AsyncDygserveClient(client_config(cfg), on_attempt=run.observe) as client:
        run.client = client
        if cfg.wait_ready > 0:
            await client.wait_ready(cfg.wait_ready)
            rec = run.rec = Recorder()  # the run's clock starts once the service is ready
        if on_recorder is not None:
            on_recorder(rec)
        score_stop = asyncio.Event()
        done = asyncio.Event()
        producer = asyncio.create_task(run.producer())
        workers = [asyncio.create_task(run.ingest_worker()) for _ in range(cfg.concurrency)]
        scorers = (
            [
                asyncio.create_task(run.score_worker(k, score_stop))
                for k in range(cfg.score_concurrency)
            ]
            if cfg.score_rate > 0
            else []
        )
        prog = asyncio.create_task(run.progress(cfg.progress, done)) if cfg.progress > 0 else None
        ingest = asyncio.gather(producer, *workers)
        waiters: set[asyncio.Future[Any]] = {ingest, asyncio.ensure_future(stop_ev.wait())}
        if stop is not None:
            waiters.add(asyncio.ensure_future(stop.wait()))
        timer = asyncio.ensure_future(asyncio.sleep(cfg.duration))
        waiters.add(timer)
        finished, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if ingest not in finished:
            if timer in finished:
                run.stop_reason = "duration"
            elif stop is not None and stop.is_set():
                run.stop_reason = "stopped"
            stop_ev.set()
            async with run.cond:
                run.cond.notify_all()
        for f in pending:
            if f is not ingest:
                f.cancel()
        await ingest  # in-flight batches finish (bounded by --timeout and retries)
        score_stop.set()
        await asyncio.gather(*scorers)
        elapsed = rec.now()
        done.set()
        if prog is not None:
            await prog
    report = rec.build(
        url=cfg.url,
        dataset=table.name,
        stop_reason=run.stop_reason,
        config=cfg.public(),
        score_target_rate=cfg.score_rate,
        elapsed=elapsed,
    )
    return report, {r: list(v) for r, v in rec.latencies.items()}


def client_config(cfg: LoadConfig) -> ClientConfig:
    """The client the generator drives the service with. Its events are well-formed by
    construction and carry the generator's own ids (or none, with ``--no-event-ids``:
    then a batch that fails after it may have been delivered is not resent), so the
    client neither validates nor assigns: client CPU is taken from the service on a
    shared machine. Retries: ``--retries`` per request, never earlier than Retry-After."""
    n_conn = cfg.concurrency + (cfg.score_concurrency if cfg.score_rate > 0 else 0) + 1
    return ClientConfig(
        url=cfg.url,
        ingest_url=cfg.ingest_url,
        api_key=cfg.api_key,
        timeout_s=cfg.timeout,
        connect_timeout_s=cfg.timeout,
        retry=RetryPolicy(
            max_attempts=cfg.retries + 1,
            base_delay_s=0.05,
            max_delay_s=1.0,
            budget_s=max(60.0, cfg.timeout * (cfg.retries + 1)),
        ),
        validate_requests=False,
        assign_event_ids=False,
        max_connections=n_conn,
        trust_env=False,
    )


def write_outputs(
    report: LoadReport,
    latencies: dict[str, list[float]],
    out: str | Path,
    plots: bool = True,
    prefix: str = "",
) -> LoadReport:
    """Write ``report.json`` and, with ``plots``, ``latency_hist.png`` and ``throughput.png``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        from loadtests.plots import plot_latency_histogram, plot_throughput

        title = f"{report.dataset}: {report.elapsed_s:.0f}s"
        report.files["latency_hist"] = str(
            plot_latency_histogram(
                latencies, out / f"{prefix}latency_hist.png", f"Latency ({title})"
            )
        )
        report.files["throughput"] = str(
            plot_throughput(
                report.timeline, out / f"{prefix}throughput.png", f"Throughput ({title})"
            )
        )
    report.files["report"] = str(out / f"{prefix}report.json")
    report.write_json(out / f"{prefix}report.json")
    return report


# --------------------------------------------------------------------------- CLI


def add_load_arguments(p: argparse.ArgumentParser, defaults: LoadConfig | None = None) -> None:
    d = defaults or LoadConfig()
    p.add_argument(
        "--url", default=d.url, help="service base URL (loopback only unless --allow-remote)"
    )
    p.add_argument(
        "--ingest-url",
        default=d.ingest_url,
        help="send the events to this service instead (replicas that take the writes; the "
        "scores still go to --url)",
    )
    p.add_argument(
        "--data",
        required=True,
        help="dataset CSV (edges.csv.gz), its folder, or a name under $DYGSERVE_DATA",
    )
    p.add_argument("--out", default=d.out, help="output folder for the report and plots")
    p.add_argument(
        "--batch-size", type=int, default=d.batch_size, help="events per POST /v1/events"
    )
    p.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="concurrent ingest clients"
    )
    p.add_argument(
        "--event-rate",
        type=float,
        default=d.event_rate,
        help="cap on events/s handed out (0 = as fast as the service answers)",
    )
    p.add_argument("--max-events", type=int, default=d.max_events, help="hard bound on events sent")
    p.add_argument("--duration", type=float, default=d.duration, help="hard bound on run time (s)")
    p.add_argument(
        "--score-rate",
        type=float,
        default=d.score_rate,
        help="score requests/s in total (0 = no scoring)",
    )
    p.add_argument(
        "--score-mode",
        choices=("get", "post", "mixed"),
        default=d.score_mode,
        help="GET /v1/score (one pair), POST /v1/score (batches) or both at random",
    )
    p.add_argument(
        "--score-batch", type=int, default=d.score_batch, help="pairs per POST /v1/score"
    )
    p.add_argument(
        "--score-concurrency",
        type=int,
        default=d.score_concurrency,
        help="concurrent score clients",
    )
    p.add_argument(
        "--recent-window",
        type=int,
        default=d.recent_window,
        help="acknowledged events kept to draw score pairs from",
    )
    p.add_argument(
        "--features",
        default=d.features,
        help="edge feature columns: auto (all but src,dst,ts,label), none, or a comma list",
    )
    p.add_argument(
        "--start-row", type=int, default=d.start_row, help="skip this many data rows first"
    )
    p.add_argument(
        "--loop",
        action=argparse.BooleanOptionalAction,
        default=d.loop,
        help="replay the stream again, shifted past its end, until a bound is reached",
    )
    p.add_argument(
        "--ordering",
        choices=("gated", "free"),
        default=d.ordering,
        help="gated: never two in-flight batches sharing a node (per-node order kept)",
    )
    p.add_argument(
        "--event-ids",
        action=argparse.BooleanOptionalAction,
        default=d.event_ids,
        help="send event_id with each event (retries become duplicates, not repeats; without "
        "ids a batch that fails after it may have been delivered is not resent)",
    )
    p.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=d.wait,
        help="--no-wait: POST with wait=false (answered once logged; the service applies behind)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=d.retries,
        help="retries of a request on 502/503/504 or a transport error (after Retry-After)",
    )
    p.add_argument("--timeout", type=float, default=d.timeout, help="per-request timeout (s)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("DYGSERVE_API_KEY") or None,
        help="X-API-Key header (default: $DYGSERVE_API_KEY)",
    )
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback target host")
    p.add_argument(
        "--wait-ready",
        type=float,
        default=d.wait_ready,
        help="wait up to this many seconds for GET /readyz = 200 before starting",
    )
    p.add_argument(
        "--max-errors",
        type=int,
        default=d.max_errors,
        help="stop after this many failed requests (0 = never)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the score-pair sampler")
    p.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        default=d.plots,
        help="write the PNG plots",
    )
    p.add_argument(
        "--progress",
        type=float,
        default=5.0,
        help="seconds between progress lines on stderr (0 = quiet)",
    )


def config_from_args(a: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        url=a.url,
        ingest_url=a.ingest_url,
        data=a.data,
        out=a.out,
        batch_size=a.batch_size,
        concurrency=a.concurrency,
        event_rate=a.event_rate,
        max_events=a.max_events,
        duration=a.duration,
        score_rate=a.score_rate,
        score_mode=a.score_mode,
        score_batch=a.score_batch,
        score_concurrency=a.score_concurrency,
        recent_window=a.recent_window,
        features=a.features,
        start_row=a.start_row,
        loop=a.loop,
        ordering=a.ordering,
        event_ids=a.event_ids,
        wait=a.wait,
        retries=a.retries,
        timeout=a.timeout,
        api_key=a.api_key,
        allow_remote=a.allow_remote,
        wait_ready=a.wait_ready,
        max_errors=a.max_errors,
        seed=a.seed,
        plots=a.plots,
        progress=a.progress,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.replay_load",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Replay a real edge stream against a dygserve service; report speed and latency.",
    )
    add_load_arguments(p)
    a = p.parse_args(argv)
    cfg = config_from_args(a)
    try:
        cfg.validate()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        report, lat = asyncio.run(run_load(cfg))
    except (FileNotFoundError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_outputs(report, lat, cfg.out, plots=cfg.plots)
    print(report.summary())
    print(f"report: {report.files['report']}")
    return 1 if report.stop_reason == "too_many_errors" else 0


if __name__ == "__main__":
    raise SystemExit(main())
