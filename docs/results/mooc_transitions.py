"""How much of MOOC is "which item follows the student's last one"? A causal heuristic.

Walks MOOC in time order and keeps item-to-item transition counts of each student's
consecutive items, learned online from every event strictly before the query (no
model, no training split). Each sampled validation/test event is scored against one
random item (DyGLib's random negatives on a bipartite graph) by

* order 1: P(v | the student's last item), add-0.1 smoothed;
* order 1 + 2: the same plus 3 x P(v | the last two items);
* order 1, frozen: P(v | the student's last item) from the counts of every event before
  the validation split (what a table fitted offline can know at best), and the same
  with no row or column for the nodes DyGLib holds out of training for the inductive
  setting (``training.data.chronological_split``'s new nodes: 18 of MOOC's 97 items),
  which is what a trainer may fit;
* two hops through cached lists: the share of the last item's latest 128 visitors that
  are also among v's latest 128 (what a query-time read of a third node's cached
  neighbour list, the last item's, could give; no global table).

and the AP of positives over negatives is printed. This is the analysis behind the
identity match (``ModelConfig.identity_match_dim``), see mooc-experiments.md.

    python docs/results/mooc_transitions.py [--data ../shared/data/mooc/edges.csv.gz]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from training.data import EdgeStream, chronological_split, read_edge_stream


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    order = np.argsort(-np.r_[pos, neg], kind="stable")
    hits = y[order]
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


def online_walk(
    stream: EdgeStream,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float, np.ndarray]:
    """MOOC in time order for an online walk: sources, destinations, times, the start
    of validation and of test (DyGLib's chronological split) and the item ids."""
    src, dst, ts = stream.src.astype(np.int64), stream.dst.astype(np.int64), stream.t
    q70, q85 = np.quantile(ts, [0.70, 0.85])
    return src, dst, ts, float(q70), float(q85), np.unique(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/mooc/edges.csv.gz")
    ap.add_argument(
        "--every", type=int, default=3, help="score every k-th event of validation and test"
    )
    args = ap.parse_args()
    stream = read_edge_stream(args.data)  # (its new nodes: the held-out items below)
    src, dst, ts, q70, q85, items = online_walk(stream)
    rng = np.random.default_rng(0)
    first: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    second: dict[tuple[int, int], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    visitors: dict[int, collections.deque] = collections.defaultdict(
        lambda: collections.deque(maxlen=128)
    )
    last: dict[int, int] = {}
    before_last: dict[int, int] = {}
    scores: dict[str, list[list[float]]] = {
        "validation": [[] for _ in range(10)],
        "test": [[] for _ in range(10)],
    }
    frozen: dict[int, collections.Counter] | None = None
    held_out = {int(n) for n in chronological_split(stream).new_nodes}
    known: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)

    def p(counts: collections.Counter, v: int) -> float:
        return (counts[v] + 0.1) / (sum(counts.values()) + 1.0)

    for i in range(len(src)):
        u, v, t = int(src[i]), int(dst[i]), ts[i]
        part = "validation" if q70 <= t < q85 else "test" if t >= q85 else None
        if part and frozen is None:  # the training split ends: keep its counts
            frozen = {k: collections.Counter(c) for k, c in first.items()}
        if part and i % args.every == 0 and u in last:
            neg = int(rng.choice(items))
            c1, c2 = first[last[u]], second[(before_last.get(u, -1), last[u])]
            s = scores[part]
            s[0].append(p(c1, v))
            s[1].append(p(c1, neg))
            s[2].append(p(c1, v) + 3 * p(c2, v))
            s[3].append(p(c1, neg) + 3 * p(c2, neg))
            via = set(visitors[last[u]])
            s[4].append(len(via & set(visitors[v])) / (1 + len(via)))
            s[5].append(len(via & set(visitors[neg])) / (1 + len(via)))
            assert frozen is not None
            c0 = frozen.get(last[u], collections.Counter())
            s[6].append(p(c0, v))
            s[7].append(p(c0, neg))
            ck = known.get(last[u], collections.Counter())
            s[8].append(p(ck, v))
            s[9].append(p(ck, neg))
        if u in last:  # learn only after scoring: a query never sees its own event
            first[last[u]][v] += 1
            if not part and last[u] not in held_out and v not in held_out:
                known[last[u]][v] += 1
            if u in before_last:
                second[(before_last[u], last[u])][v] += 1
            before_last[u] = last[u]
        last[u] = v
        visitors[v].append(u)
    for part, s in scores.items():
        a1 = average_precision(np.array(s[0]), np.array(s[1]))
        a12 = average_precision(np.array(s[2]), np.array(s[3]))
        hops = average_precision(np.array(s[4]), np.array(s[5]))
        a0 = average_precision(np.array(s[6]), np.array(s[7]))
        ak = average_precision(np.array(s[8]), np.array(s[9]))
        print(
            f"{part}: order 1 AP {a1:.4f}, order 1 + 2 AP {a12:.4f}, "
            f"order 1 frozen before validation AP {a0:.4f} "
            f"(without held-out nodes {ak:.4f}), "
            f"two hops through lists AP {hops:.4f} ({len(s[0])} positives)"
        )


if __name__ == "__main__":
    main()
