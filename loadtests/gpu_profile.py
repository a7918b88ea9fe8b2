"""``python -m loadtests.gpu_profile``: where a GPU's time goes, for docs/GPU.md.

``dygserve bench gpu`` measures the cold rebuild end to end; at 100,000 x 1,024 its
kernels took 1.35 s where the scan's own memory floor is 0.03 s. This profiles that
gap and the ingest step on a GPU machine:

* **Cold rebuild by kernel**: ``torch.profiler`` over one rebuild of N x L synthetic
  events on mamba-ssm's path, the CUDA time of each operator (top rows), and the
  scan's share of it; then the same rebuild at several chunk sizes (padded events per
  ``selective_scan_fn`` call).
* **Ingest on CUDA against the CPU**: UCI in batches of 1,000 events through the
  engine on the embedded store (what ``POST /v1/events`` runs, minus HTTP), ms per batch
  and the part inside the state advance, on ``cpu`` and on ``cuda``; and the profiler's
  top operators by host time for one CUDA batch (a launch-bound step shows up there).

Writes ``profile.md`` under ``--out``. Figures are measurements on the machine that runs
them; no test asserts them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from loadtests.gpu_bench import floor_model, synthetic_events, time_cold_rebuild
from model.checkpoint import BUNDLED_CHECKPOINT, LoadedCheckpoint, load_checkpoint
from model.kernels.ops import load_mamba_ops
from service.engine import Engine, ModelRuntime
from state_store.factory import make_store
from training.data import read_edge_stream

SCAN_KERNEL = "selective_scan"


def _table(prof: Any, sort_by: str, rows: int) -> str:
    return str(prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60))


def cold_rebuild_profile(
    model: Any, n: int, length: int, chunks: tuple[int, ...], log: Any
) -> list[str]:
    cuda = torch.device("cuda")
    gpu_model = model.to(cuda)
    gaps = np.array([0.0, 1.0, 10.0, 60.0, 3600.0, 86400.0])
    ev = synthetic_events(n, length, model.config.edge_feature_dim, gaps).to(cuda)
    time_cold_rebuild(gpu_model, ev, "mamba-ssm", cuda, 1 << 20)  # warm-up
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        time_cold_rebuild(gpu_model, ev, "mamba-ssm", cuda, 1 << 20)
    # Kernel rows only: an operator's row repeats its kernels' device time.
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels)
    scan = sum(e.self_device_time_total for e in kernels if SCAN_KERNEL in e.key.lower())
    out = [
        f"## Cold rebuild of {n:,} x {length:,} events on mamba-ssm's path (chunks of 2^20)",
        "",
        f"CUDA time {total / 1e6:.3f} s, of which the selective scan {scan / 1e6:.3f} s "
        f"({100 * scan / max(total, 1):.1f}%).",
        "",
        "```",
        _table(prof, "self_device_time_total", 30),
        "```",
        "",
        "| padded events per call | seconds |",
        "| --- | --- |",
    ]
    for chunk in chunks:
        try:
            secs = min(time_cold_rebuild(gpu_model, ev, "mamba-ssm", cuda, chunk) for _ in range(2))
            out.append(f"| 2^{chunk.bit_length() - 1} | {secs:.3f} |")
        except torch.OutOfMemoryError:
            out.append(f"| 2^{chunk.bit_length() - 1} | out of memory |")
            torch.cuda.empty_cache()
        log(out[-1])
    return out


def _ingest_timings(
    checkpoint: LoadedCheckpoint, device: str, bodies: list[list[dict[str, Any]]]
) -> tuple[list[float], list[float], Engine]:
    runtime = ModelRuntime(checkpoint, device=device)
    engine = Engine(runtime, make_store(None))
    inner = runtime.kernels.advance
    spent: list[float] = []

    def timed_advance(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = inner(*a, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        spent.append(time.perf_counter() - start)
        return out

    runtime.kernels.advance = timed_advance  # type: ignore[method-assign]
    per_batch, advance_per_batch = [], []
    for body in bodies:
        before = len(spent)
        start = time.perf_counter()
        engine.ingest(body)
        per_batch.append(time.perf_counter() - start)
        advance_per_batch.append(sum(spent[before:]))
    return per_batch, advance_per_batch, engine


def ingest_profile(checkpoint: LoadedCheckpoint, data: Path, n_events: int, log: Any) -> list[str]:
    s = read_edge_stream(data, limit=n_events)
    dim = checkpoint.config.edge_feature_dim
    events = [
        {"src": str(s.src[i]), "dst": str(s.dst[i]), "t": float(s.t[i]), "features": [0.0] * dim}
        for i in range(len(s.t))
    ]
    # The last batch is kept for the profile: the stream's next events, as in production.
    bodies = [events[i : i + 1000] for i in range(0, len(events) - 1000, 1000)]
    out = [
        f"## Ingest of {len(events):,} UCI events in batches of 1,000 (embedded store)",
        "",
        "Median over the batches after the first five (ms per batch: whole ingest / inside the",
        "state advance):",
        "",
        "| device | path | ingest ms | advance ms |",
        "| --- | --- | --- | --- |",
    ]
    engine = None
    for device in ("cpu", "cuda"):
        whole, adv, engine = _ingest_timings(checkpoint, device, bodies)
        out.append(
            f"| {device} | {engine.runtime.kernels.path} | {statistics.median(whole[5:]) * 1e3:.2f}"
            f" | {statistics.median(adv[5:]) * 1e3:.2f} |"
        )
        log(out[-1])
    assert engine is not None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.ingest(events[len(bodies) * 1000 : len(bodies) * 1000 + 1000])
    out += [
        "",
        "One CUDA batch, operators by host time:",
        "",
        "```",
        _table(prof, "self_cpu_time_total", 25),
        "```",
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.gpu_profile")
    p.add_argument("--checkpoint", type=Path, default=BUNDLED_CHECKPOINT)
    p.add_argument("--data", type=Path, default=Path("../shared/data/uci"))
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--length", type=int, default=1_024)
    p.add_argument("--ingest-events", type=int, default=30_000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    ops, why = load_mamba_ops()
    if not torch.cuda.is_available() or ops is None:
        raise SystemExit(f"needs CUDA and mamba-ssm's kernels: {why or 'no CUDA device'}")
    checkpoint = load_checkpoint(args.checkpoint)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [f"# GPU profile: {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    lines += ingest_profile(floor_checkpoint(checkpoint), args.data, args.ingest_events, print)
    lines.append("")
    lines += cold_rebuild_profile(
        floor_model(checkpoint), args.nodes, args.length, (1 << 18, 1 << 20, 1 << 22), print
    )
    (args.out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def floor_checkpoint(checkpoint: LoadedCheckpoint) -> LoadedCheckpoint:
    """The checkpoint with the step floor, so the CUDA engine takes the kernels."""
    model = floor_model(checkpoint)
    return LoadedCheckpoint(checkpoint.path, model.config, model, checkpoint.version, {})


if __name__ == "__main__":
    raise SystemExit(main())
