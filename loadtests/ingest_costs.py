"""``dygserve bench ingest-costs``: where the time of an ingest goes, and what each
partition costs Redis, for docs/BENCHMARKS.md and docs/STATE_STORE.md ("Estimating").

* **Stages**: batches of 1,000 UCI events with event ids through the engine in process
  on one Redis started here (what ``POST /v1/events`` runs, minus HTTP): the request's
  JSON parse and validation, then each store call and the model's advance, timed
  around the calls; and the Redis time of the scripts (``INFO commandstats``).
* **Partition costs**: Redis time of the append (partition scripts and finish; and its
  wall time, the client's side and the round trips included) and of the apply (MGET,
  compare-and-set, mark) per batch of 10, 100 and 1,000 events, at
  P = 1 and P = 16 on one server, with least-squares fits per script call, per entry
  and per blob.

Figures are measurements on the machine that runs them; tests never assert them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis
import torch

from service.engine import Engine, ModelRuntime
from service.gc_tuning import freeze_startup_objects
from service.malloc_tuning import keep_freed_memory
from service.schemas import EventsRequest
from service.settings import DEFAULT_CHECKPOINT
from state_store.applier import apply_logged, logged_events
from state_store.base import NewEvent
from state_store.factory import make_store
from training.data import read_edge_stream

# What the client sends; a script's inner commands are counted inside its own time.
TOP_COMMANDS = ("cmdstat_evalsha", "cmdstat_mget", "cmdstat_zrange")
LOOKUPS = "apply: where each event's other endpoint was before (log lookups)"


def _redis_usec(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats[k]["usec"]) for k in TOP_COMMANDS if k in stats)


def _bodies(data: Path, n: int, dim: int) -> list[bytes]:
    s = read_edge_stream(data, limit=n)
    zeros = [0.0] * dim
    return [
        orjson.dumps(
            {
                "events": [
                    {
                        "src": str(s.src[i]),
                        "dst": str(s.dst[i]),
                        "t": float(s.t[i]),
                        "features": zeros,
                        "event_id": f"cost-{i}",
                    }
                    for i in range(lo, min(lo + 1000, len(s)))
                ]
            }
        )
        for lo in range(0, len(s), 1000)
    ]


MODES = {
    "plain": "append, then read and advance",
    "overlapped": "advance while Redis runs the append",
}
SEND = "log: send the append (arguments, send)"
WAIT = "log: wait for the append's answer (and read it)"
REQUEST = "request: JSON parse, validation, dump"
REST = "the rest (events to and from the store's types, the applier's bookkeeping)"


def _timed(spent: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def _stage_run(
    rt: ModelRuntime, redis_url: str, bodies: list[bytes], overlap: bool, script_slice: int
) -> dict[str, float]:
    """One run of 20 batches (after one warm batch) in one mode: ms per 1,000 events."""
    r = redis.Redis.from_url(redis_url)
    r.flushall()
    store = make_store(redis_url, script_slice=script_slice)
    engine = Engine(rt, store, overlap_append=overlap)
    engine.ingest(EventsRequest.model_validate_json(bodies[0]).model_dump()["events"])
    spent: dict[str, float] = {}
    names = {
        "append_events": "log: append (arguments, script, answers)",
        "read_states": "apply: read states (MGET; overlapped: before the append)",
        "write_states": "apply: compare-and-set write",
        "mark_applied": "apply: mark applied",
        # (inside the advance; only models with transition counts call it)
        "neighbours_before": LOOKUPS,
    }
    for method, label in names.items():
        setattr(store, method, _timed(spent, label, getattr(store, method)))
    begin = store.begin_append

    def begin_timed(events: list[NewEvent]) -> Callable[[], Any]:
        answer = _timed(spent, SEND, begin)(events)
        return _timed(spent, WAIT, answer)

    store.begin_append = begin_timed  # type: ignore[method-assign]
    advance = "apply: advance (decode, rank-major torch step, encode)"
    rt.advance_blobs = _timed(spent, advance, ModelRuntime.advance_blobs.__get__(rt))  # type: ignore[method-assign]
    r.config_resetstat()
    start = time.perf_counter()
    for body in bodies[1:]:
        t0 = time.perf_counter()
        events = EventsRequest.model_validate_json(body).model_dump()["events"]
        spent[REQUEST] = spent.get(REQUEST, 0.0) + time.perf_counter() - t0
        engine.ingest(events)
    total = time.perf_counter() - start
    del rt.advance_blobs
    store.close()
    per = 1000.0 / (len(bodies) - 1)
    row = {k: v * per for k, v in spent.items()}
    if LOOKUPS in row:  # timed inside the advance: count it once
        row[advance] -= row[LOOKUPS]
    row[REST] = total * per - sum(row.values())
    row["total"] = total * per
    row["of which Redis time (EVALSHA + MGET, commandstats)"] = _redis_usec(r) * per / 1e6
    return row


def stage_rows(
    rt: ModelRuntime, redis_url: str, data: Path, reps: int = 3, script_slice: int = 0
) -> list[str]:
    """ms per 1,000 events in each mode (``MODES``), median of ``reps`` runs of 20
    batches, the modes alternating, on the single-slot log with the store's
    ``script_slice``. Everything runs on one thread, so the stages add up to the total;
    overlapped, the advance runs while Redis runs the append, and the wait for its
    answer is what the advance did not cover."""
    bodies = _bodies(data, 21_000, rt.config.edge_feature_dim)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for rep in range(reps):
        for mode in MODES:
            runs[mode].append(_stage_run(rt, redis_url, bodies, mode == "overlapped", script_slice))
        if rep == 0:
            freeze_startup_objects()  # as the service does once warm
    labels = list(dict.fromkeys(k for rows in runs.values() for row in rows for k in row))
    labels = [REQUEST] + [k for k in labels if k != REQUEST]

    def cell(mode: str, label: str) -> str:
        got = [row[label] for row in runs[mode] if label in row]
        return f"{statistics.median(got):.2f}" if got else "–"

    rows = [f"| {k} | {cell('plain', k)} | {cell('overlapped', k)} |" for k in labels]
    rates = [
        f"{1000.0 / statistics.median(x['total'] for x in runs[m]) * 1000:,.0f} events/s"
        for m in MODES
    ]
    rows.append(f"| in-process ingest rate, parse to applied | {rates[0]} | {rates[1]} |")
    return rows


def partition_rows(rt: ModelRuntime, redis_url: str, data: Path) -> list[str]:
    """Redis time per batch of the append and the apply, and the fits."""
    s = read_edge_stream(data, limit=12_000)
    r = redis.Redis.from_url(redis_url)
    rows = []
    for partitions in (1, 16):
        appends, applies = [], []
        for size in (10, 100, 1000):
            r.flushall()
            store = make_store(redis_url, partitions=partitions)
            rt.paired_with(store)  # (a model with transition counts asks this log)
            zeros = (0.0,) * rt.config.edge_feature_dim  # a featured stream's width (MOOC: 4)
            new = [
                NewEvent(str(s.src[i]), str(s.dst[i]), float(s.t[i]), zeros, f"p{size}-{i}")
                for i in range(len(s))
            ]
            for lo in range(0, 2000, 500):  # warm: states exist, as in a running deployment
                res = store.append_events(new[lo : lo + 500])
                logged = logged_events(new[lo : lo + 500], res)
                apply_logged(
                    store, rt.version, logged, rt.advance_blobs, previous_seq=res.previous_seq
                )
            mine_a, mine_w = [], []
            for k in range(min((len(new) - 2000) // size, 300 if size < 100 else 60)):
                batch = new[2000 + k * size : 2000 + (k + 1) * size]
                u0 = _redis_usec(r)
                calls0 = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
                t0 = time.perf_counter()
                res = store.append_events(batch)
                wall = time.perf_counter() - t0
                stats = r.info("commandstats")
                calls = int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) - calls0
                entries = sum(x is not None for x in res.seqs) + len(res.other_seqs)
                mine_a.append((calls, entries, _redis_usec(r) - u0, wall * 1e6))
                logged = logged_events(batch, res)
                u0 = _redis_usec(r)
                apply_logged(
                    store, rt.version, logged, rt.advance_blobs, previous_seq=res.previous_seq
                )
                blobs = len({e.src for e in logged} | {e.dst for e in logged})
                mine_w.append((1, blobs, _redis_usec(r) - u0))
            store.close()
            a, w = np.array(mine_a, float), np.array(mine_w, float)
            rows.append(
                f"| P = {partitions} | {size:,} | {a[:, 2].mean() / 1000:.2f} ms | "
                f"{a[:, 3].mean() / 1000:.2f} ms | {a[:, 0].mean():.0f} | {a[:, 1].mean():,.0f} | "
                f"{w[:, 2].mean() / 1000:.2f} ms | {w[:, 1].mean():,.0f} |"
            )
            appends += mine_a
            applies += mine_w
        a, w = np.array(appends, float), np.array(applies, float)
        fa, *_ = np.linalg.lstsq(a[:, :2], a[:, 2], rcond=None)  # Redis time, not the wall
        fw, *_ = np.linalg.lstsq(w[:, 1:2], w[:, 2], rcond=None)
        rows.append(
            f"| P = {partitions}, fit | | {fa[0]:.1f} µs per script call + {fa[1]:.2f} µs per "
            f"entry | | | | {fw[0]:.2f} µs per blob | |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    from loadtests.bench import _start_redis

    p = argparse.ArgumentParser(prog="dygserve bench ingest-costs")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--data", type=Path, default=Path("../shared/data/uci/edges.csv.gz"))
    p.add_argument(
        "--script-slice",
        type=int,
        default=0,
        help="the stage table's store option script_slice (0: whole batches)",
    )
    p.add_argument("--stages-only", action="store_true", help="skip the partition table")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as the service does at start
    rt = ModelRuntime.load(args.checkpoint)
    proc, url, _ = _start_redis()
    try:
        print(
            "| stage, ms per 1,000 events with ids | "
            + " | ".join(f"{m} ({what})" for m, what in MODES.items())
            + " |\n| --- | ---: | ---: |"
        )
        print("\n".join(stage_rows(rt, url, args.data, script_slice=args.script_slice)))
        if args.stages_only:
            return 0
        print()
        print(
            "| layout | events per batch | append per batch (Redis) | append per batch (wall, "
            "client included) | script calls | entries | apply per batch (Redis) | blobs |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        )
        print("\n".join(partition_rows(rt, url, args.data)))
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
