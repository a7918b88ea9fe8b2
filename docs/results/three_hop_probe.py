"""Would walks of three hops add to a trained link model? A probe on the model's logit.

TPNet's second-order walk projections and STG-Mamba's fusion of a node's state with
its neighbours' states both give the head what u's partners' partners are: walks
u - w - x - v of three hops, which no per-node record of u or v holds (the head's
common-neighbour mass counts the walks of two hops, u - w - v). Both read another
node's state (issue 17), so before building either this asks how much such walks add
to the model we have, where ``walk_projections.py`` asked it of a probe with list
features only.

A checkpoint's streaming replay scores the validation and test events against one
random destination each and one historical one (the evaluator's own queries and
visibility). Beside each query this walks the stream in time order and keeps every
node's last L neighbours from the events strictly before the query's time (a
timestamp's queries before its events), then counts, for the query (u, v):

* walks of two hops inside the lists: entries w of u's list that are in v's list,
  with multiplicity (about what the head reads already: a control);
* walks of three hops inside the lists: for each entry w of u's list and each entry x
  of w's list, whether x is in v's list, and the same from v's side; their sum. Walks
  through the pair's own meeting (w = v, x = u) are left out: that is the repeat signal
  the head already has, which costs historical AP when weighted up
  (``pair_count_probe.py``).

Each enters as log(1 + count); a logistic regression on [the model's logit, the
counts] is fitted on the validation queries with random negatives, and its global test
AP with random and with historical negatives printed next to the model's own. Results:
docs/results/current-defaults.md, "Levers read but not built".

    python docs/results/three_hop_probe.py --checkpoint checkpoints/default \\
        --data ../shared/data/uci [--list-len 32]
"""

from __future__ import annotations

import numpy as np
from logit_probe import (
    StackedProbe,
    checkpoint_parser,
    replayed_queries,
)  # its neighbour in docs/results

EMPTY = -1


def walk_counts(lists: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(two-hop, three-hop) walk counts inside the lists for the pairs (u, v)."""
    lu, lv = lists[u], lists[v]  # (Q, L)
    valid_u, valid_v = lu != EMPTY, lv != EMPTY

    def hits(entries: np.ndarray, valid: np.ndarray, target: np.ndarray) -> np.ndarray:
        # entries (Q, K) against each query's target list (Q, L): how many are in it
        same = (entries[:, :, None] == target[:, None, :]) & (target[:, None, :] != EMPTY)
        return (same.any(axis=2) & valid).sum(axis=1)

    two = hits(lu, valid_u, lv)
    # x ranges over the lists of u's entries w (Q, L * L); a padded entry, and w = v
    # itself (a walk through the pair's own meeting, which is the repeat signal the
    # head has), read the all-empty row kept at the end; x = u is left out likewise
    blank = len(lists) - 1
    through_u = lists[np.where(valid_u & (lu != v[:, None]), lu, blank)].reshape(len(u), -1)
    through_v = lists[np.where(valid_v & (lv != u[:, None]), lv, blank)].reshape(len(v), -1)
    three = hits(through_u, (through_u != EMPTY) & (through_u != u[:, None]), lv) + hits(
        through_v, (through_v != EMPTY) & (through_v != v[:, None]), lu
    )
    return np.stack([two, three], axis=1)


def main() -> None:
    ap = checkpoint_parser(__doc__)
    ap.add_argument("--list-len", type=int, default=32)
    args = ap.parse_args()
    data, _, q = replayed_queries(args.checkpoint, args.data)

    n, length = data.num_nodes, args.list_len
    # every node's last ``length`` neighbours, oldest first; row n stays empty
    lists = np.full((n + 1, length), EMPTY, dtype=np.int64)
    counts = np.zeros((len(q), 2))
    order = np.argsort(q.t, kind="stable")
    qt = q.t[order]
    e, i = 0, 0
    for time_now in np.unique(qt):
        while e < len(data.t) and data.t[e] < time_now:
            s, d = int(data.src[e]), int(data.dst[e])
            for a, other in ((s, d), (d, s)) if s != d else ((s, d),):
                lists[a, :-1] = lists[a, 1:]
                lists[a, -1] = other
            e += 1
        j = i
        while j < len(qt) and qt[j] == time_now:
            j += 1
        rows, i = order[i:j], j
        counts[rows] = walk_counts(lists, q.src[rows].astype(int), q.dst[rows].astype(int))
    feats = np.log1p(counts)
    probe = StackedProbe(q)

    pos = (q.kind == "pos") & (q.split == "test")
    print(f"{args.data}: lists of {length}; test positives with a three-hop walk:")
    print(
        f"  {100 * (counts[pos, 1] > 0).mean():.1f}% (two-hop: {100 * (counts[pos, 0] > 0).mean():.1f}%)"
    )
    print("test AP (global), random / historical negatives")
    print(f"  the model alone: {probe.aps(q.logit)}")
    print(f"  + two-hop walks (the control): {probe.stacked(feats[:, [0]])}")
    print(f"  + three-hop walks: {probe.stacked(feats[:, [1]])}")
    print(f"  + both: {probe.stacked(feats)}")


if __name__ == "__main__":
    main()
