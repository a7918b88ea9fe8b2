"""``dygserve bench gpu``: the GPU section of docs/BENCHMARKS.md, measured on the machine
that runs it (a GPU machine; on a CPU-only one the CUDA rows say why they are empty).

* Cold rebuild of N nodes x L events from the zero state, for torch's rank-major path on
  the CPU, torch's rank-major path on CUDA tensors and mamba-ssm's kernels
  (``model.kernels.cold_scan``): seconds, events/s, speed-up over the CPU, and the
  memory-bandwidth floor of the scan (see ``scan_floor_bytes``). Events are synthetic
  (random other endpoints, gaps drawn from a real stream), on the bundled checkpoint's
  shapes with new checkpoints' step floor. The CPU path on batches past
  ``--cpu-max-events`` is timed on a subset of the nodes and scaled by the node count
  (its cost is linear in the nodes at a fixed length), and the table says so.
* Backfill of a real log (MOOC by default) into the embedded store
  (``service.backfill.backfill_store``): events/s overall and the time inside the
  state advance (GPU time, synchronised), against the floor of reading every history
  event and writing every state once.
* Batch scoring on onnxruntime's CUDA execution provider (the read-out/head graph) and on
  torch's CUDA tensors: pairs/s, against the floor of reading both states of every pair.

The bandwidth used for the floors is measured here (a device-to-device copy), not taken
from a data sheet. ``--doc`` rewrites only the part of the document between the GPU
section's markers; ``bench all`` keeps that part as it is.

    dygserve bench gpu --doc docs/BENCHMARKS.md --data ../shared/data
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.checkpoint import BUNDLED_CHECKPOINT, LoadedCheckpoint, load_checkpoint
from model.events import EventInputs
from model.kernels.cold_scan import cold_scan_padded
from model.kernels.ops import load_mamba_ops
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.rank_plan import RankPlan

SECTION_START = "<!-- gpu-bench:start -->"
SECTION_END = "<!-- gpu-bench:end -->"
PATHS = ("torch-cpu", "torch-cuda", "mamba-ssm")


# ===================================================================== doc section
def extract_section(text: str) -> str | None:
    """The GPU section of a BENCHMARKS.md (markers included), or None."""
    lo, hi = text.find(SECTION_START), text.find(SECTION_END)
    if lo < 0 or hi < lo:
        return None
    return text[lo : hi + len(SECTION_END)]


def replace_section(text: str, section: str) -> str:
    """``text`` with its GPU section replaced by ``section`` (appended if it had none)."""
    old = extract_section(text)
    if old is None:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    return text.replace(old, section)


# ===================================================================== machine
def _gpu_name() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.0f} GiB"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s of a tensor copy on ``device`` (read + write counted), best of ``repeats``."""
    n = nbytes // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best


# ===================================================================== cold rebuild
def floor_model(checkpoint: LoadedCheckpoint, delta_min: float = 1e-4) -> DygMambaLinkModel:
    """The checkpoint's weights with a step floor (the kernels need delta_min > 0)."""
    cfg = checkpoint.config
    model = DygMambaLinkModel(cfg if cfg.delta_min > 0 else cfg.with_updates(delta_min=delta_min))
    model.load_state_dict(checkpoint.model.state_dict())
    return model.eval()


def synthetic_events(
    n: int, length: int, feature_dim: int, gaps: np.ndarray, seed: int = 0
) -> EventInputs:
    """(n, length) events: random other endpoints and roles, gaps drawn from ``gaps``."""
    rng = np.random.default_rng(seed)
    g = rng.choice(gaps, size=(n, length))
    t = 1e6 + np.cumsum(g, axis=1)
    return EventInputs(
        other_key=torch.from_numpy(rng.integers(0, 2**62, size=(n, length), dtype=np.int64)),
        role=torch.from_numpy(rng.integers(0, 2, size=(n, length), dtype=np.int64)),
        features=torch.zeros(n, length, feature_dim),
        t=torch.from_numpy(t),
        seq=torch.arange(length, dtype=torch.int64).repeat(n, 1),
    )


def _rows(ev: EventInputs, lo: int, hi: int) -> EventInputs:
    return EventInputs(*(x[lo:hi] for x in (ev.other_key, ev.role, ev.features, ev.t, ev.seq)))


def _rank_major(ev: EventInputs) -> EventInputs:
    """(n, L) events of equal-length nodes, packed rank-major (``RankPlan``'s layout)."""

    def pack(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()

    return EventInputs(*(pack(x) for x in (ev.other_key, ev.role, ev.features, ev.t, ev.seq)))


def time_cold_rebuild(
    model: DygMambaLinkModel,
    ev: EventInputs,
    path: str,
    device: torch.device,
    max_padded_events: int,
) -> float:
    """Seconds to rebuild the states of ev's n nodes (equal lengths) from zero on ``path``,
    in chunks of at most ``max_padded_events`` events, inputs already on ``device``."""
    n, length = ev.t.shape
    rows = max(1, max_padded_events // max(length, 1))
    ops = load_mamba_ops()[0] if path == "mamba-ssm" else None
    start = time.perf_counter()
    with torch.no_grad():
        for lo in range(0, n, rows):
            part = _rows(ev, lo, min(n, lo + rows))
            k = part.t.shape[0]
            if ops is not None:
                cold_scan_padded(model, ops, part, torch.full((k,), length, device=device))
            else:
                plan = RankPlan.build([length] * k)
                model.apply_ranked(
                    NodeStates.initial(k, model.config).to(device), _rank_major(part), plan
                )
    _sync(device)
    return time.perf_counter() - start


def scan_floor_bytes(model: DygMambaLinkModel, n: int, length: int) -> int:
    """What the selective scan must move at least once: per layer and event, reads of u and
    Delta (d_inner floats each), B and C (d_state each) and the write of y (d_inner); per
    node, the final state (n_layers x d_inner x d_state floats)."""
    c = model.config
    per_event = c.n_layers * 4 * (3 * c.d_inner + 2 * c.d_state)
    return n * length * per_event + n * c.n_layers * c.d_inner * c.d_state * 4


@dataclass
class ColdRow:
    nodes: int
    length: int
    seconds: dict[str, float | None]  # per path; None = not run here
    scaled: dict[str, bool]  # the CPU figure measured on a subset and scaled
    floor_s: float | None  # the scan's bandwidth floor on the GPU
    failed: dict[str, str] = field(default_factory=dict)  # per path: the error it raised


def bench_cold(
    model: DygMambaLinkModel,
    gaps: np.ndarray,
    nodes: tuple[int, ...],
    lengths: tuple[int, ...],
    cpu_max_events: int,
    max_padded_events: int,
    gpu_bandwidth: float | None,
    log: Callable[[str], None] = print,
) -> list[ColdRow]:
    has_cuda = torch.cuda.is_available()
    has_kernels = has_cuda and load_mamba_ops()[0] is not None
    cuda = torch.device("cuda")
    gpu_model = copy.deepcopy(model).to(cuda) if has_cuda else None
    out = []
    for length in lengths:
        for n in nodes:
            secs: dict[str, float | None] = dict.fromkeys(PATHS)
            scaled = dict.fromkeys(PATHS, False)
            failed: dict[str, str] = {}
            sub = max(1, min(n, cpu_max_events // length))
            ev_cpu = synthetic_events(sub, length, model.config.edge_feature_dim, gaps)
            time_cold_rebuild(model, _rows(ev_cpu, 0, 1), "torch-cpu", torch.device("cpu"), 1)
            secs["torch-cpu"] = (
                time_cold_rebuild(model, ev_cpu, "torch-cpu", torch.device("cpu"), 1 << 18)
                * n
                / sub
            )
            scaled["torch-cpu"] = sub < n
            if gpu_model is not None:
                ev = synthetic_events(n, length, model.config.edge_feature_dim, gaps)
                ev = ev.to(cuda)
                for path in ("torch-cuda", "mamba-ssm"):
                    if path == "mamba-ssm" and not has_kernels:
                        continue
                    # One path failing (out of memory, a kernel error) leaves the others'
                    # figures and says why in the table rather than losing the report.
                    try:
                        time_cold_rebuild(gpu_model, _rows(ev, 0, 2), path, cuda, max_padded_events)
                        secs[path] = time_cold_rebuild(gpu_model, ev, path, cuda, max_padded_events)
                    except Exception as exc:
                        failed[path] = f"{type(exc).__name__}: {exc}"[:200]
                        torch.cuda.empty_cache()
                del ev
            floor = scan_floor_bytes(model, n, length) / gpu_bandwidth if gpu_bandwidth else None
            row = ColdRow(n, length, secs, scaled, floor, failed)
            log(f"cold rebuild {n} x {length}: {secs} {failed or ''}")
            out.append(row)
    return out


# ===================================================================== backfill
@dataclass
class BackfillRow:
    dataset: str
    events: int
    seconds: float
    advance_seconds: float  # inside the state advance, synchronised
    path: str
    floor_s: float | None


def bench_backfill(
    checkpoint: LoadedCheckpoint,
    data: Path,
    dataset: str,
    device: str,
    limit: int | None,
    bandwidth: float | None,
) -> BackfillRow:
    """Log ``dataset`` into the embedded store (not applied), then backfill it."""
    from service.backfill import backfill_store
    from service.engine import ModelRuntime
    from state_store.base import NewEvent
    from state_store.factory import make_store
    from training.data import read_edge_stream

    model = floor_model(checkpoint)
    version = "9" * 16
    runtime = ModelRuntime(
        LoadedCheckpoint(checkpoint.path, model.config, model, version, {}), device=device
    )
    stream = read_edge_stream(data / dataset, limit=limit)
    dim = model.config.edge_feature_dim
    store = make_store(None, history_cap=10**7)
    for lo in range(0, len(stream), 10_000):
        hi = min(len(stream), lo + 10_000)
        store.append_events(
            [
                NewEvent(
                    str(stream.src[i]),
                    str(stream.dst[i]),
                    float(stream.t[i]),
                    tuple(stream.features[i].tolist())
                    if stream.features.shape[1] == dim
                    else (0.0,) * dim,
                    None,
                )
                for i in range(lo, hi)
            ]
        )
    advance_s = 0.0
    inner = runtime.kernels.advance

    def timed(states: NodeStates, per_node: Any) -> NodeStates:
        nonlocal advance_s
        t0 = time.perf_counter()
        out = inner(states, per_node)
        _sync(runtime.device)
        advance_s += time.perf_counter() - t0
        return out

    runtime.kernels.advance = timed  # type: ignore[method-assign]
    report = backfill_store(runtime, store, window=4096, progress=False)
    c = model.config
    state_bytes = c.n_layers * c.d_inner * (c.d_state + c.d_conv - 1) * 4
    event_bytes = 8 * 4 + 4 * dim  # other key, role, t, seq; features
    floor_bytes = report.stats.events_applied * event_bytes + report.nodes * state_bytes
    return BackfillRow(
        dataset,
        report.stats.events_applied,
        report.seconds,
        advance_s,
        runtime.kernels.path,
        floor_bytes / bandwidth if bandwidth else None,
    )


# ===================================================================== scoring
@dataclass
class ScoringRow:
    backend: str
    providers: str
    pairs: int
    pairs_per_s: float | None
    floor_s: float | None


def bench_scoring(
    checkpoint: LoadedCheckpoint, pairs: int, repeats: int, bandwidth: float | None
) -> list[ScoringRow]:
    c = checkpoint.config
    g = torch.Generator().manual_seed(0)
    states = NodeStates.initial(pairs, c)
    states.h = torch.randn(states.h.shape, generator=g)
    states.t_last = torch.full((pairs,), 1e6, dtype=torch.float64)
    tau = torch.full((pairs,), 1e6 + 100.0, dtype=torch.float64)
    pair = torch.randn(pairs, 11, generator=g)
    ids = torch.randint(0, 2**62, (pairs, 2 + 2 * c.identity_match_depth), generator=g)
    floor = (2 * pairs * c.n_layers * c.d_inner * c.d_state * 4) / bandwidth if bandwidth else None
    rows = []

    def rate(fn: Callable[[], object], sync: torch.device | None = None) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        if sync is not None:
            _sync(sync)
        return pairs * repeats / (time.perf_counter() - t0)

    try:
        from model.onnx.runtime import OnnxLinkModel

        onnx_model = OnnxLinkModel.from_loaded(checkpoint)
        got = onnx_model.session_providers["readout_head"]
        on_cuda = got[0] == "CUDAExecutionProvider"
        rows.append(
            ScoringRow(
                "onnxruntime",
                ", ".join(got),
                pairs,
                rate(lambda: onnx_model.score_states(states, states, tau, pair, ids))
                if on_cuda
                else None,
                floor,
            )
        )
    except Exception as exc:  # onnxruntime missing or the export failing: say so in the row
        rows.append(ScoringRow("onnxruntime", f"not run: {type(exc).__name__}", pairs, None, floor))
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        try:
            m = copy.deepcopy(checkpoint.model).to(cuda)
            s, t, p, i = states.to(cuda), tau.to(cuda), pair.to(cuda), ids.to(cuda)
            with torch.no_grad():
                r = rate(lambda: m.score_states(s, s, t, p, i), cuda)
            rows.append(ScoringRow("torch", "cuda", pairs, r, floor))
        except Exception as exc:
            rows.append(
                ScoringRow("torch", f"cuda, failed: {type(exc).__name__}", pairs, None, floor)
            )
    return rows


# ===================================================================== report
def _fmt_s(x: float | None) -> str:
    return "not run" if x is None else f"{x:.3g} s"


def _cell(row: ColdRow, path: str) -> str:
    return "failed" if path in row.failed else _fmt_s(row.seconds[path])


def render(
    cold: list[ColdRow],
    backfill: BackfillRow | None,
    scoring: list[ScoringRow],
    gpu_bw: float | None,
    cpu_bw: float,
    command: str,
    backfill_error: str = "",
) -> str:
    lines = [
        SECTION_START,
        "## GPU: mamba-ssm kernels, torch on CUDA, onnxruntime's CUDA provider",
        "",
        f"Written by `{command}` on {platform.node()} ({_gpu_name()}; {os.cpu_count()} CPU cores;"
        f" torch {torch.__version__}). Copy bandwidth measured here: GPU"
        f" {'n/a' if gpu_bw is None else f'{gpu_bw / 1e9:,.0f} GB/s'}, CPU {cpu_bw / 1e9:,.1f} GB/s.",
        "",
        "What each GPU run found, and how to run the checks again on a bare GPU machine:"
        " [GPU.md](GPU.md).",
        "",
        "### Cold rebuild from the zero state (bundled checkpoint's shapes, delta_min 1e-4)",
        "",
        f"CPU rank-major with {torch.get_num_threads()} torch threads; (scaled): timed on"
        " a subset of the nodes and scaled by the node count.",
        "",
        "| nodes | length | CPU rank-major | torch on CUDA | mamba-ssm kernels | kernel events/s"
        " | kernels vs CPU | scan floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in cold:
        cpu = r.seconds["torch-cpu"]
        kern = r.seconds["mamba-ssm"]
        speed = f"{cpu / kern:,.0f}x" if cpu and kern else "-"
        kern_rate = f"{r.nodes * r.length / kern:,.0f}" if kern else "-"
        cpu_txt = _fmt_s(cpu) + (" (scaled)" if r.scaled["torch-cpu"] else "")
        lines.append(
            f"| {r.nodes:,} | {r.length:,} | {cpu_txt} | {_cell(r, 'torch-cuda')} |"
            f" {_cell(r, 'mamba-ssm')} | {kern_rate} | {speed} | {_fmt_s(r.floor_s)} |"
        )
    for r in cold:
        for path, why in r.failed.items():
            lines.append(f"\n{path} failed at {r.nodes:,} x {r.length:,}: {why}")
    why_not = load_mamba_ops()[1]
    if why_not:
        lines += ["", f"mamba-ssm kernels not run: {why_not}"]
    lines += ["", "### Backfill", ""]
    if backfill is None:
        lines.append(backfill_error or "not run")
    else:
        b = backfill
        lines += [
            "| log | events | path | total | events/s | state advance (device time) | floor |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| {b.dataset} | {b.events:,} | {b.path} | {b.seconds:.2f} s |"
            f" {b.events / b.seconds:,.0f} | {b.advance_seconds:.2f} s | {_fmt_s(b.floor_s)} |",
        ]
    lines += [
        "",
        "### Batch scoring (read-out and head from cached states)",
        "",
        "| backend | providers | pairs per call | pairs/s | floor (both states read) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in scoring:
        rate = "not run (no CUDA provider)" if s.pairs_per_s is None else f"{s.pairs_per_s:,.0f}"
        lines.append(
            f"| {s.backend} | {s.providers} | {s.pairs:,} | {rate} | {_fmt_s(s.floor_s)} |"
        )
    lines += [
        "",
        "Goals (issue 16): kernel cold rebuild >= 100x the CPU path on the same batch; MOOC's",
        "whole log backfilled in under 2 s of GPU time. Floors: the scan's own traffic (reads",
        "of u, Delta, B, C, write of y, final states) or the backfill's (history events read,",
        "states written once) or scoring's (both states of each pair) at the copy bandwidth.",
        SECTION_END,
    ]
    return "\n".join(lines)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dygserve bench gpu", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=BUNDLED_CHECKPOINT)
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--doc", type=Path, default=None, help="rewrite this file's GPU section")
    p.add_argument("--nodes", default="1000,10000,100000")
    p.add_argument("--lengths", default="16,128,1024")
    p.add_argument("--cpu-max-events", type=int, default=2_000_000)
    p.add_argument("--max-padded-events", type=int, default=1 << 22)
    p.add_argument("--backfill", default="mooc", help="dataset to backfill ('' = skip)")
    p.add_argument("--backfill-limit", type=int, default=None)
    p.add_argument("--score-pairs", type=int, default=10_000)
    p.add_argument("--score-repeats", type=int, default=20)
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    checkpoint = load_checkpoint(a.checkpoint)
    model = floor_model(checkpoint)
    gpu_bw = copy_bandwidth(torch.device("cuda")) if torch.cuda.is_available() else None
    cpu_bw = copy_bandwidth(torch.device("cpu"), nbytes=1 << 28)
    from training.data import read_edge_stream

    stream = read_edge_stream(a.data / "mooc", limit=100_000)
    gaps = np.diff(stream.t)
    cold = bench_cold(
        model,
        gaps,
        _ints(a.nodes),
        _ints(a.lengths),
        a.cpu_max_events,
        a.max_padded_events,
        gpu_bw,
    )
    backfill, backfill_error = None, ""
    if a.backfill:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            backfill = bench_backfill(
                checkpoint, a.data, a.backfill, device, a.backfill_limit, gpu_bw or cpu_bw
            )
        except Exception as exc:  # keep the other sections' figures
            backfill_error = f"failed: {type(exc).__name__}: {exc}"[:300]
            print(f"backfill {backfill_error}", flush=True)
    scoring = bench_scoring(checkpoint, a.score_pairs, a.score_repeats, gpu_bw)
    command = "dygserve bench gpu " + " ".join(argv if argv is not None else [])
    section = render(cold, backfill, scoring, gpu_bw, cpu_bw, command.strip(), backfill_error)
    print(section)
    if a.doc is not None:
        text = a.doc.read_text() if a.doc.exists() else "# Benchmarks\n"
        a.doc.write_text(replace_section(text, section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
