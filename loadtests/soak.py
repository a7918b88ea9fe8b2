"""A bounded soak: the replay load (looped over the dataset) for ``--duration`` seconds
(default 10 minutes) while sampling, every ``--interval`` seconds, the resident memory of
the service (its process and all its children, e.g. uvicorn workers) and Redis
``INFO memory`` ``used_memory``.

    python -m loadtests.soak --url http://127.0.0.1:8000 --data ../shared/data/uci/edges.csv.gz \\
        --redis-url redis://127.0.0.1:6379/0 --out runs/soak [--pid PID] [--duration 600]

The service process is ``--pid``, else the one in ``--pid-file``, else found (Linux) as
the process listening on the URL's loopback port. Writes ``soak.json`` (samples and a
summary: start, end, max and the growth slope over the second half of each series),
``memory.png``, and the load's own ``report.json``, ``latency_hist.png`` and
``throughput.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from loadtests.replay_load import (
    LoadConfig,
    add_load_arguments,
    config_from_args,
    is_loopback_url,
    run_load,
    write_outputs,
)
from loadtests.report import Recorder

PAGE_KB = 1024

# --------------------------------------------------------------------------- processes (Linux /proc)


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ..." -- comm may hold spaces and parentheses
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 2:
            out[int(d.name)] = int(rest[1])
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for p, pp in _ppid_map().items():
        children.setdefault(pp, []).append(p)
    seen, stack = [], [pid]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.append(p)
        stack.extend(children.get(p, []))
    return seen


def rss_bytes(pid: int) -> int | None:
    """Resident set size of one process (VmRSS), None when it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * PAGE_KB
    except (OSError, ValueError):
        return None
    return None  # a zombie or kernel thread has no VmRSS


def tree_rss_bytes(pid: int) -> tuple[int | None, int]:
    """Summed RSS of ``pid`` and its descendants, and how many processes were counted."""
    total, n = 0, 0
    for p in process_tree(pid):
        r = rss_bytes(p)
        if r is not None:
            total += r
            n += 1
    return (total if n else None), n


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def find_listening_pid(port: int) -> int | None:
    """The process that listens on ``port`` (the root one when workers share the socket)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    pids: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                try:
                    if os.readlink(fd) in targets:
                        pids.add(int(d.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    if not pids:
        return None
    ppid = _ppid_map()
    roots = [p for p in pids if ppid.get(p) not in pids]
    return min(roots or pids)


# --------------------------------------------------------------------------- sampling


@dataclass
class SoakConfig:
    load: LoadConfig
    interval: float = 5.0
    pid: int | None = None
    pid_file: str | None = None
    redis_url: str | None = None


@dataclass
class MemorySampler:
    pid: int | None
    redis_url: str | None
    samples: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    _redis: Any = None

    async def open(self) -> None:
        if self.redis_url:
            try:
                import redis.asyncio as aioredis

                self._redis = aioredis.from_url(self.redis_url, socket_timeout=5)
                await self._redis.ping()
            except Exception as e:  # noqa: BLE001 - keep soaking without Redis numbers
                self.errors["redis"] = f"{type(e).__name__}: {e}"
                self._redis = None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def sample(self, t: float, rec: Recorder | None) -> dict[str, Any]:
        s: dict[str, Any] = {"t": round(t, 3), "wall": time.time()}
        if self.pid is not None:
            s["service_rss_bytes"], s["service_processes"] = tree_rss_bytes(self.pid)
        else:
            s["service_rss_bytes"], s["service_processes"] = None, 0
        s["redis_used_memory_bytes"] = s["redis_used_memory_rss_bytes"] = s["redis_keys"] = None
        if self._redis is not None:
            try:
                info = await self._redis.info("memory")
                s["redis_used_memory_bytes"] = int(info["used_memory"])
                s["redis_used_memory_rss_bytes"] = int(info.get("used_memory_rss", 0)) or None
                s["redis_keys"] = int(await self._redis.dbsize())
            except Exception as e:  # noqa: BLE001
                self.errors["redis_sample"] = f"{type(e).__name__}: {e}"
        if rec is not None:
            s["events_answered"] = rec.events_answered
            s["events_accepted"] = rec.events_accepted
            s["score_pairs"] = rec.score_pairs
        self.samples.append(s)
        return s


def series_summary(ts: Iterable[float], values: Iterable[float | None]) -> dict[str, float | None]:
    """Start/end/max and growth of one series; ``slope_per_min`` is a least-squares fit over
    the second half of the samples (after warm-up), in bytes per minute."""
    pts = [(float(t), float(v)) for t, v in zip(ts, values, strict=False) if v is not None]
    if not pts:
        return {"start": None, "end": None, "max": None, "growth": None, "slope_per_min": None}
    t = np.array([p[0] for p in pts])
    v = np.array([p[1] for p in pts])
    half = v.size // 2
    slope = None
    if v.size - half >= 2 and np.ptp(t[half:]) > 0:
        slope = float(np.polyfit(t[half:], v[half:], 1)[0] * 60.0)
    return {
        "start": float(v[0]),
        "end": float(v[-1]),
        "max": float(v.max()),
        "growth": float(v[-1] - v[0]),
        "slope_per_min": slope,
    }


def resolve_pid(cfg: SoakConfig) -> tuple[int | None, str]:
    if cfg.pid is not None:
        return cfg.pid, "--pid"
    if cfg.pid_file:
        return int(Path(cfg.pid_file).read_text().strip()), "--pid-file"
    if is_loopback_url(cfg.load.url):
        u = urlsplit(cfg.load.url)
        port = u.port or (443 if u.scheme == "https" else 80)
        pid = find_listening_pid(port)
        if pid is not None:
            return pid, f"listening on port {port}"
    return None, "not found (no RSS samples; pass --pid)"


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    cfg.load.validate()
    pid, how = resolve_pid(cfg)
    if pid is None:
        print(f"warning: service process {how}", file=sys.stderr)
    sampler = MemorySampler(pid, cfg.redis_url)
    await sampler.open()
    holder: dict[str, Recorder] = {}
    t0 = time.perf_counter()
    await sampler.sample(0.0, None)
    load = asyncio.create_task(run_load(cfg.load, on_recorder=lambda r: holder.update(rec=r)))
    try:
        while not load.done():
            done, _ = await asyncio.wait({load}, timeout=cfg.interval)
            if not done:
                await sampler.sample(time.perf_counter() - t0, holder.get("rec"))
        report, latencies = load.result()
        await sampler.sample(time.perf_counter() - t0, holder.get("rec"))
    finally:
        await sampler.close()
    out = Path(cfg.load.out)
    write_outputs(report, latencies, out, plots=cfg.load.plots)
    ts = [s["t"] for s in sampler.samples]
    result: dict[str, Any] = {
        "url": cfg.load.url,
        "dataset": report.dataset,
        "duration_s": time.perf_counter() - t0,
        "interval_s": cfg.interval,
        "service_pid": pid,
        "service_pid_source": how,
        "redis_url": cfg.redis_url,
        "summary": {
            "service_rss_bytes": series_summary(
                ts, [s["service_rss_bytes"] for s in sampler.samples]
            ),
            "redis_used_memory_bytes": series_summary(
                ts, [s["redis_used_memory_bytes"] for s in sampler.samples]
            ),
        },
        "samples": sampler.samples,
        "sampler_errors": sampler.errors,
        "load": report.to_dict(),
        "files": dict(report.files),
    }
    if cfg.load.plots:
        from loadtests.plots import plot_memory

        result["files"]["memory"] = str(
            plot_memory(
                sampler.samples,
                out / "memory.png",
                f"Soak memory ({report.dataset}, {result['duration_s']:.0f}s)",
            )
        )
    result["files"]["soak"] = str(out / "soak.json")
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.soak",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Bounded soak: looped replay load while sampling service RSS and Redis memory.",
    )
    add_load_arguments(p, LoadConfig(duration=600.0, max_events=10**9, loop=True, out="runs/soak"))
    p.add_argument("--interval", type=float, default=5.0, help="seconds between memory samples")
    p.add_argument("--pid", type=int, default=None, help="service process id (children included)")
    p.add_argument("--pid-file", default=None, help="file holding the service process id")
    p.add_argument(
        "--redis-url",
        default=os.environ.get("DYGSERVE_REDIS_URL") or None,
        help="Redis to sample INFO memory from (default: $DYGSERVE_REDIS_URL)",
    )
    a = p.parse_args(argv)
    load = config_from_args(a)
    try:
        load.validate()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.interval <= 0:
        print("error: --interval must be > 0", file=sys.stderr)
        return 2
    cfg = SoakConfig(
        load=load, interval=a.interval, pid=a.pid, pid_file=a.pid_file, redis_url=a.redis_url
    )
    try:
        result = asyncio.run(run_soak(cfg))
    except (FileNotFoundError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = result["summary"]
    print(
        f"soak {result['duration_s']:.0f}s, {len(result['samples'])} samples; "
        f"service RSS {_mib(s['service_rss_bytes']['start'])} -> {_mib(s['service_rss_bytes']['end'])} "
        f"(max {_mib(s['service_rss_bytes']['max'])}); Redis used_memory "
        f"{_mib(s['redis_used_memory_bytes']['start'])} -> {_mib(s['redis_used_memory_bytes']['end'])}"
    )
    print(f"soak report: {result['files']['soak']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
