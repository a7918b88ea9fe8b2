"""Would TPNet's walk projections add to what our head reads? A linear probe, no model.

TPNet (NeurIPS 2024) keeps per node a random projection of its row of a time-decayed
temporal walk matrix: s1_u, the decayed sum of its neighbours' fixed random vectors
r_w (first order: reads no other node's state), and s2_u, the decayed sum of its
neighbours' s1 *as of before each event* (second order: reads the counterpart's
state, a departure from DESIGN's invariants). Inner products of the two endpoints'
vectors then count walks between them: <s1_u, r_v> the (decayed) events of u with v,
<s1_u, s1_v> common neighbours, <s2_u, s1_v> and <s1_u, s2_v> walks of three hops.

This walks a stream in time order, learning everything from the events strictly before
each query's time (a timestamp's queries are scored before its events count: exact
visibility), and scores every ``--every``-th validation and test event against one
random destination (DyGLib's random negatives: any node that is ever a destination).
Per feature set a logistic regression is fitted on the validation queries and its test
AP printed:

* list features (about what the head reads from the 32-entry neighbour lists): how
  often v is among u's last 32 neighbours and u among v's, their common-neighbour mass,
  whether they met within the lists, each endpoint's event count;
* + full-history first order: the same counts over every earlier event (exact);
* + first-order projections, and + second-order projections, each with no decay and
  with a decay time of ``--tau`` (default: a twentieth of the stream's span).

Projections enter as sign(x) log(1 + |x|), as TPNet scales them. ``--mlp`` fits a
small MLP instead of the regression (a probe closer to a head). Results:
docs/results/current-defaults.md, "TPNet's walk projections, probed before building".

    python docs/results/walk_projections.py [--data ../shared/data/uci] [--every 1] [--dim 128] [--mlp]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
from mooc_transitions import average_precision  # its neighbour in docs/results
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from training.data import read_edge_stream

LIST = 32  # the default neighbour-list length


class Projections:
    """s1 and s2 of every node, decayed with time constant ``tau`` (inf: none)."""

    def __init__(self, r: np.ndarray, tau: float) -> None:
        n, d = r.shape
        self.r, self.tau = r, tau
        self.s1, self.s2 = np.zeros((n, d)), np.zeros((n, d))
        self.at = np.zeros(n)

    def _keep(self, node: int, t: float) -> float:
        return 1.0 if np.isinf(self.tau) else float(np.exp(-(t - self.at[node]) / self.tau))

    def at_time(self, node: int, t: float) -> tuple[np.ndarray, np.ndarray]:
        keep = self._keep(node, t)
        return self.s1[node] * keep, self.s2[node] * keep

    def add(self, u: int, v: int, t: float) -> None:
        """Event (u, v) at t: each endpoint adds the other's r and (before the event) s1."""
        (s1u, s2u), (s1v, s2v) = self.at_time(u, t), self.at_time(v, t)
        self.s1[u], self.s2[u] = s1u + self.r[v], s2u + s1v
        self.s1[v], self.s2[v] = s1v + self.r[u], s2v + s1u
        self.at[u] = self.at[v] = t

    def pair(self, u: int, v: int, t: float) -> list[float]:
        (s1u, s2u), (s1v, s2v) = self.at_time(u, t), self.at_time(v, t)
        ru, rv = self.r[u], self.r[v]
        first = [s1u @ rv, s1v @ ru, s1u @ s1v]
        second = [s2u @ rv, s2v @ ru, s2u @ s1v, s1u @ s2v, s2u @ s2v]
        return [float(np.sign(x) * np.log1p(abs(x))) for x in first + second]


def list_features(
    lu: collections.deque, lv: collections.deque, u: int, v: int, nu: int, nv: int
) -> list[float]:
    cu, cv = collections.Counter(lu), collections.Counter(lv)
    common = sum(min(c, cv[w]) for w, c in cu.items())
    return [
        np.log1p(cu[v]),
        np.log1p(cv[u]),
        np.log1p(common),
        float(cu[v] > 0 or cv[u] > 0),
        np.log1p(nu),
        np.log1p(nv),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/uci")
    ap.add_argument("--every", type=int, default=1, help="score every k-th val/test event")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--tau", type=float, default=None, help="decay time (default: span / 20)")
    ap.add_argument("--mlp", action="store_true", help="an MLP (64) instead of the regression")
    args = ap.parse_args()
    stream = read_edge_stream(args.data, with_features=False)
    ids = {n: i for i, n in enumerate(dict.fromkeys([*stream.src, *stream.dst]))}
    src = np.array([ids[n] for n in stream.src])
    dst = np.array([ids[n] for n in stream.dst])
    ts = stream.t
    q70, q85 = np.quantile(ts, [0.70, 0.85])
    tau = args.tau or float(ts[-1] - ts[0]) / 20
    rng = np.random.default_rng(0)
    r = rng.normal(0.0, 1.0 / np.sqrt(args.dim), (len(ids), args.dim))
    projections = {"no decay": Projections(r, np.inf), "decayed": Projections(r, tau)}
    destinations = np.unique(dst)
    lists: dict[int, collections.deque] = collections.defaultdict(
        lambda: collections.deque(maxlen=LIST)
    )
    met: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    seen: dict[int, set] = collections.defaultdict(set)
    events = np.zeros(len(ids), dtype=np.int64)
    rows: dict[str, tuple[list[list[float]], list[int]]] = {"val": ([], []), "test": ([], [])}
    start = 0
    while start < len(ts):  # one timestamp at a time: its queries, then its events
        stop = int(np.searchsorted(ts, ts[start], side="right"))
        t = float(ts[start])
        part = "val" if q70 <= t < q85 else "test" if t >= q85 else None
        for i in range(start, stop):
            if part is None or i % args.every:
                continue
            u = int(src[i])
            for label, x in ((1, int(dst[i])), (0, int(rng.choice(destinations)))):
                f = list_features(lists[u], lists[x], u, x, events[u], events[x])
                f += [np.log1p(met[u][x]), np.log1p(met[x][u]), np.log1p(len(seen[u] & seen[x]))]
                for p in projections.values():
                    f += p.pair(u, x, t)
                rows[part][0].append(f)
                rows[part][1].append(label)
        for i in range(start, stop):
            u, v = int(src[i]), int(dst[i])
            lists[u].append(v)
            lists[v].append(u)
            met[u][v] += 1
            met[v][u] += 1
            seen[u].add(v)
            seen[v].add(u)
            events[u] += 1
            events[v] += 1
            for p in projections.values():
                p.add(u, v, t)
        start = stop
    xv, yv = np.array(rows["val"][0]), np.array(rows["val"][1])
    xt, yt = np.array(rows["test"][0]), np.array(rows["test"][1])
    lst, full = list(range(6)), list(range(6, 9))
    first = {name: [9 + 8 * k + j for j in range(3)] for k, name in enumerate(projections)}
    second = {name: [9 + 8 * k + j for j in range(3, 8)] for k, name in enumerate(projections)}
    sets = {
        "list features (about what the head reads)": lst,
        "+ full-history first order (exact counts)": lst + full,
        "+ first-order projections, no decay": lst + first["no decay"],
        "+ first-order projections, decayed": lst + first["decayed"],
        "+ first and second order, no decay": lst + first["no decay"] + second["no decay"],
        "+ first and second order, decayed": lst + first["decayed"] + second["decayed"],
        "all": list(range(xv.shape[1])),
    }
    print(
        f"{stream.name}: {len(yt) // 2} test positives, decay time {tau:g}, d = {args.dim}\n"
        "| features | test AP |\n| --- | ---: |"
    )
    for name, cols in sets.items():
        probe = (
            MLPClassifier((64,), max_iter=300, early_stopping=True, random_state=0)
            if args.mlp
            else LogisticRegression(max_iter=3000)
        )
        model = make_pipeline(StandardScaler(), probe)
        p = model.fit(xv[:, cols], yv).predict_proba(xt[:, cols])[:, 1]
        print(f"| {name} | {100 * average_precision(p[yt == 1], p[yt == 0]):.2f} |", flush=True)


if __name__ == "__main__":
    main()
