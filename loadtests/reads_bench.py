"""``dygserve bench reads``: reads beside writes. Single ``GET /v1/score`` in an open loop
at 200 requests/s, alone and beside 500 events/s of ingest, repeated and alternating, on
one service and one Redis started here; and where a slow answer's time went (inside the
handler, Redis commands over 1 ms). docs/BENCHMARKS.md, "Reads beside writes".

    dygserve bench reads [--reps 3] [--seconds 20] [--out runs/bench/reads]
                         [--ingest-replica] [--script-slice N]

Figures are measurements on the machine that runs them; tests never assert them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path
from typing import Any

import redis as redis_lib

from loadtests.bench import _start_redis, _start_service, ingest_prefix
from loadtests.open_loop import OpenLoopConfig, open_loop_beside_ingest, pairs_from_csv
from service.client import ClientConfig, DygserveClient
from service.settings import DEFAULT_CHECKPOINT

READS_REPS = 3


def bench_reads(
    checkpoint: Path,
    data: Path,
    out: Path,
    reps: int = READS_REPS,
    seconds: float = 20.0,
    warm_events: int = 10_000,
    extra_env: dict[str, str] | None = None,
    ingest_replica: bool = False,
) -> list[str]:
    """Reads beside writes: single GET /v1/score in an open loop at 200 requests/s, with
    no other traffic and with 500 events/s ingested beside it (batches of 100), ``reps``
    times each, alternating, on one service (1 worker) and one Redis started here. The
    first ``warm_events`` UCI events are ingested first, so the pairs read warm states;
    each repetition's ingest continues the stream where the last stopped. With
    ``ingest_replica`` the ingest goes to a second service process on the same Redis, as
    a deployment that keeps its writes off the replicas that serve reads would."""
    out.mkdir(parents=True, exist_ok=True)
    proc, redis_url, workdir = _start_redis()
    redis = redis_lib.Redis.from_url(redis_url)
    stats: dict[int, list[Any]] = {0: [], 500: []}
    # where a slow answer's time went: inside the handler (its own histogram), and how
    # often Redis ran a command for more than 1 ms (a GET's read queues behind it)
    inside: dict[int, list[float]] = {0: [], 500: []}
    slow_redis: dict[int, list[int]] = {0: [], 500: []}
    try:
        svc, url = _start_service(redis_url, checkpoint, str(out), extra_env=extra_env)
        ingest_svc = ingest_url = None
        try:
            if ingest_replica:  # a second service process on the same Redis takes the writes
                (out / "ingest").mkdir(exist_ok=True)
                ingest_svc, ingest_url = _start_service(
                    redis_url, checkpoint, str(out / "ingest"), extra_env=extra_env
                )
            ingest_prefix(ingest_url or url, data, warm_events)
            pairs = pairs_from_csv(data, limit=warm_events)
            row = warm_events
            for _ in range(reps):
                for rate in stats:
                    redis.config_set("slowlog-log-slower-than", 1000)  # µs
                    redis.slowlog_reset()
                    slow_before = _slow_get_scores(url)
                    report = open_loop_beside_ingest(
                        OpenLoopConfig(url=url, rate=200, duration=seconds, threads=8),
                        pairs,
                        data,
                        rate,
                        row,
                        out / "ingest_beside_get",
                        ingest_url,
                    )
                    row += int(rate * (seconds + 10))
                    stats[rate].append(report)
                    inside[rate].append(_slow_get_scores(url) - slow_before)
                    slow_redis[rate].append(len(redis.slowlog_get(1000)))
            # who logged the events: the split is real only if the reads' service logged none
            logged = [events_logged(u) for u in (url, ingest_url) if u is not None]
        finally:
            for process in (svc, ingest_svc):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=60)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for rate, label in ((0, "no other traffic"), (500, "with 500 events/s ingest beside it")):
        runs = stats[rate]
        p99s = [r.latency.p99_ms for r in runs]

        def med(key: str, runs: list[Any] = runs) -> float:
            return statistics.median(getattr(r.latency, key) for r in runs)

        rows.append(
            f"| single GET /v1/score, open loop at 200 req/s, {label}, median of {reps} runs of "
            f"{seconds:g} s ({sum(r.errors for r in runs)} errors) | p50 {med('p50_ms'):.2f} ms, "
            f"p95 {med('p95_ms'):.2f} ms, p99 {med('p99_ms'):.2f} ms (p99 runs {min(p99s):.2f} to "
            f"{max(p99s):.2f}), max {med('max_ms'):.1f} ms |"
        )
    for rate, label in ((0, "alone"), (500, "beside ingest")):
        total = sum(r.requests for r in stats[rate])
        rows.append(
            f"| GETs {label} whose handler itself took over 5 ms (awaited read and read-out; "
            f"all runs) | {sum(inside[rate]):.0f} of {total:,} "
            f"({100 * sum(inside[rate]) / max(total, 1):.1f}%) |"
        )
        rows.append(
            f"| Redis commands over 1 ms while GETs ran {label} (SLOWLOG, per run) | "
            f"{statistics.median(slow_redis[rate]):.0f} |"
        )
    rows.append(
        "| events logged by the service that answered the GETs"
        + (" / by the ingest replica" if ingest_replica else "")
        + f" (warm-up included) | {' / '.join(f'{n:,.0f}' for n in logged)} |"
    )
    return rows


def _metric_lines(url: str, api_key: str | None = None) -> list[str]:
    with DygserveClient(ClientConfig(url=url, api_key=api_key, trust_env=False)) as client:
        return client.metrics().splitlines()


def events_logged(url: str, api_key: str | None = None) -> float:
    """The service's ``dygserve_events_ingested_total`` (summed over its labels)."""
    return sum(
        float(line.split()[-1])
        for line in _metric_lines(url, api_key)
        if line.startswith("dygserve_events_ingested_total")
    )


def _slow_get_scores(url: str) -> float:
    """How many GET /v1/score calls so far took the handler more than 5 ms (the service's
    latency histogram: its count minus its 5 ms bucket)."""
    count = under = 0.0
    for line in _metric_lines(url):
        if 'route="get_score"' not in line:
            continue
        if line.startswith("dygserve_score_latency_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("dygserve_score_latency_seconds_bucket") and 'le="0.005"' in line:
            under = float(line.split()[-1])
    return count - under


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dygserve bench reads")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--data", type=Path, default=Path("../shared/data/uci/edges.csv.gz"))
    p.add_argument("--reps", type=int, default=READS_REPS)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=Path("runs/bench/reads"))
    p.add_argument(
        "--ingest-replica",
        action="store_true",
        help="send the ingest to a second service process on the same Redis (the reads' "
        "service then runs no apply)",
    )
    p.add_argument(
        "--script-slice",
        type=int,
        default=0,
        help="the services' DYGSERVE_STORE__SCRIPT_SLICE (0: whole batches per script call)",
    )
    args = p.parse_args(argv)
    rows = bench_reads(
        args.checkpoint,
        args.data,
        args.out,
        args.reps,
        args.seconds,
        extra_env={"DYGSERVE_STORE__SCRIPT_SLICE": str(args.script_slice)},
        ingest_replica=args.ingest_replica,
    )
    print("\n".join(["| figure | value |", "| --- | --- |", *rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
