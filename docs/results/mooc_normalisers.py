"""What is left on MOOC beyond the transition counts? A linear model over causal counts.

The transition counts (``ModelConfig.transition_buckets``) give the head, for a query
(u, v), v's column of the online "which item follows which" table at u's latest three
items: raw counts, plus v's total. The no-model heuristic of ``mooc_transitions.py``
ranks by P(v | u's last item), a count *divided by its row sum*: how often anything
followed u's last item. That row sum belongs to a third node (u's last item), which
no record of u or v holds. How much do such normalisers add?

Walks MOOC in time order, learning every count online from the events strictly
before each query. Every third validation and test event is scored against one random
item (DyGLib's random negatives on a bipartite graph), with per (u, x) features:

* what the model has: for each of u's latest three items l, log1p T[l, x] and a
  present flag; log1p of x's in-transition total and degree; whether u met x before;
  log1p of u's degree;
* the normalisers: log1p of each latest item's row sum (out-transitions), or of its
  degree, or the smoothed ratio P(x | l);
* second order: log1p T2[(l2, l1), x] (which item follows u's last two), and the row
  sum of (l2, l1);
* decay: x's column of the table with every entry decayed by exp(-age / tau), age the
  time since it was counted (what x's record would hold if it decayed), at u's latest
  three items, and its decayed total, for tau of one and six hours, one and four days,
  alone and two together;
* TPNet's walk projections (``walk_projections.py``; added 2026-11-27): per node the
  decayed sums s1 (its neighbours' fixed random vectors) and s2 (its neighbours' s1 as
  of each event), d = 128, decayed over a twentieth of the span as the trainer's rule
  decays the counts, and the pair's eight inner products between r, s1 and s2 of u
  and x: on a student-item stream <s2_u, s1_x> counts, decayed, the students who
  visited one of u's items before u did and then visited x, the co-visitation signal
  that the transition counts (which item follows which) only see in sequence;
* the order 2 count as the model's record holds it (added 2026-11-27): x's second
  record hashes the pairs into B buckets (``pair_keys`` of the node keys, then
  ``bucket_of``), so a query reads the sum over every pair that shares the bucket of
  u's latest pair. For B of 256 (the record today), 512, 1024 and 4096: how much do
  the collisions cost against the exact count?
* the pair's row sum as a *third node* holds it: T[l2, l1], how often anyone went from
  u's second-latest item l2 to its latest l1, which is l1's own transition record at
  l2 (what the order 2 row sum nearly is: it also counts the visitors of l1 that have
  not moved on yet), read at the query; and the same count as it stood when u made
  its event with l1 (a value the writer could copy into u's state from its
  counterpart's record before the event).

A logistic regression (``--mlp``: a small MLP on standardised features) is fitted on
the validation queries and its test AP printed per feature set (AP of positives over negatives, as
``mooc_transitions.py``).

    python docs/results/mooc_normalisers.py [--data ../shared/data/mooc/edges.csv.gz] [--mlp]
        [--only TEXT]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
from mooc_transitions import average_precision, online_walk  # its neighbour in docs/results
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from walk_projections import Projections  # likewise

from model.node_ids import node_key
from model.transition_counts import bucket_of, pair_keys
from training.data import read_edge_stream

DEPTH = 3  # u's latest items read, as the model's TRANSITION_DEPTH
PER_ITEM = ("count", "row sum", "degree", "ratio", "present")
DAY = 86_400.0
# decay constants of the decayed columns (1 and 6 hours added on 2026-11-27: is a
# shorter one, or two together, worth more than the one day the trainer's rule gives?)
TAUS = {"1 hour": DAY / 24, "6 hours": DAY / 4, "1 day": DAY, "4 days": 4 * DAY}
FEATURES = (
    [f"{name} {k}" for k in range(DEPTH) for name in PER_ITEM]
    + ["x total", "x degree", "met before", "u degree", "order 2 count", "order 2 row sum"]
    + [f"decayed {tau} {k}" for tau in TAUS for k in [*range(DEPTH), "total"]]
    + [f"projection {k}" for k in range(8)]
)
PROJECTION_DIM = 128
HASHED_BUCKETS = (256, 512, 1024, 4096)  # the order 2 record's sizes compared
FIRST_EXTRA = len(FEATURES)  # "all" stays the set it was before the columns below
FEATURES += [f"order 2 hashed {b}" for b in HASHED_BUCKETS]
FEATURES += ["latest item's count of the one before", "the same when u met it"]


class DecayedColumns:
    """Each item's column of the transition table, decayed by exp(-age / tau): scaled
    down to the item's latest update, then read at the query time."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.column: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.total: collections.Counter = collections.Counter()
        self.at: dict[int, float] = {}

    def add(self, x: int, previous: int, t: float) -> None:
        if x in self.at:
            keep = np.exp(-(t - self.at[x]) / self.tau)
            column = self.column[x]
            for key in column:
                column[key] *= keep
            self.total[x] *= keep
        self.column[x][previous] += 1.0
        self.total[x] += 1.0
        self.at[x] = t

    def read(self, x: int, latest: list[int], t: float) -> list[float]:
        keep = float(np.exp(-(t - self.at[x]) / self.tau)) if x in self.at else 0.0
        got = [
            self.column[x][item] * keep if k < len(latest) else 0.0 for k, item in enumerate(latest)
        ]
        got += [0.0] * (DEPTH - len(got)) + [self.total[x] * keep]
        return [float(np.log1p(g)) for g in got]


def features(
    u_items: list[int],
    x: int,
    first: dict[int, collections.Counter],
    second: dict[tuple[int, ...], collections.Counter],
    row: collections.Counter,
    col: collections.Counter,
    deg: collections.Counter,
    decayed: list[DecayedColumns],
    t: float,
    walks: list[float],
    hashed: list[float],
    third: list[float],
) -> list[float]:
    latest = u_items[-DEPTH:][::-1]
    f: list[float] = []
    for k in range(DEPTH):
        if k < len(latest):
            item = latest[k]
            c = first[item][x]
            f += [
                np.log1p(c),
                np.log1p(row[item]),
                np.log1p(deg[item]),
                (c + 0.1) / (row[item] + 1),
            ]
            f += [1.0]
        else:
            f += [0.0] * len(PER_ITEM)
    pair = tuple(u_items[-2:])
    f += [np.log1p(col[x]), np.log1p(deg[x]), float(x in u_items), np.log1p(len(u_items))]
    f += [np.log1p(second[pair][x]), np.log1p(sum(second[pair].values())) if len(pair) == 2 else 0]
    for columns in decayed:
        f += columns.read(x, latest, t)
    return f + walks + hashed + third


class HashedPairs:
    """Each item's second record as the model keeps it: counts of the pairs (p2, p1)
    its visitors came from, hashed into ``buckets`` (``pair_keys``, ``bucket_of``)."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self.column: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def bucket(self, pair: tuple[int, ...]) -> int:
        keys = [node_key(str(n)) for n in pair]
        return int(bucket_of(pair_keys(np.array([keys[0]]), np.array([keys[1]])), self.buckets)[0])

    def add(self, x: int, pair: tuple[int, ...]) -> None:
        self.column[x][self.bucket(pair)] += 1

    def read(self, x: int, pair: tuple[int, ...]) -> float:
        return float(np.log1p(self.column[x][self.bucket(pair)])) if len(pair) == 2 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/mooc/edges.csv.gz")
    ap.add_argument("--mlp", action="store_true", help="a small MLP (64) instead of the regression")
    ap.add_argument(
        "--only", default="", help="fit only the feature sets whose name holds this text"
    )
    args = ap.parse_args()
    src, dst, ts, q70, q85, items = online_walk(read_edge_stream(args.data))
    rng = np.random.default_rng(0)
    first: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    second: dict[tuple[int, ...], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    row: collections.Counter = collections.Counter()
    col: collections.Counter = collections.Counter()
    deg: collections.Counter = collections.Counter()
    decayed = [DecayedColumns(tau) for tau in TAUS.values()]
    items_of: dict[int, list[int]] = collections.defaultdict(list)
    # (their own generator: the negatives stay those of the earlier rows)
    r = np.random.default_rng(1).normal(
        0.0, 1.0 / np.sqrt(PROJECTION_DIM), (int(max(src.max(), dst.max())) + 1, PROJECTION_DIM)
    )
    walks = Projections(r, float(ts[-1] - ts[0]) / 20)
    hashed = [HashedPairs(b) for b in HASHED_BUCKETS]
    met_count: dict[int, float] = {}  # per student: T[l2, l1] when it met its latest l1
    rows: dict[str, tuple[list[list[float]], list[int]]] = {"val": ([], []), "test": ([], [])}
    for i in range(len(src)):
        u, v, t = int(src[i]), int(dst[i]), ts[i]
        part = "val" if q70 <= t < q85 else "test" if t >= q85 else None
        if part and i % 3 == 0:
            for label, x in ((1, v), (0, int(rng.choice(items)))):
                rows[part][0].append(
                    features(
                        items_of[u],
                        x,
                        first,
                        second,
                        row,
                        col,
                        deg,
                        decayed,
                        t,
                        walks.pair(u, x, t),
                        [h.read(x, tuple(items_of[u][-2:])) for h in hashed],
                        [
                            np.log1p(first[items_of[u][-2]][items_of[u][-1]])
                            if len(items_of[u]) >= 2
                            else 0.0,
                            np.log1p(met_count.get(u, 0.0)),
                        ],
                    )
                )
                rows[part][1].append(label)
        seen = items_of[u]  # learn only after scoring: a query never sees its own event
        met_count[u] = float(first[seen[-1]][v]) if seen else 0.0  # (before this event's)
        if seen:
            first[seen[-1]][v] += 1
            row[seen[-1]] += 1
            col[v] += 1
            for columns in decayed:
                columns.add(v, seen[-1], t)
            if len(seen) >= 2:
                second[tuple(seen[-2:])][v] += 1
                for h in hashed:
                    h.add(v, tuple(seen[-2:]))
        seen.append(v)
        walks.add(u, v, t)
        deg[u] += 1
        deg[v] += 1
    xv, yv = np.array(rows["val"][0]), np.array(rows["val"][1])
    xt, yt = np.array(rows["test"][0]), np.array(rows["test"][1])

    def columns(*names: str) -> list[int]:
        return [i for i, f in enumerate(FEATURES) if f.rsplit(" ", 1)[0] in names or f in names]

    def decayed_columns(*taus: str) -> list[int]:
        return [i for i, f in enumerate(FEATURES) if any(f"decayed {tau} " in f for tau in taus)]

    base = columns("count", "present", "x total", "x degree", "met before", "u degree")
    sets = {
        "raw counts and totals (what the head has)": base,
        "+ row sums of u's latest items": base + columns("row sum"),
        "+ degrees of u's latest items": base + columns("degree"),
        "+ P(x | item), normalised": base + columns("ratio"),
        "+ order 2 count": base + columns("order 2 count"),
        "+ order 2 count and its row sum": base + columns("order 2 count", "order 2 row sum"),
        "+ degrees and order 2 count": base + columns("degree", "order 2 count"),
        "+ decayed, 1 day": base + decayed_columns("1 day"),
        "+ decayed, 4 days": base + decayed_columns("4 days"),
        "+ decayed, 6 hours": base + decayed_columns("6 hours"),
        "+ decayed, 1 hour": base + decayed_columns("1 hour"),
        "+ decayed, 6 hours and 1 day": base + decayed_columns("6 hours", "1 day"),
        "+ decayed, 1 hour and 1 day": base + decayed_columns("1 hour", "1 day"),
        "+ degrees, order 2 count and decayed, 1 day": base
        + columns("degree", "order 2 count")
        + decayed_columns("1 day"),
        "+ decayed, 1 day, and order 2 count": base
        + decayed_columns("1 day")
        + columns("order 2 count"),
        **{
            f"+ decayed, 1 day, and order 2 count hashed into {b}": base
            + decayed_columns("1 day")
            + columns(f"order 2 hashed {b}")
            for b in HASHED_BUCKETS
        },
        "+ decayed, 1 day, order 2 count and its row sum": base
        + decayed_columns("1 day")
        + columns("order 2 count", "order 2 row sum"),
        "+ decayed, 1 day, order 2 count and T[l2, l1] at the query": base
        + decayed_columns("1 day")
        + columns("order 2 count", "latest item's count of the one before"),
        "+ decayed, 1 day, order 2 count and T[l2, l1] when u met l1": base
        + decayed_columns("1 day")
        + columns("order 2 count", "the same when u met it"),
        **{
            f"+ decayed, 1 day, order 2 hashed into {b} and T[l2, l1] {when}": base
            + decayed_columns("1 day")
            + columns(f"order 2 hashed {b}", column)
            for b in HASHED_BUCKETS
            for when, column in (
                ("at the query", "latest item's count of the one before"),
                ("when u met l1", "the same when u met it"),
            )
        },
        "+ decayed, 1 day, order 2 count and every row sum": base
        + decayed_columns("1 day")
        + columns("row sum", "order 2 count", "order 2 row sum"),
        "+ walk projections": base + columns("projection"),
        "+ decayed, 1 day, and walk projections": base
        + decayed_columns("1 day")
        + columns("projection"),
        "all but the walk projections": [
            i
            for i, f in enumerate(FEATURES)
            if not f.startswith("projection") and f in FEATURES[:FIRST_EXTRA]
        ],
        "all": list(range(FIRST_EXTRA)),
    }
    print(f"| features ({len(yt) // 2} test positives) | test AP |\n| --- | ---: |")
    for name, cols in sets.items():
        if args.only not in name:
            continue
        # (the regression on the raw features, as in the rows written before the MLP)
        model = (
            make_pipeline(StandardScaler(), MLPClassifier((64,), max_iter=300, random_state=0))
            if args.mlp
            else LogisticRegression(max_iter=2000)
        )
        p = model.fit(xv[:, cols], yv).predict_proba(xt[:, cols])[:, 1]
        print(f"| {name} | {100 * average_precision(p[yt == 1], p[yt == 0]):.2f} |")


if __name__ == "__main__":
    main()
