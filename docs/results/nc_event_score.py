"""Prototype (not the product): would a Wikipedia node head gain from the link model's
own score of the edit being classified?

A vandal's edit goes where the editor's history does not point (pages it never
touched, at an unusual pace), which the link model measures: its logit for the event
(u, v) at t, from the states and lists before the event, is how expected this edit
was. Each event's logit is replayed causally (exact visibility, every event queried
as a positive, score-then-update), appended to the default head's inputs (k = 0, 5
members) and fitted with head seeds 0-2; validation and test AUC against the same
head without it:

* ``logit``: the event's link logit.
* ``surprise``: the logit and the source's mean logit over its earlier events (how
  unexpected this editor's edits have been so far; 0 before its first).

    python docs/results/nc_event_score.py runs/nc/wikipedia-link logit surprise
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import torch
from nc_node_history import CFG, DATA, compare  # this folder's probe: the same heads

from model.checkpoint import load_checkpoint
from training.batches import IndexedStream
from training.data import EdgeStream, read_edge_stream
from training.metrics import roc_auc
from training.node_classification import replay_inputs
from training.replay import Queries, replay


def event_logits(base: str, stream: EdgeStream) -> np.ndarray:
    """Each event's link logit from the states before it (the stream's own order)."""
    ckpt = load_checkpoint(base)
    data = IndexedStream.build(stream)
    n = len(data)
    ev = np.arange(n, dtype=np.int64)
    q = Queries(
        src=data.src.copy(),
        dst=data.dst.copy(),
        t=data.t.astype(np.float64),
        event=ev,
        kind=np.full(n, "pos", dtype=object),
        setting=np.full(n, "", dtype=object),
        split=np.full(n, "all", dtype=object),
    )
    q.logit = np.full(n, np.nan)
    replay(ckpt.model, data, q, visibility="exact")
    return q.logit


def surprise_features(src: np.ndarray, logit: np.ndarray) -> np.ndarray:
    """(logit, the source's running mean logit before the event)."""
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    mean = np.zeros(len(src), np.float32)
    for i in range(len(src)):
        u = int(src[i])
        if u in count:
            mean[i] = total[u] / count[u]
        total[u] = total.get(u, 0.0) + float(logit[i])
        count[u] = count.get(u, 0) + 1
    return np.stack([logit.astype(np.float32), mean], axis=1)


def main(base: str, names: list[str]) -> None:
    torch.set_num_threads(1)
    inputs = replay_inputs(DATA, base, CFG)
    inputs = replace(inputs, x=inputs.x[:, : inputs.head_config.input_dim])
    s = read_edge_stream(DATA)
    logit = event_logits(base, s)
    feats = {
        "logit": logit.astype(np.float32)[:, None],
        "surprise": surprise_features(s.src, logit),
    }
    pos = inputs.y == 1
    print(
        f"event logit: positives mean {logit[pos].mean():.2f}, others {logit[~pos].mean():.2f}; "
        f"AUC of -logit alone: test {100 * roc_auc(inputs.y[inputs.masks['test']], -logit[inputs.masks['test']]):.2f}",
        flush=True,
    )
    compare(inputs, feats, names)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
