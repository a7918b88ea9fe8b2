"""How far do causal statistics of the past years get on Can. Parl.? No model.

Each event (u, v) of a year is paired with one random destination (DyGLib's random
negatives: any node that is ever a destination), and every statistic is computed from
the earlier years only (exact visibility: nothing of the query's own year). Per
statistic, for the last 1, 2 and 3 years: v's in- and out-degree, u's and v's common
neighbours, whether u and v met, u's degrees; over all earlier years: v's in- and
out-degree, the years since v was last active and last a destination, and how often
u and v met. With ``--batch``, five more statistics come from the query's own year as
batch visibility shows it (the year's events in earlier batches of 200, in file order):
v's in- and out-degree so far, whether u and v met, u's out-degree so far, and whether
any of the year is visible yet. With ``--merged-roles`` every in-degree and out-degree
pair is replaced by their sum (what a node's events count without knowing its role in
each: the snapshot pair features' view). A logistic regression and a small MLP are fitted on years 2-9, and the
AUC and AP are printed on years 10-11 (validation-like) and 12-13 (test-like). This is the
analysis behind the "combined statistics" paragraph of visibility-experiments.md.

    python docs/results/canparl_statistics.py [--batch] [--merged-roles] [--data ../shared/data/canparl/edges.csv.gz]
"""

from __future__ import annotations

import argparse
import collections
import gzip

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

Counter = collections.Counter


def degrees(first: float, second: float, merged: bool) -> list[float]:
    """log1p of a node's two role degrees (in and out), or of their sum alone when roles
    are merged."""
    return [np.log1p(first + second)] if merged else [np.log1p(first), np.log1p(second)]


class Years:
    """Per year: undirected neighbour counts, in-degrees and out-degrees."""

    def __init__(
        self, src: np.ndarray, dst: np.ndarray, year: np.ndarray, merged_roles: bool = False
    ) -> None:
        self.src, self.dst = src, dst
        self.merged = merged_roles
        self.year_start = np.searchsorted(year, np.arange(int(year.max()) + 1))
        self.neighbours: list[dict[int, Counter]] = []
        self.indeg: list[Counter] = []
        self.outdeg: list[Counter] = []
        for y in range(int(year.max()) + 1):
            nb: dict[int, Counter] = collections.defaultdict(Counter)
            m = year == y
            for s, d in zip(src[m].tolist(), dst[m].tolist(), strict=True):
                nb[s][d] += 1
                nb[d][s] += 1
            self.neighbours.append(nb)
            self.indeg.append(Counter(dst[m].tolist()))
            self.outdeg.append(Counter(src[m].tolist()))

    def so_far(self, u: int, v: int, y: int, i: int, batch: int = 200) -> list[float]:
        """Statistics of event i's year from its earlier batches (batch visibility)."""
        lo = int(self.year_start[y])
        hi = lo + (i - lo) // batch * batch
        s, d = self.src[lo:hi], self.dst[lo:hi]
        u_out = (s == u).sum()
        u_in = (d == u).sum() if self.merged else 0  # split roles: u's out-degree alone
        return [
            *degrees((d == v).sum(), (s == v).sum(), self.merged),
            float(((s == u) & (d == v)).any()),
            np.log1p(u_out + u_in),
            float(hi > lo),
        ]

    def features(self, u: int, v: int, y: int) -> list[float]:
        out: list[float] = []
        for back in (1, 2, 3):
            if y - back < 0:
                out += [0.0] * (4 if self.merged else 6)
                continue
            nb = self.neighbours[y - back]
            nu, nv = nb.get(u, Counter()), nb.get(v, Counter())
            out += [
                *degrees(self.indeg[y - back][v], self.outdeg[y - back][v], self.merged),
                np.log1p(len(nu.keys() & nv.keys())),
                float(v in nu),
                *degrees(self.outdeg[y - back][u], self.indeg[y - back][u], self.merged),
            ]
        earlier = range(y)
        active = [j for j in earlier if self.indeg[j][v] or self.outdeg[j][v]]
        destination = [j for j in earlier if self.indeg[j][v]]
        out += [
            *degrees(
                sum(self.indeg[j][v] for j in earlier),
                sum(self.outdeg[j][v] for j in earlier),
                self.merged,
            ),
            float(max(active, default=-5) - y),
            float(max(destination, default=-20) - y),
            float(sum(self.neighbours[j].get(u, Counter())[v] for j in earlier)),
        ]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/canparl/edges.csv.gz")
    ap.add_argument("--batch", action="store_true", help="add batch-visible statistics")
    ap.add_argument("--merged-roles", action="store_true", help="sum each in- and out-degree pair")
    ap.add_argument("--per-year", type=int, default=800, help="events sampled per year")
    args = ap.parse_args()
    with gzip.open(args.data, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", skiprows=1, usecols=(0, 1, 2))
    src, dst = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)
    year = np.searchsorted(np.unique(rows[:, 2]), rows[:, 2])
    destinations = np.unique(dst)
    years = Years(src, dst, year, args.merged_roles)
    rng = np.random.default_rng(0)

    def sample(ys: range) -> tuple[np.ndarray, np.ndarray]:
        x, label = [], []
        for y in ys:
            idx = np.flatnonzero(year == y)
            for i in rng.choice(idx, min(args.per_year, len(idx)), replace=False).tolist():
                neg = int(destinations[rng.integers(len(destinations))])
                for w in (int(dst[i]), neg):
                    extra = years.so_far(int(src[i]), w, y, i) if args.batch else []
                    x.append(years.features(int(src[i]), w, y) + extra)
                label += [1, 0]
        return np.array(x), np.array(label)

    x_fit, y_fit = sample(range(2, 10))
    held_out = {"years 10-11": sample(range(10, 12)), "years 12-13": sample(range(12, 14))}
    models = {
        "logistic regression": LogisticRegression(max_iter=2000),
        "MLP (64)": MLPClassifier((64,), max_iter=500, random_state=0),
    }
    for name, model in models.items():
        fitted = make_pipeline(StandardScaler(), model).fit(x_fit, y_fit)
        for part, (x, y) in held_out.items():
            p = fitted.predict_proba(x)[:, 1]
            auc, ap_ = roc_auc_score(y, p), average_precision_score(y, p)
            print(f"{name}, {part}: AUC {auc:.3f}, AP {ap_:.3f}")


if __name__ == "__main__":
    main()
