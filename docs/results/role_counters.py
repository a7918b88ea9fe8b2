"""Prototype: per-node role counts beyond the neighbour list, as 20 more pair features.

Not the product: the counts come from the dataset file, not from the node state, so
nothing here can be served. It measures what such a per-node record would buy before
the blob layout, the scan, the numpy twin and the ONNX graph are changed for it.

Every count is a function of (node, how many of its events are applied, query time):
the trainer and the evaluator already hand the pair features a node's applied-event
count ``n`` (its state's ``n_events``), and a node's events are applied in stream
order, so its first ``n`` events of the file are exactly what its state holds. Each
endpoint gets ten log1p features; ``windows`` counts per snapshot (snapshot = distinct
timestamp, Can. Parl.'s years):

* in- and out-events in the query's snapshot so far, in the one before, in the three
  before, and in all earlier snapshots (8);
* snapshots since its latest in-event, and "never an in-event" (2).

``decayed`` has the recurrent form a node state would keep instead (one update per
event, general for streams without snapshots): in- and out-events decayed by
exp(-age / c) at c = 0.25, 1 and 4 snapshot spacings, and all of them (8), then the
same two "latest in-event" features (in snapshot spacings; ``decayed:U`` takes U time
units instead, for streams without snapshots).

A self-loop counts once in each role, source first (as ``model.events`` applies it).
The script patches ``model.pair_features`` and then runs the trainer or the evaluator
with the remaining arguments; train and evaluate with the same form::

    python docs/results/role_counters.py windows ../shared/data/canparl train \
        --data ../shared/data/canparl --out runs/canparl-cnt-s0 --epochs 12 --seed 0
    python docs/results/role_counters.py windows ../shared/data/canparl evaluate \
        --checkpoint runs/canparl-cnt-s0 --data ../shared/data/canparl \
        --out runs/canparl-cnt-s0-eval --splits test --settings transductive --mrr-k 0

Results: visibility-experiments.md, "Role counts beyond the list".
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import model.link_model as link_model
import model.pair_features as pair_features
from model.node_ids import node_key

EXTRA = 20  # 10 per endpoint
DECAY_SPACINGS = (0.25, 1.0, 4.0)


class RoleCounts:
    """Per-node cumulative counts over each node's events in stream order."""

    def __init__(self, edges_csv_gz: str, unit: float | None = None, windows: bool = True) -> None:
        with gzip.open(edges_csv_gz, "rt") as f:
            rows = np.loadtxt(f, delimiter=",", skiprows=1, usecols=(0, 1, 2))
        src, dst, ts = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2]
        self.snaps = np.unique(ts)
        self.spacing = unit or float(np.median(np.diff(self.snaps)))
        nodes = np.unique(np.r_[src, dst])
        self.row_of = {node_key(str(int(x))): i for i, x in enumerate(nodes)}
        index = {int(x): i for i, x in enumerate(nodes)}
        events: list[list[tuple[float, int]]] = [[] for _ in nodes]  # (t, is_in)
        for s, d, t in zip(src, dst, ts, strict=True):
            events[index[int(s)]].append((t, 0))
            events[index[int(d)]].append((t, 1))
        self.max_events = max(len(e) for e in events)
        width = self.max_events + 1
        n_snaps = len(self.snaps) if windows else 0
        # cum[role, node, k]: role events among the node's first k
        self.cum = np.zeros((2, len(nodes), width))
        # decayed[role, j, node, k]: the same decayed to the k-th event's time (k >= 1)
        self.decayed = np.zeros((2, len(DECAY_SPACINGS), len(nodes), width))
        self.event_t = np.zeros((len(nodes), width))  # time of the k-th event (k >= 1)
        self.last_in = np.full((len(nodes), width), np.nan)  # time of the latest in-event
        # snap_start[node, y + 1]: how many of the node's events lie before snapshot y
        self.snap_start = np.zeros((len(nodes), n_snaps + 2), dtype=np.int64)
        for i, node_events in enumerate(events):
            a = np.array(node_events, dtype=np.float64).reshape(-1, 2)
            m = len(a)
            t, is_in = a[:, 0], a[:, 1].astype(np.int64)
            for role in (0, 1):
                c = np.cumsum(is_in == role)
                self.cum[role, i, 1 : m + 1] = c
                self.cum[role, i, m + 1 :] = c[-1]
            state = np.zeros((2, len(DECAY_SPACINGS)))
            rates = 1.0 / (np.array(DECAY_SPACINGS) * self.spacing)
            last_t, last_in = t[0], np.nan
            for k in range(m):  # the recurrence a node state would run
                state *= np.exp(-(t[k] - last_t) * rates)
                state[is_in[k]] += 1.0
                last_t = t[k]
                if is_in[k]:
                    last_in = t[k]
                self.decayed[:, :, i, k + 1] = state
                self.event_t[i, k + 1] = t[k]
                self.last_in[i, k + 1] = last_in
            self.decayed[:, :, i, m + 1 :] = state[:, :, None]
            self.event_t[i, m + 1 :] = last_t
            self.last_in[i, m + 1 :] = last_in
            if windows:
                snap_of = np.searchsorted(self.snaps, t)
                self.snap_start[i] = np.searchsorted(snap_of, np.arange(n_snaps + 2) - 1)

    def _rows(self, keys: torch.Tensor, n: torch.Tensor) -> tuple[np.ndarray, ...]:
        r = np.array([self.row_of.get(int(x), -1) for x in keys.numpy()])
        known = r >= 0
        return np.where(known, r, 0), np.minimum(n.numpy().astype(np.int64), self.max_events), known

    def windows(self, keys: torch.Tensor, n: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        r, n_, known = self._rows(keys, n)
        tau_np = tau.numpy()
        snap = np.clip(np.searchsorted(self.snaps, tau_np, side="right") - 1, 0, None)

        def count(role: int, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
            last = len(self.snaps)
            a = np.minimum(n_, self.snap_start[r, np.clip(first, -1, last) + 1])
            b = np.minimum(n_, self.snap_start[r, np.clip(stop, -1, last) + 1])
            return self.cum[role, r, b] - self.cum[role, r, a]

        feats = []
        for role in (1, 0):
            feats += [
                count(role, snap, snap + 1),
                count(role, snap - 1, snap),
                count(role, snap - 3, snap),
                count(role, np.full_like(snap, -1), snap),
            ]
        last = self.last_in[r, n_]
        since = snap - np.searchsorted(self.snaps, np.nan_to_num(last))
        feats += [np.where(np.isnan(last), 0, since), np.isnan(last).astype(np.float64)]
        return self._finish(feats, known)

    def decayed_counts(
        self, keys: torch.Tensor, n: torch.Tensor, tau: torch.Tensor
    ) -> torch.Tensor:
        r, n_, known = self._rows(keys, n)
        tau_np = tau.numpy()
        age = np.maximum(tau_np - self.event_t[r, n_], 0.0)
        feats = []
        for role in (1, 0):
            for j, c in enumerate(DECAY_SPACINGS):
                feats.append(self.decayed[role, j, r, n_] * np.exp(-age / (c * self.spacing)))
            feats.append(self.cum[role, r, n_])
        last = self.last_in[r, n_]
        age_in = np.where(np.isnan(last), 0.0, np.maximum(tau_np - np.nan_to_num(last), 0.0))
        feats += [age_in / self.spacing, np.isnan(last).astype(np.float64)]
        return self._finish(feats, known)

    @staticmethod
    def _finish(feats: list[np.ndarray], known: np.ndarray) -> torch.Tensor:
        f = np.log1p(np.stack(feats, 1)) * known[:, None]
        return torch.from_numpy(f.astype(np.float32))


def patch(counts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Append both endpoints' counts to every pair-feature row, and widen the head."""
    features, width = pair_features.pair_features, pair_features.pair_feature_dim

    def with_counts(*args: Any, **kwargs: Any) -> torch.Tensor:
        key_u, key_v, tau = args[0], args[1], args[2]
        n_u, n_v = args[7], args[8]
        base = features(*args, **kwargs)
        return torch.cat([base, counts(key_u, n_u, tau), counts(key_v, n_v, tau)], 1)

    pair_features.pair_features = with_counts  # type: ignore[assignment]
    pair_features.pair_feature_dim = lambda c: width(c) + EXTRA  # type: ignore[assignment]
    link_model.pair_feature_dim = pair_features.pair_feature_dim  # type: ignore[attr-defined]


def main() -> int:
    form, data_dir, command, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    form, _, unit = form.partition(":")  # "decayed:86400": a unit instead of the spacing
    windows = form == "windows"
    counts = RoleCounts(f"{data_dir}/edges.csv.gz", float(unit) if unit else None, windows)
    patch(counts.windows if windows else counts.decayed_counts)
    if command == "train":
        from training.train import main as run
    else:
        from training.evaluate import main as run
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
