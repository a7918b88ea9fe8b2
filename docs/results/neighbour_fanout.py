"""How many more states would a query read if it also read its endpoints' neighbours?

STG-Mamba fuses a node's state with an aggregate of its neighbours' states. Served at
the query, that reads the states of the endpoints' latest neighbours as well as the
endpoints' own. For each stream this takes every node's last ``--list-len`` neighbours
at the start of DyGLib's test split and draws requests of 1, 100 and 1,000 test events
(each with one random destination as its negative, as the evaluator's queries are),
and prints how many distinct states such a request reads against the endpoints alone
(mean of ``--draws`` draws). Results: docs/results/current-defaults.md, "Levers read
but not built".

    python docs/results/neighbour_fanout.py [--data-root ../shared/data] [--list-len 32]
"""

from __future__ import annotations

import argparse
from collections import deque
from pathlib import Path

import numpy as np

from training.data import chronological_split, read_edge_stream
from training.results import NAMES as STREAMS  # the five streams of docs/RESULTS.md

REQUEST_SIZES = (1, 100, 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    ap.add_argument("--datasets", default=",".join(STREAMS))
    ap.add_argument("--list-len", type=int, default=32)
    ap.add_argument("--draws", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sizes = " | ".join(f"{k:,} pair{'s' if k > 1 else ''}" for k in REQUEST_SIZES)
    print(f"| stream | {sizes} |")
    print("| --- |" + " ---: |" * len(REQUEST_SIZES))
    for name in args.datasets.split(","):
        stream = read_edge_stream(args.data_root / name / "edges.csv.gz")
        test = chronological_split(stream).test
        start = int(np.argmax(test))
        lists: dict[str, deque[str]] = {}
        for a, b in zip(stream.src[:start], stream.dst[:start], strict=True):
            lists.setdefault(a, deque(maxlen=args.list_len)).append(b)
            lists.setdefault(b, deque(maxlen=args.list_len)).append(a)
        destinations = np.unique(stream.dst)
        test_rows = np.flatnonzero(test)
        cells = []
        for size in REQUEST_SIZES:
            ratios = []
            for _ in range(args.draws):
                rows = rng.choice(test_rows, size, replace=False)
                negatives = rng.choice(destinations, size)
                endpoints = set(stream.src[rows]) | set(stream.dst[rows]) | set(negatives)
                with_neighbours = set(endpoints)
                for node in endpoints:
                    with_neighbours.update(lists.get(node, ()))
                ratios.append(len(with_neighbours) / len(endpoints))
            cells.append(f"{np.mean(ratios):.1f}x")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
