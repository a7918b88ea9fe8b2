"""The node-classification evaluator: causal replay (read each event's source from the
states before the event, then ingest the event), then AUC-ROC and AP per split.

The label of an event is the dataset's ``label`` column: the state of the event's
SOURCE node at that interaction (DyGLib/JODIE: a Wikipedia editor banned, a MOOC
student dropping out). AUC-ROC is over all of a split's events, DyGLib's metric for
this task; AP is given beside it. The split is DyGLib's chronological 70/15/15 at the
time quantiles.

CLI (``dygserve evaluate`` picks it for a checkpoint with a node head)::

    python -m training.node_evaluate --checkpoint DIR --data PATH --out EVAL
        [--write-scores FILE] [--max-events N]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.checkpoint import CheckpointError, load_checkpoint
from model.node_head import NodeClassifierHead
from model.node_head_checkpoint import load_node_head

from .batches import IndexedStream
from .data import ChronologicalSplit, EdgeStream, chronological_split, read_edge_stream
from .jsonable import jsonable
from .metrics import average_precision, roc_auc
from .node_replay import collect_source_inputs

SPLITS = ("train", "val", "test")


def split_masks(stream: EdgeStream, split: ChronologicalSplit) -> dict[str, np.ndarray]:
    """Every event belongs to one split by its time (no node is held out: a node's label
    is asked about whenever it acts, as in DyGLib's node classification)."""
    return {"train": stream.t <= split.val_time, "val": split.val, "test": split.test}


def labels_of(stream: EdgeStream) -> np.ndarray:
    if stream.labels is None:
        raise ValueError(f"{stream.name or 'the data'} has no label column to learn or evaluate")
    return (stream.labels > 0).astype(np.int64)


@torch.no_grad()
def head_logits(head: NodeClassifierHead, inputs: np.ndarray, chunk: int = 65536) -> np.ndarray:
    head.eval()
    x = torch.from_numpy(inputs)
    return np.concatenate(
        [head(x[i : i + chunk]).to(torch.float64).numpy() for i in range(0, len(x), chunk)]
        or [np.zeros(0)]
    )


def split_metrics(
    y: np.ndarray, logits: np.ndarray, masks: dict[str, np.ndarray]
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, m in masks.items():
        out[name] = {
            "auc": roc_auc(y[m], logits[m]),
            "ap": average_precision(y[m], logits[m]),
            "n_events": int(m.sum()),
            "n_positives": int(y[m].sum()),
        }
    return out


def write_node_scores(
    path: str | Path,
    stream: EdgeStream,
    y: np.ndarray,
    logits: np.ndarray,
    masks: dict[str, np.ndarray],
    splits: Sequence[str] = ("val", "test"),
) -> None:
    """One row per evaluated event: split, event, node (the source), t, label, logit."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["split", "event", "node", "t", "label", "logit"])
        for name in splits:
            for e in np.flatnonzero(masks[name]).tolist():
                w.writerow(
                    [
                        name,
                        e,
                        stream.src[e],
                        repr(float(stream.t[e])),
                        int(y[e]),
                        repr(float(logits[e])),
                    ]
                )


def evaluate_node_checkpoint(
    checkpoint: str | Path,
    data_path: str | Path,
    max_events: int | None = None,
    write_scores: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    ckpt = load_checkpoint(checkpoint)
    loaded = load_node_head(checkpoint, ckpt.version)
    if loaded is None:
        raise CheckpointError(f"{checkpoint} has no node head (node_head.json)")
    stream = read_edge_stream(data_path, limit=max_events)
    y = labels_of(stream)
    data = IndexedStream.build(stream)
    if loaded.config.event_feature_dim and data.feature_dim != loaded.config.event_feature_dim:
        raise ValueError(
            f"the data has {data.feature_dim} edge features, the head reads {loaded.config.event_feature_dim}"
        )
    if data.feature_dim != ckpt.config.edge_feature_dim:
        raise ValueError(
            f"the data has {data.feature_dim} edge features, the link model expects {ckpt.config.edge_feature_dim}"
        )
    masks = split_masks(stream, chronological_split(stream))
    t0 = time.perf_counter()
    inputs = collect_source_inputs(ckpt.model, loaded.config, data, progress=progress)
    logits = head_logits(loaded.head, inputs)
    metrics: dict[str, Any] = split_metrics(y, logits, masks)
    metrics.update(
        task="node-classification",
        replay_seconds=time.perf_counter() - t0,
        checkpoint=str(Path(checkpoint).resolve()),
        model_version=ckpt.version,
        head_version=loaded.version,
        data=str(data_path),
        events=len(stream),
    )
    if write_scores:
        write_node_scores(write_scores, stream, y, logits, masks)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="dygserve evaluate", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--task", choices=("node-classification",), default="node-classification")
    ap.add_argument("--checkpoint", required=True, help="checkpoint folder with a node head")
    ap.add_argument("--data", required=True, help="dataset folder or edges.csv.gz (with labels)")
    ap.add_argument("--out", required=True, help="output folder (metrics.json)")
    ap.add_argument("--write-scores", default=None, metavar="FILE", help="val/test logits as CSV")
    ap.add_argument("--max-events", type=int, default=None, help="only the first N events")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ckpt, out = Path(args.checkpoint).resolve(), Path(args.out).resolve()
    if out == ckpt or ckpt in out.parents:
        ap.error("--out must not be inside the checkpoint folder")
    metrics = evaluate_node_checkpoint(
        args.checkpoint, args.data, args.max_events, args.write_scores, not args.no_progress
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(
        json.dumps(jsonable(metrics), indent=2, sort_keys=True) + "\n"
    )
    for name in ("val", "test"):
        m = metrics[name]
        print(
            f"{name:5s} AUC {100 * m['auc']:.2f}  AP {100 * m['ap']:.2f}"
            f"  ({m['n_positives']} positives in {m['n_events']} events)"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
