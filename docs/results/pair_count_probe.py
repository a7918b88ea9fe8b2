"""What does a trained link model miss that a whole-history pair count holds? A probe.

A checkpoint's streaming replay scores the validation and test events against one
random destination each and one historical one (DyGLib's negatives, the evaluator's own queries and
visibility). Beside each query this walks the stream in time order, counting from the
events strictly before the query's time (a timestamp's queries before its events):

* the exact number of earlier events between u and v (either direction);
* the same count kept as a per-node hashed sketch: B float counts per node, event (u, v)
  adds one to u's cell of v's bucket and to v's cell of u's bucket, and a query reads the
  smaller of u's cell for v and v's cell for u (count-min over the two records);
* the sketch with exponential decay (time constants a twentieth and a fifth of the
  training span);
* how often v is among u's last L neighbours and u among v's (L = 32, 128, 512): what
  the model's neighbour lists already count.

First the test positives and random negatives are grouped by whether the pair had met
before (a repeat or a first meeting): the AUC between each pair of groups and each
pair's share of the misranked (positive, negative) pairs. Then, for each feature, a
logistic regression on [the model's logit, the feature] is fitted on the
validation queries with random negatives, and its global test AP with random and with
historical negatives printed next to the model's own: what the feature adds to this
model's ranking, and what re-weighting it for random negatives costs the historical
ones; then the logit plus w times the exact count's feature over a range of w, the
trade-off between the two. Results: docs/results/current-defaults.md,
"Whole-history pair counts, probed".

    python docs/results/pair_count_probe.py --checkpoint checkpoints/default \\
        --data ../shared/data/uci [--buckets 256]
"""

from __future__ import annotations

from collections import deque
from itertools import product

import numpy as np
from logit_probe import (
    StackedProbe,
    checkpoint_parser,
    replayed_queries,
)  # its neighbour in docs/results

from model.transition_counts import bucket_of
from training.metrics import roc_auc

LIST_LENGTHS = (32, 128, 512)
FRONTIER_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def main() -> None:
    ap = checkpoint_parser(__doc__)
    ap.add_argument("--buckets", type=int, default=256)
    args = ap.parse_args()
    data, split, q = replayed_queries(args.checkpoint, args.data)

    n, b = data.num_nodes, args.buckets
    span = float(data.t[split.train].max() - data.t[0])
    taus = {"decayed over 0.05 of the span": 0.05 * span, "decayed over 0.2": 0.2 * span}
    bucket = bucket_of(data.keys, b)  # the node-key buckets the transition records use
    exact: dict[tuple[int, int], int] = {}
    sketch = np.zeros((n, b))
    decayed = {k: np.zeros((n, b)) for k in taus}
    as_of = np.zeros(n)  # the time each node's decayed sketch is as of
    lists = {L: [deque[int](maxlen=L) for _ in range(n)] for L in LIST_LENGTHS}
    names = (
        ["exact count", f"sketch of {b} buckets"]
        + [f"sketch, {k}" for k in taus]
        + [f"count in the last {L} list entries" for L in LIST_LENGTHS]
    )
    feats = np.zeros((len(q), len(names)))
    order = np.argsort(q.t, kind="stable")
    qt = q.t[order]
    e, i = 0, 0
    for time_now in np.unique(qt):
        while e < len(data.t) and data.t[e] < time_now:
            s, d, t = int(data.src[e]), int(data.dst[e]), float(data.t[e])
            key = (min(s, d), max(s, d))
            exact[key] = exact.get(key, 0) + 1
            for a, other in ((s, d), (d, s)) if s != d else ((s, d),):
                for k, tau in taus.items():
                    decayed[k][a] *= np.exp(-(t - as_of[a]) / tau)
                    decayed[k][a, bucket[other]] += 1
                as_of[a] = t
                sketch[a, bucket[other]] += 1
                for L in LIST_LENGTHS:
                    lists[L][a].append(other)
            e += 1
        j = i
        while j < len(qt) and qt[j] == time_now:
            j += 1
        rows, i = order[i:j], j
        u, v = q.src[rows].astype(int), q.dst[rows].astype(int)
        col = [np.log1p([exact.get((min(a, c), max(a, c)), 0) for a, c in zip(u, v, strict=True)])]
        col.append(np.log1p(np.minimum(sketch[u, bucket[v]], sketch[v, bucket[u]])))
        for k, tau in taus.items():
            du = decayed[k][u, bucket[v]] * np.exp(-(time_now - as_of[u]) / tau)
            dv = decayed[k][v, bucket[u]] * np.exp(-(time_now - as_of[v]) / tau)
            col.append(np.log1p(np.minimum(du, dv)))
        for L in LIST_LENGTHS:
            col.append(
                np.log1p(
                    [lists[L][a].count(c) + lists[L][c].count(a) for a, c in zip(u, v, strict=True)]
                )
            )
        feats[rows] = np.stack(col, axis=1)

    probe = StackedProbe(q)
    # Where the model's random-negative ranking fails: positives and negatives grouped
    # by whether the pair had met before the query (exact count > 0).
    met = feats[:, 0] > 0
    pos, neg = (q.kind == "pos") & (q.split == "test"), (q.kind == "random") & (q.split == "test")
    groups = {"repeat": met, "first meeting": ~met}
    misranked = {}
    for (pn, pm), (nn, nm) in product(groups.items(), groups.items()):
        below = np.sort(q.logit[neg & nm])
        above = q.logit[pos & pm]
        misranked[pn, nn] = float((len(below) - np.searchsorted(below, above)).sum())
        auc = roc_auc(np.r_[np.ones(len(above)), np.zeros(len(below))], np.r_[above, below])
        print(
            f"{pn} positives ({len(above)}) over {nn} negatives ({len(below)}): AUC {100 * auc:.2f}"
        )
    total = sum(misranked.values())
    for (pn, nn), count in misranked.items():
        print(
            f"  {100 * count / total:.1f}% of misranked pairs: a {pn} positive under a {nn} negative"
        )
    print(f"{args.data}: test AP (global), random / historical negatives")
    print(f"  the model alone: {probe.aps(q.logit)}")
    for k, name in enumerate(names):
        print(f"  + {name}: {probe.stacked(feats[:, [k]])}")
    # The trade-off itself: the logit plus w times the exact count's feature, for a
    # range of w (w = 0 is the model; the fitted regressions above are one point each).
    print("  logit + w * log(1 + exact count), random / historical:")
    for w in FRONTIER_WEIGHTS:
        print(f"    w = {w:g}: {probe.aps(q.logit + w * feats[:, 0])}")


if __name__ == "__main__":
    main()
