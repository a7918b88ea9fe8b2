"""How many test events could a better start for a new node move? A count, no model.

Graph Mamba's lever (issue 17, "GMN") initialises a node with no history from its
first neighbours' states instead of the zero state. That can only change the scores of
queries whose endpoint has little or no history: a node's very first event is scored
before any of its neighbours is known, so no initialisation reaches that query, and the
next few queries are the ones a better start would move. This walks each stream in
time order and, for DyGLib's test split, prints the share of positive events whose
source or destination had no earlier event, and whose endpoints had fewer than 3 (either
one). With ``--checkpoint``, the model's own test queries against random destinations
(the evaluator's replay and visibility) are split the same way: each group's share of
the misranked (positive, negative) pairs, which bounds what a better start could add to
random-negative AP (a node's first event is scored before any start could be set). Results: docs/results/current-defaults.md, "Levers read but not
built".

    python docs/results/cold_endpoints.py [--data-root ../shared/data] [--datasets uci,...]
    python docs/results/cold_endpoints.py --datasets wikipedia --checkpoint C
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from logit_probe import replayed_queries  # its neighbour in docs/results

from training.data import chronological_split, read_edge_stream
from training.results import NAMES as STREAMS  # the five streams of docs/RESULTS.md

FEW = 3  # "little history": fewer than this many earlier events


def prior_event_counts(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each event, how many earlier events each endpoint had (a self-loop counts once)."""
    seen: dict[object, int] = {}
    before_src = np.empty(len(src), dtype=np.int64)
    before_dst = np.empty(len(dst), dtype=np.int64)
    for i, (a, b) in enumerate(zip(src, dst, strict=True)):
        before_src[i], before_dst[i] = seen.get(a, 0), seen.get(b, 0)
        seen[a] = before_src[i] + 1
        if b != a:
            seen[b] = before_dst[i] + 1
    return before_src, before_dst


def misranked_shares(checkpoint: Path, data_path: Path) -> None:
    """Each group's share of the test (positive, random negative) pairs ranked wrongly."""
    data, _, q = replayed_queries(checkpoint, data_path, ("test",), ("random",))
    before_src, before_dst = prior_event_counts(data.src, data.dst)
    pos, neg = q.kind == "pos", q.kind == "random"
    negatives = np.sort(q.logit[neg])
    # per positive: negatives above it, ties counted half (AUC's convention)
    at_or_below = np.searchsorted(negatives, q.logit[pos], side="right")
    below = np.searchsorted(negatives, q.logit[pos], side="left")
    wrong = (len(negatives) - at_or_below) + 0.5 * (at_or_below - below)
    history = np.minimum(before_src, before_dst)[q.event[pos]]
    total = wrong.sum()
    auc = 1.0 - total / (len(negatives) * pos.sum())
    print(f"\n{checkpoint}: test AUC against random destinations {auc:.4f}")
    print("| positives | share of positives | share of misranked pairs |")
    print("| --- | ---: | ---: |")
    groups = {
        "an endpoint with no earlier event": history == 0,
        f"an endpoint with 1 to {FEW - 1}": (history > 0) & (history < FEW),
        f"both with {FEW} or more": history >= FEW,
    }
    for label, rows in groups.items():
        print(f"| {label} | {rows.mean():.2%} | {wrong[rows].sum() / total:.2%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    ap.add_argument("--datasets", default=",".join(STREAMS))
    ap.add_argument("--checkpoint", type=Path, help="a model of the (one) dataset named")
    args = ap.parse_args()
    print(f"| stream | test events | source new | destination new | an endpoint with < {FEW} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in args.datasets.split(","):
        stream = read_edge_stream(args.data_root / name / "edges.csv.gz")
        test = chronological_split(stream).test
        before_src, before_dst = prior_event_counts(stream.src, stream.dst)
        src_new = (before_src[test] == 0).mean()
        dst_new = (before_dst[test] == 0).mean()
        few = (np.minimum(before_src, before_dst)[test] < FEW).mean()
        print(f"| {name} | {int(test.sum()):,} | {src_new:.2%} | {dst_new:.2%} | {few:.2%} |")
    if args.checkpoint is not None:
        (name,) = args.datasets.split(",")
        misranked_shares(args.checkpoint, args.data_root / name)


if __name__ == "__main__":
    main()
