"""Open-loop latency of ``GET /v1/score`` at a fixed request rate, light on the client.

The async replay generator (``replay_load``, on the httpx-based ``service.client``)
spends about a millisecond of client CPU per request; on a 2-core machine that also runs
the service and Redis, that CPU is taken from the system under test and shows up in what
it measures. This generator therefore does NOT use ``service.client``: it sends from a
few threads over keep-alive ``http.client`` connections, and reads no answer body into a
model (it only needs the status), so the latency it reports is the service's.

Open loop: request k is due at ``start + k / rate`` whatever happened before, and its
latency is counted from that due time, so a server that stalls shows up as queueing in
the percentiles instead of as a lower request rate (no coordinated omission). Thread i
sends requests i, i + threads, ...; with ``threads`` well above rate x latency no
request waits for another's answer.

    python -m loadtests.open_loop --url http://127.0.0.1:8000 \\
        --data ../shared/data/uci/edges.csv.gz --rate 200 --duration 20
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import numpy as np

from .report import LatencyStats


@dataclass
class OpenLoopConfig:
    url: str = "http://127.0.0.1:8000"
    rate: float = 200.0  # requests per second, in total
    duration: float = 20.0  # seconds of sending
    threads: int = 8
    timeout: float = 10.0
    api_key: str | None = None


@dataclass
class OpenLoopReport:
    url: str
    target_rate: float
    achieved_rate: float  # answered requests / sending time
    requests: int
    errors: int  # non-200 answers and transport errors
    latency: LatencyStats  # from each request's due time (includes any queueing)
    service: LatencyStats  # from the moment it was actually sent
    late_starts: int  # requests sent more than 1 ms after their due time
    config: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def pairs_from_csv(
    path: str | Path, limit: int = 30_000, n: int = 1000, seed: int = 0
) -> list[tuple[str, str, float]]:
    """``n`` random (src, dst, t) among the nodes of the first ``limit`` rows, t = their last time."""
    from training.data import read_edge_stream

    stream = read_edge_stream(path, limit=limit)
    nodes = np.unique(np.concatenate([stream.src, stream.dst]))
    rng = np.random.default_rng(seed)
    t = float(stream.t[-1])
    return [
        (str(a), str(b), t) for a, b in zip(rng.choice(nodes, n), rng.choice(nodes, n), strict=True)
    ]


def run_open_loop(cfg: OpenLoopConfig, pairs: list[tuple[str, str, float]]) -> OpenLoopReport:
    if cfg.rate <= 0 or cfg.duration <= 0 or cfg.threads < 1 or not pairs:
        raise ValueError("rate, duration and threads must be positive and pairs non-empty")
    parts = urlsplit(cfg.url)
    total = int(cfg.rate * cfg.duration)
    due_lat = np.full(total, np.nan)
    svc_lat = np.full(total, np.nan)
    late = np.zeros(total, dtype=bool)
    errors = [0] * cfg.threads
    headers = {"X-API-Key": cfg.api_key} if cfg.api_key else {}
    start = time.perf_counter() + 0.1

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=cfg.timeout
        )
        for k in range(i, total, cfg.threads):
            due = start + k / cfg.rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            src, dst, t = pairs[k % len(pairs)]
            sent = time.perf_counter()
            late[k] = sent - due > 1e-3
            try:
                conn.request(
                    "GET",
                    "/v1/score?" + urlencode({"src": src, "dst": dst, "t": repr(t)}),
                    headers=headers,
                )
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(
                    parts.hostname or "127.0.0.1", parts.port, timeout=cfg.timeout
                )
                ok = False
            end = time.perf_counter()
            if ok:
                due_lat[k], svc_lat[k] = end - due, end - sent
            else:
                errors[i] += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(cfg.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    answered = due_lat[~np.isnan(due_lat)]
    return OpenLoopReport(
        url=cfg.url,
        target_rate=cfg.rate,
        achieved_rate=len(answered) / elapsed if elapsed > 0 else 0.0,
        requests=total,
        errors=sum(errors),
        latency=LatencyStats.from_seconds(answered),
        service=LatencyStats.from_seconds(svc_lat[~np.isnan(svc_lat)]),
        late_starts=int(late.sum()),
        config={k: v for k, v in asdict(cfg).items() if k != "api_key"},
    )


def open_loop_beside_ingest(
    cfg: OpenLoopConfig,
    pairs: list[tuple[str, str, float]],
    data: Path,
    event_rate: float,
    start_row: int,
    out: Path,
    ingest_url: str | None = None,
) -> OpenLoopReport:
    """``run_open_loop`` while ``event_rate`` events/s (0: none) are ingested beside it in
    batches of 100 by a ``replay_load`` subprocess from row ``start_row`` of ``data`` (its
    CPU, like the service's, counts against the machine, not against this client), sent
    to ``ingest_url`` (default: the service the reads go to)."""
    import subprocess
    import sys

    if not event_rate:
        return run_open_loop(cfg, pairs)
    beside = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtests.replay_load",
            "--url",
            ingest_url or cfg.url,
            "--data",
            str(data),
            "--start-row",
            str(start_row),
            "--batch-size",
            "100",
            "--event-rate",
            str(event_rate),
            "--score-rate",
            "0",
            "--duration",
            str(cfg.duration + 10),
            "--concurrency",
            "1",
            "--out",
            str(out),
            "--no-plots",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2)  # the ingest under way before the first timed request
        return run_open_loop(cfg, pairs)
    finally:
        beside.terminate()
        beside.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.open_loop", description=__doc__.split("\n\n")[0]
    )
    d = OpenLoopConfig()
    p.add_argument("--url", default=d.url)
    p.add_argument("--data", required=True, help="edge CSV whose nodes the pairs are drawn from")
    p.add_argument(
        "--rows", type=int, default=30_000, help="draw nodes from the first N rows (those ingested)"
    )
    p.add_argument("--rate", type=float, default=d.rate)
    p.add_argument("--duration", type=float, default=d.duration)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--api-key", default=None)
    p.add_argument("--out", type=Path, default=None, help="write report.json here")
    a = p.parse_args(argv)
    cfg = OpenLoopConfig(
        url=a.url, rate=a.rate, duration=a.duration, threads=a.threads, api_key=a.api_key
    )
    report = run_open_loop(cfg, pairs_from_csv(a.data, limit=a.rows))
    text = report.to_json()
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "report.json").write_text(text)
    print(text)
    return 0 if report.errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
