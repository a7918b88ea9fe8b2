"""A ~1-minute end-to-end demo of the model on a real stream.

1. train a small causal DyG-Mamba on the first ``--events`` events (one epoch),
2. evaluate it with the streaming evaluator (score, then update) on the test part,
3. check step/scan parity on real events: folding ``model.step`` over some busy
   nodes' event sequences equals one ``model.scan`` from the same initial state.

    python -m training.demo --data ../shared/data/uci/edges.csv.gz
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import torch

from model.checkpoint import load_checkpoint
from model.events import EventInputs
from model.node_state import NodeStates

from .batches import IndexedStream, NodeEventIndex
from .data import chronological_split, read_edge_stream
from .evaluate import evaluate_model
from .train import train


def step_scan_parity(model, data: IndexedStream, n_nodes: int = 16, length: int = 64) -> float:
    """Max relative difference between folding step() and one scan() on real events."""
    index = NodeEventIndex.build(data, np.arange(len(data)))
    counts = index.count(np.arange(data.num_nodes))
    nodes = np.argsort(-counts, kind="stable")[:n_nodes]
    stop = np.minimum(counts[nodes], length)
    ev, lengths = index.event_inputs(data, nodes, np.zeros_like(stop), stop)
    s0 = NodeStates.initial(len(nodes), model.config)
    with torch.no_grad():
        scanned, _ = model.scan(s0, ev, lengths)
        h = s0
        for j in range(ev.t.shape[1]):
            active = (lengths > j).nonzero().squeeze(1)
            one = EventInputs(
                ev.other_key[active, j],
                ev.role[active, j],
                ev.features[active, j],
                ev.t[active, j],
                ev.seq[active, j],
            )
            stepped = model.step(h.select(active), one)
            h.h[active], h.conv[active] = stepped.h, stepped.conv
            h.t_last[active], h.n_events[active] = stepped.t_last, stepped.n_events
    scale = scanned.h.abs().max().clamp(min=1e-6)
    return float(((scanned.h - h.h).abs().max() / scale).item())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.demo", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--data", required=True)
    ap.add_argument("--events", type=int, default=8000, help="use the first N events of the stream")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"[1/3] training 1 epoch on the first {args.events} events of {args.data}")
        version = train(
            args.data,
            tmp,
            {"d_model": 32, "n_layers": 1},
            epochs=1,
            max_events=args.events,
            test_eval=False,
        )
        ckpt = load_checkpoint(tmp)
        print(
            f"      model version {version}, {sum(p.numel() for p in ckpt.model.parameters())} parameters, "
            f"{ckpt.metrics['epoch_times_s'][0]:.1f}s per epoch"
        )
    stream = read_edge_stream(args.data, limit=args.events)
    data, split = IndexedStream.build(stream), chronological_split(stream)
    print("[2/3] streaming evaluation (score, then update; exact visibility)")
    metrics, _ = evaluate_model(
        ckpt.model, data, split, ("val", "test"), ("transductive",), ("random", "historical"), 0
    )
    for s in ("val", "test"):
        for k, m in metrics[s]["transductive"].items():
            print(
                f"      {s:4s} {k:10s} AP {100 * m['ap']:.2f}  AUC {100 * m['auc']:.2f}  ({m['n_positives']} positives)"
            )
    print("[3/3] step/scan parity on the busiest nodes' real events")
    rel = step_scan_parity(ckpt.model, data)
    ok = rel <= 1e-5
    print(f"      max relative difference {rel:.2e} ({'ok' if ok else 'FAILED'}, bound 1e-5)")
    print(f"done in {time.perf_counter() - t0:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
