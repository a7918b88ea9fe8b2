"""Does DyGFormer's neighbour co-occurrence over long histories explain its Can. Parl.
numbers? A probe, no model.

DyGFormer (97.36 random AP) and DyG-Mamba (98.37) reach Can. Parl.'s best published
figures with exact visibility (a query sees the events strictly before its time, so
nothing of its own year) and sequences of the last 2,048 neighbours. Their pair signal
is the co-occurrence encoding: for every token w of u's sequence (u itself first, the
"self token", then its neighbours) the pair [how often w is in u's sequence, how often
in v's], and the same for v's sequence, each encoded and pooled. This script computes
exactly those counts for each query and summarises them for a gradient-boosted tree:
per sequence, a 9 x 9 histogram of the (own, other) counts on log-spaced bins, how many
tokens the other sequence shares and their summed log-counts, the sequence length;
plus how often u and v met and how long ago each was last active. The tree sees the
whole joint distribution of the counts, which is what a learned encoder and pooling
can use of them.

Each event (u, v) of years 1-13 is paired with one random destination (DyGLib's random
negatives: any node that is ever a destination). The tree is fitted on years 1-9 and
scored on years 10-11 (DyGLib's validation split of this stream: its time quantiles
fall on year boundaries) and 12-13 (test). ``--visibility batch`` cuts each sequence at
the start of the query's batch of 200 instead of at its year (what the memory models
and TPNet see, and this project's trainer picks on snapshot streams). Results:
docs/results/current-defaults.md, "Neighbour co-occurrence over 2,048 neighbours".

    python docs/results/canparl_cooccurrence.py [--lengths 32,256,2048] [--visibility exact|batch] [--every 3]
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import average_precision_score, roc_auc_score

from training.data import read_edge_stream

BINS = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, np.inf])
BATCH = 200  # DyGLib's evaluation batch


class Histories:
    """Every node's undirected neighbours in stream order, with times and positions."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> None:
        n = int(max(src.max(), dst.max())) + 1
        nb: list[list[int]] = [[] for _ in range(n)]
        at: list[list[float]] = [[] for _ in range(n)]
        pos: list[list[int]] = [[] for _ in range(n)]
        for k, (s, d, tt) in enumerate(zip(src.tolist(), dst.tolist(), t.tolist(), strict=True)):
            for a, b in ((s, d), (d, s)):
                nb[a].append(b)
                at[a].append(tt)
                pos[a].append(k)
        self.nb = [np.array(x, dtype=np.int64) for x in nb]
        self.at = [np.array(x) for x in at]
        self.pos = [np.array(x, dtype=np.int64) for x in pos]

    def sequence(
        self, node: int, t: float, index: int, length: int, batch: bool
    ) -> tuple[np.ndarray, float]:
        """The self token and the node's last ``length`` neighbours visible to a query,
        and the time of its last visible event (-inf if none)."""
        if batch:
            end = int(np.searchsorted(self.pos[node], index - index % BATCH, side="left"))
        else:
            end = int(np.searchsorted(self.at[node], t, side="left"))
        seq = self.nb[node][max(0, end - length) : end]
        last = float(self.at[node][end - 1]) if end else -np.inf
        return np.concatenate([[node], seq]), last


def sequence_features(seq: np.ndarray, own: dict[int, int], other: dict[int, int]) -> list[float]:
    a = np.array([own[w] for w in seq.tolist()], dtype=float)
    b = np.array([other.get(w, 0) for w in seq.tolist()], dtype=float)
    hist = np.histogram2d(a, b, bins=[BINS, BINS])[0].ravel()
    return [len(seq), float((b > 0).sum()), float(np.log1p(b).sum()), *np.log1p(hist)]


def counts(seq: np.ndarray) -> dict[int, int]:
    keys, n = np.unique(seq, return_counts=True)
    return dict(zip(keys.tolist(), n.tolist(), strict=True))


def pair_features(
    h: Histories, u: int, v: int, t: float, index: int, length: int, batch: bool
) -> list[float]:
    su, last_u = h.sequence(u, t, index, length, batch)
    sv, last_v = h.sequence(v, t, index, length, batch)
    cu, cv = counts(su), counts(sv)
    year = 365 * 86400.0
    return [
        *sequence_features(su, cu, cv),
        *sequence_features(sv, cv, cu),
        cu.get(v, 0),
        cv.get(u, 0),
        min((t - last_u) / year, 99.0),
        min((t - last_v) / year, 99.0),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/canparl")
    parser.add_argument("--lengths", default="32,256,2048")
    parser.add_argument("--visibility", choices=["exact", "batch"], default="exact")
    parser.add_argument("--every", type=int, default=3, help="score every n-th event")
    args = parser.parse_args()

    stream = read_edge_stream(args.data, with_features=False)
    src, dst, t = stream.src.astype(np.int64), stream.dst.astype(np.int64), stream.t
    year = np.searchsorted(np.unique(t), t)
    destinations = np.unique(dst)
    h = Histories(src, dst, t)
    batch = args.visibility == "batch"
    for length in map(int, args.lengths.split(",")):
        rng = np.random.default_rng(0)
        rows, labels, years = [], [], []
        for i in range(0, len(src), args.every):
            if year[i] == 0:
                continue
            u, v = int(src[i]), int(dst[i])
            negative = int(destinations[rng.integers(len(destinations))])
            for w, label in ((v, 1), (negative, 0)):
                rows.append(pair_features(h, u, w, float(t[i]), i, length, batch))
                labels.append(label)
                years.append(year[i])
        x, y, yr = np.array(rows), np.array(labels), np.array(years)
        fit = yr <= 9
        tree = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05, random_state=0)
        tree.fit(x[fit], y[fit])
        line = [f"L={length:5d} {args.visibility:5s}"]
        for name, part in (("val", (yr >= 10) & (yr <= 11)), ("test", yr >= 12)):
            p = tree.predict_proba(x[part])[:, 1]
            ap, auc = average_precision_score(y[part], p), roc_auc_score(y[part], p)
            line.append(f"{name} AP {100 * ap:.2f} AUC {100 * auc:.2f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
