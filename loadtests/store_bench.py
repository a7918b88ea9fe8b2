"""Store benchmark: batch read, compare-and-set write and read-modify-write of N
default-size node states, next to the raw pipelined MGET/MSET of the same bytes and
(when it is on PATH) ``redis-benchmark``.

    python -m loadtests.store_bench --redis-url redis://127.0.0.1:6390 [--n-states 1000]
    python -m loadtests.store_bench                      # the embedded in-memory store

Keys are written under the prefix ``dygserve-bench`` and removed afterwards
(redis-benchmark leaves its own ``key:__rand_int__``, which is deleted too).
``run_store_bench`` returns a dict with the figures and a markdown snippet for
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import torch

from model.config import ModelConfig
from model.node_state import NodeStates, StateCodec
from state_store.blob_header import Watermark, read_watermark
from state_store.factory import make_store

BENCH_PREFIX = "dygserve-bench"
BENCH_VERSION = "be0c4be0c4be0c40"


def _redact(url: str | None) -> str:
    if not url:
        return "embedded (in-memory)"
    p = urlsplit(url)
    if p.password:
        return url.replace(f":{p.password}@", ":***@")
    return url


def _time(fn: Callable[[int], Any], rounds: int) -> float:
    """Median seconds of ``rounds`` calls (after one warm-up call)."""
    fn(-1)
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _figures(n: int, nbytes: int, seconds: float) -> dict[str, float]:
    return {
        "ms_per_batch": round(seconds * 1e3, 3),
        "states_per_s": round(n / seconds, 1),
        "mb_per_s": round(nbytes / seconds / 1e6, 2),
    }


def _with_watermark(blob: bytes, t: float, seq: int) -> bytes:
    b = bytearray(blob)
    struct.pack_into("<dq", b, 32, t, seq)
    return bytes(b)


def _drop_bench_log(store: Any) -> None:
    """Delete the bench's log keys (all in the one slot of ``{dygserve-bench:log}``)."""
    client = store.client
    pattern = f"{BENCH_PREFIX}:{{{BENCH_PREFIX}:log}}:*"
    if store.cluster:
        node = client.nodes_manager.get_node_from_slot(client.keyslot(f"{{{BENCH_PREFIX}:log}}"))
        r = client.get_redis_connection(node)
    else:
        r = client
    batch = []
    for k in r.scan_iter(match=pattern, count=1000):
        batch.append(k)
        if len(batch) >= 500:
            r.delete(*batch)
            batch = []
    if batch:
        r.delete(*batch)


def parse_redis_benchmark(text: str) -> dict[str, float]:
    """``SET: 123456.79 requests per second, p50=0.123 msec`` -> {"SET": 123456.79, ...}."""
    out = {}
    for line in text.replace("\r", "\n").splitlines():
        m = re.match(r"^\s*([A-Z]+):\s*([\d.]+)\s+requests per second", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def _redis_benchmark(url: str, blob_size: int, n: int = 20000) -> dict[str, Any] | None:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    p = urlsplit(url)
    cluster = p.scheme.endswith("+cluster")
    host_port = p.netloc.rsplit("@", 1)[-1].split(",")[0]
    host, _, port = host_port.rpartition(":")
    cmd = [
        exe,
        "-h",
        host or "127.0.0.1",
        "-p",
        port or "6379",
        "-P",
        "16",
        "-t",
        "set,get",
        "-d",
        str(blob_size),
        "-n",
        str(n),
        "-q",
    ]
    if p.password:
        cmd += ["-a", p.password]
    if cluster:
        cmd.append("--cluster")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"command": " ".join(cmd), "error": str(e)}
    rps = parse_redis_benchmark(proc.stdout)
    res: dict[str, Any] = {
        "command": " ".join(c if c != p.password else "***" for c in cmd),
        "requests_per_s": rps,
    }
    res["mb_per_s"] = {k: round(v * blob_size / 1e6, 2) for k, v in rps.items()}
    return res


def run_store_bench(
    url: str | None,
    n_states: int = 1000,
    rounds: int = 10,
    config: ModelConfig | None = None,
    redis_benchmark: bool = True,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    cfg = config or ModelConfig()
    codec = StateCodec(cfg, BENCH_VERSION)
    torch.manual_seed(0)
    states = NodeStates.initial(n_states, cfg)
    states.h.normal_()
    states.conv.normal_()
    states.t_last.zero_()
    states.last_seq.zero_()
    states.n_events.fill_(1)
    base = codec.encode_many(states)
    size = codec.blob_size
    nbytes = size * n_states
    nodes = [f"bench-{i}" for i in range(n_states)]
    store = make_store(url, key_prefix=BENCH_PREFIX)
    results: dict[str, dict[str, float]] = {}
    try:
        store.delete_states(BENCH_VERSION, nodes)
        w = store.write_states(
            BENCH_VERSION, dict(zip(nodes, base, strict=True)), dict.fromkeys(nodes)
        )
        assert len(w.written) == n_states, "bench keys were not empty"

        def read(_r: int) -> None:
            got = store.read_states(BENCH_VERSION, nodes)
            assert got[0] is not None

        results["batch read (read_states: MGET)"] = _figures(n_states, nbytes, _time(read, rounds))

        # CAS write: round r moves every watermark from (k, k) to (k+1, k+1).
        seq = [0]
        pre: dict[int, dict[str, bytes]] = {}

        def cas(_r: int) -> None:
            k = seq[0]
            blobs = pre.pop(k)
            out = store.write_states(BENCH_VERSION, blobs, dict.fromkeys(nodes, (float(k), k)))
            assert not out.conflicts, "CAS conflict in bench"
            seq[0] = k + 1

        for k in range(rounds + 1):
            pre[k] = {
                n: _with_watermark(b, float(k + 1), k + 1) for n, b in zip(nodes, base, strict=True)
            }
        results["CAS write (write_states)"] = _figures(n_states, nbytes, _time(cas, rounds))

        def rmw(_r: int) -> None:
            blobs = store.read_states(BENCH_VERSION, nodes)
            st = codec.decode_many(blobs)  # type: ignore[arg-type]
            st.h.mul_(0.999)
            st.t_last.add_(1.0)
            st.last_seq.add_(1)
            st.n_events.add_(1)
            expected: dict[str, Watermark | None] = {
                n: None if b is None else read_watermark(b)
                for n, b in zip(nodes, blobs, strict=True)
            }
            out = store.write_states(
                BENCH_VERSION, dict(zip(nodes, codec.encode_many(st), strict=True)), expected
            )
            assert not out.conflicts

        results["read-modify-write (read, decode, encode, CAS)"] = _figures(
            n_states, 2 * nbytes, _time(rmw, rounds)
        )
        results["read-modify-write (read, decode, encode, CAS)"]["note"] = (
            "MB/s counts bytes read + written"  # type: ignore[assignment]
        )

        # appending: n_states events per batch (each touches two nodes' histories)
        from state_store.base import NewEvent

        clock = [0.0]

        def append(_r: int) -> None:
            t0 = clock[0]
            clock[0] += n_states
            evs = [
                NewEvent(nodes[i], nodes[(i * 7 + 1) % n_states], t0 + i) for i in range(n_states)
            ]
            res = store.append_events(evs)
            assert res.seqs[-1] is not None

        ap = _time(append, rounds)
        results["append_events (log, dedupe, histories)"] = {
            "ms_per_batch": round(ap * 1e3, 3),
            "events_per_s": round(n_states / ap, 1),
        }

        if url:
            client = store.client  # type: ignore[attr-defined]
            cluster = store.cluster  # type: ignore[attr-defined]
            raw_keys = [f"{BENCH_PREFIX}:raw:{{{n}}}".encode() for n in nodes]
            mapping = dict(zip(raw_keys, base, strict=True))

            def raw_set(_r: int) -> None:
                if cluster:
                    client.mset_nonatomic(mapping)
                else:
                    client.execute_command("MSET", *[x for kv in mapping.items() for x in kv])

            def raw_get(_r: int) -> None:
                got = (
                    client.mget_nonatomic(raw_keys)
                    if cluster
                    else client.execute_command("MGET", *raw_keys)
                )
                assert got[0] is not None

            results["raw MSET of the same bytes"] = _figures(
                n_states, nbytes, _time(raw_set, rounds)
            )
            results["raw MGET of the same bytes"] = _figures(
                n_states, nbytes, _time(raw_get, rounds)
            )
            for i in range(0, len(raw_keys), 500):
                client.delete(*raw_keys[i : i + 500]) if cluster else client.execute_command(
                    "DEL", *raw_keys[i : i + 500]
                )
    finally:
        try:
            store.delete_states(BENCH_VERSION, nodes)
            if url:
                _drop_bench_log(store)
        finally:
            store.close()

    rb = _redis_benchmark(url, size) if (url and redis_benchmark) else None
    if rb is not None and url:
        try:
            cleanup = make_store(url, key_prefix=BENCH_PREFIX)
            cleanup.client.delete(b"key:__rand_int__")  # type: ignore[attr-defined]
            cleanup.close()
        except Exception:  # pragma: no cover - best effort
            pass

    report: dict[str, Any] = {
        "store": _redact(url),
        "backend": "memory" if not url else ("redis-cluster" if "+cluster" in url else "redis"),
        "n_states": n_states,
        "rounds": rounds,
        "blob_bytes": size,
        "model": {
            "d_model": cfg.d_model,
            "d_state": cfg.d_state,
            "n_layers": cfg.n_layers,
            "d_conv": cfg.d_conv,
        },
        "results": results,
        "redis_benchmark": rb,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    report["markdown"] = to_markdown(report)
    return report


def to_markdown(r: dict[str, Any]) -> str:
    lines = [
        f"### State store: {r['backend']} ({r['store']})",
        "",
        f"{r['n_states']} states of {r['blob_bytes']} bytes (default ModelConfig: d_model={r['model']['d_model']}, "
        f"d_state={r['model']['d_state']}, n_layers={r['model']['n_layers']}), median of {r['rounds']} batches, "
        f"{r['cpus']} CPU(s), one client thread.",
        "",
        "| operation | ms / batch | states/s | MB/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, f in r["results"].items():
        if "states_per_s" in f:
            rate, mb = f"{f['states_per_s']:,.0f}", f"{f['mb_per_s']:.1f}"
        else:
            rate, mb = f"{f['events_per_s']:,.0f} events/s", ""
        lines.append(f"| {name} | {f['ms_per_batch']:.2f} | {rate} | {mb} |")
    rb = r.get("redis_benchmark")
    if rb and rb.get("requests_per_s"):
        lines += ["", f"`{rb['command']}`:", ""]
        lines.append("| command | requests/s | MB/s |")
        lines.append("| --- | ---: | ---: |")
        for k, v in rb["requests_per_s"].items():
            lines.append(f"| {k} | {v:,.0f} | {rb['mb_per_s'][k]:.1f} |")
    elif rb and rb.get("error"):
        lines += ["", f"redis-benchmark failed: {rb['error']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtests.store_bench", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--redis-url",
        default=os.environ.get("DYGSERVE_REDIS_URL") or None,
        help="redis:// or redis+cluster:// URL (default: $DYGSERVE_REDIS_URL, else the in-memory store)",
    )
    ap.add_argument("--n-states", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-redis-benchmark", action="store_true")
    ap.add_argument("--json", dest="json_out", help="write the figures as JSON here")
    ap.add_argument("--markdown", dest="md_out", help="write the markdown snippet here")
    args = ap.parse_args(argv)
    report = run_store_bench(
        args.redis_url, args.n_states, args.rounds, redis_benchmark=not args.no_redis_benchmark
    )
    print(report["markdown"])
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({k: v for k, v in report.items() if k != "markdown"}, fh, indent=2)
    if args.md_out:
        with open(args.md_out, "w") as fh:
            fh.write(report["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
