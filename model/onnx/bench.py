"""Torch eager against onnxruntime, per call, for ``step`` and ``score_states``
(``dygserve export-onnx --bench``; the figures in docs/ONNX.md)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import load_checkpoint
from ..events import EventInputs
from ..node_state import NodeStates
from .export import export_loaded, sample_readout_inputs, sample_step_inputs
from .runtime import OnnxLinkModel


def _time_call(fn: Any, min_seconds: float = 0.5, max_calls: int = 2000) -> float:
    """Median seconds per call over repeated blocks, after a warm-up."""
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = int(max(1, min(max_calls, min_seconds / one / 5)))
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        blocks.append((time.perf_counter() - t0) / reps)
    return float(np.median(blocks))


def bench(
    checkpoint_dir: str | Path, batches: Sequence[int] = (1, 1000), threads: int = 1
) -> list[dict[str, Any]]:
    """Torch eager vs onnxruntime for ``step`` and ``score_states`` at the given batches."""
    torch.set_num_threads(threads)
    ck = load_checkpoint(checkpoint_dir)
    torch_model = ck.model.eval()
    with tempfile.TemporaryDirectory(prefix="dygserve-onnx-bench-") as tmp:
        t0 = time.perf_counter()
        manifest = export_loaded(ck, Path(tmp) / "onnx")
        export_s = time.perf_counter() - t0
        ort_model = OnnxLinkModel.from_loaded(ck, Path(tmp) / "onnx", intra_op_threads=threads)
    rows = []
    for n in batches:
        s = sample_step_inputs(torch_model, n, seed=n)
        states = NodeStates(
            s["h"],
            s["conv"],
            s["t_last"],
            torch.zeros(n, dtype=torch.int64),
            torch.ones(n, dtype=torch.int64),
        )
        ev = EventInputs(
            s["other_key"], s["role"], s["features"], s["t"], torch.arange(n, dtype=torch.int64)
        )
        r = sample_readout_inputs(torch_model, n, seed=n + 1)
        su = NodeStates(r["h_u"], s["conv"], r["t_last_u"], states.last_seq, states.n_events)
        sv = NodeStates(r["h_v"], s["conv"], r["t_last_v"], states.last_seq, states.n_events)
        pair = r["pair"] if torch_model.config.use_pair_features else None
        ids = r["pair_ids"] if torch_model.config.identity_match_dim else None

        def torch_step(states: NodeStates = states, ev: EventInputs = ev) -> NodeStates:
            with torch.inference_mode():
                return torch_model.step(states, ev)

        def torch_score(
            su: NodeStates = su,
            sv: NodeStates = sv,
            tau: torch.Tensor = r["tau"],
            pair: Any = pair,
            ids: Any = ids,
        ) -> torch.Tensor:
            with torch.inference_mode():
                return torch_model.score_states(su, sv, tau, pair, ids)

        def ort_step(states: NodeStates = states, ev: EventInputs = ev) -> NodeStates:
            return ort_model.step(states, ev)

        def ort_score(
            su: NodeStates = su,
            sv: NodeStates = sv,
            tau: torch.Tensor = r["tau"],
            pair: Any = pair,
            ids: Any = ids,
        ) -> torch.Tensor:
            return ort_model.score_states(su, sv, tau, pair, ids)

        diff_step = float((torch_step().h - ort_step().h).abs().max())
        diff_score = float((torch_score() - ort_score()).abs().max())
        for op, ft, fo, diff in (
            ("step", torch_step, ort_step, diff_step),
            ("score", torch_score, ort_score, diff_score),
        ):
            t_torch, t_ort = _time_call(ft), _time_call(fo)
            rows.append(
                {
                    "op": op,
                    "batch": n,
                    "torch_us": t_torch * 1e6,
                    "ort_us": t_ort * 1e6,
                    "speedup": t_torch / t_ort,
                    "max_abs_diff": diff,
                }
            )
    print(
        f"checkpoint {ck.path} (version {ck.version}), exporter {manifest['exporter']}, opset {manifest['opset']}, "
        f"export {export_s:.1f} s; providers {ort_model.providers}; {threads} thread(s) each; "
        f"torch {torch.__version__}, onnxruntime {manifest['versions']['onnxruntime']}"
    )
    print(
        "| call | batch | torch eager µs/call | onnxruntime µs/call | torch / ORT | max abs diff |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['op']} | {row['batch']:,} | {row['torch_us']:,.0f} | {row['ort_us']:,.0f} | "
            f"{row['speedup']:.2f}x | {row['max_abs_diff']:.1e} |"
        )
    return rows
