"""``dygserve bench``: speed of the pipelines, written as a report.

* ``bench store --redis-url URL``: the state store alone (``state_store.bench``).
* ``bench pipeline [--redis-url URL]``: the service engine in process on a real
  Redis (started here on a free loopback port when no URL is given): ingest of a
  real stream in batches of 1,000 events, batch scoring of 1,000 pairs from cached
  states, and the recompute-from-last-L-events variant side by side.

Figures are measurements on the machine that runs them; tests never assert them.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from model.data import read_edge_stream
from model.node_state import NodeStates
from model.streaming import NodeEvent, pad_events

from .engine import Engine, ModelRuntime, _node_event
from .settings import DEFAULT_CHECKPOINT


def _start_redis() -> tuple[subprocess.Popen, str, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="dygserve-bench-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    for _ in range(100):
        try:
            if redis.Redis(port=port).ping():
                break
        except redis.RedisError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0", workdir


def _events(stream, lo: int, hi: int, dim: int) -> list[dict]:
    zeros = [0.0] * dim
    return [
        {"src": stream.src[i], "dst": stream.dst[i], "t": float(stream.t[i]),
         "features": stream.features[i].tolist() if stream.features.shape[1] == dim else zeros}
        for i in range(lo, hi)
    ]  # fmt: skip


def recompute_scores(engine: Engine, pairs: list[tuple[str, str, float]], window: int) -> torch.Tensor:
    """The paper's way: re-scan each endpoint's last ``window`` events from zero per query
    (history read, scan, read-out and head; assumes a checkpoint with SSM states)."""
    rt = engine.runtime
    nodes = [n for s, d, _ in pairs for n in (s, d)]
    histories = engine.store.read_histories(nodes, limit=window)
    per_node: list[list[NodeEvent]] = [[_node_event(n, e) for e in h] for n, h in zip(nodes, histories, strict=True)]
    ev, lengths = pad_events(per_node, rt.config.edge_feature_dim)
    with torch.no_grad():
        states, _ = rt.model.scan(NodeStates.initial(len(nodes), rt.config), ev, lengths)
        tau = torch.tensor([t for _, _, t in pairs for _ in (0, 1)], dtype=torch.float64)
        z = rt.model.node_readout(states.h, states.t_last, tau)
        # Pair features cost the same in both variants; zeros keep the head's shape.
        from model.pair_features import PAIR_FEATURE_DIM

        pair = torch.zeros(len(pairs), PAIR_FEATURE_DIM) if rt.config.use_pair_features else None
        return rt.model.head_logit(z[0::2], z[1::2], pair)


def bench_pipeline(checkpoint: Path, data: Path, redis_url: str | None, events: int, window: int) -> str:
    proc = workdir = None
    if redis_url is None:
        proc, redis_url, workdir = _start_redis()
    from state_store.factory import make_store

    try:
        runtime = ModelRuntime.load(checkpoint)
        store = make_store(redis_url)
        engine = Engine(runtime, store)
        dim = runtime.config.edge_feature_dim
        stream = read_edge_stream(data, limit=events)
        n = len(stream)
        engine.ingest(_events(stream, 0, 100, dim))  # warm-up
        start = time.perf_counter()
        for lo in range(100, n, 1000):
            engine.ingest(_events(stream, lo, min(n, lo + 1000), dim))
        ingest_s = time.perf_counter() - start
        ingest_rate = (n - 100) / ingest_s

        rng = np.random.default_rng(0)
        nodes = np.unique(np.concatenate([stream.src, stream.dst]))
        t = float(stream.t[-1]) + 1.0
        pairs = [(str(a), str(b), t) for a, b in zip(rng.choice(nodes, 1000), rng.choice(nodes, 1000), strict=True)]
        engine.score_pairs(pairs[:10])
        reps = 5
        start = time.perf_counter()
        for _ in range(reps):
            engine.score_pairs(pairs)
        cached_rate = reps * len(pairs) / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(reps):
            recompute_scores(engine, pairs, window)
        recompute_rate = reps * len(pairs) / (time.perf_counter() - start)
        store.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)
    return "\n".join(
        [
            f"Machine: {platform.node()} ({platform.machine()}, {torch.get_num_threads()} torch thread(s), "
            f"{__import__('os').cpu_count()} cores), Python {platform.python_version()}, torch {torch.__version__}",
            f"Command: dygserve bench pipeline --data {data} --events {events} --window {window}",
            "",
            "| figure | value |",
            "| --- | --- |",
            f"| ingest, batches of 1,000 events (log + apply, local Redis) | {ingest_rate:,.0f} events/s |",
            f"| batch scoring from cached states, 1,000 pairs per call | {cached_rate:,.0f} pairs/s |",
            f"| recompute variant: re-scan last L={window} events per endpoint per query | {recompute_rate:,.0f} pairs/s |",
            f"| cached / recompute | {cached_rate / recompute_rate:.1f}x |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dygserve bench")
    sub = p.add_subparsers(dest="what", required=True)
    store = sub.add_parser("store", add_help=False)
    store.add_argument("rest", nargs=argparse.REMAINDER)
    pipe = sub.add_parser("pipeline")
    pipe.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    pipe.add_argument("--data", type=Path, default=Path("../shared/data/uci/edges.csv.gz"))
    pipe.add_argument("--redis-url", default=None)
    pipe.add_argument("--events", type=int, default=20_000)
    pipe.add_argument("--window", type=int, default=64)
    args = p.parse_args(argv)
    if args.what == "store":
        from state_store.bench import main as store_main

        return int(store_main(args.rest) or 0)
    torch.set_num_threads(1)
    print(bench_pipeline(args.checkpoint, args.data, args.redis_url, args.events, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
