"""``dygserve replay``: accuracy of a running service on a real stream.

Ingests every event before the evaluated part, then walks the evaluated part one
timestamp group at a time: first scores the group's queries (positives and their
negatives) over HTTP, then ingests the group. That is exact visibility: a query at
t sees every event before t and none at t, as in the offline evaluator, so the
served scores can be compared with ``dygserve evaluate --write-scores``.

``--visibility batch`` walks fixed groups of ``--batch-events`` events instead (what
the trainer picks on snapshot streams, and the evaluator replays for such a
checkpoint): a query then sees the earlier groups of its own timestamp. Each query
is placed by the stream row of its positive (the ``event`` column the evaluator
writes), and the groups start at the first evaluated event, as the evaluator's do.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.client import ClientConfig, DygserveClient
from training.data import EdgeStream, chronological_split, read_edge_stream
from training.metrics import DYGLIB_EVAL_BATCH, average_precision, roc_auc


@dataclass
class Query:
    src: str
    dst: str
    t: float
    label: int
    event: int | None = None  # stream row of the positive it belongs to (batch visibility)


def read_queries(path: Path) -> list[Query]:
    """Queries written by the evaluator: columns src, dst, t, label (1 positive, 0 negative)."""
    with open(path, newline="") as fh:
        return [
            Query(
                r["src"],
                r["dst"],
                float(r["t"]),
                int(float(r.get("label", r.get("is_positive", 0)))),
                int(r["event"]) if r.get("event") not in (None, "") else None,
            )
            for r in csv.DictReader(fh)
        ]


def random_queries(stream: EdgeStream, mask: np.ndarray, seed: int) -> list[Query]:
    """Each positive of the evaluated part plus one random destination at the same time."""
    rng = np.random.default_rng(seed)
    dsts = np.unique(stream.dst)
    out = []
    for i in np.flatnonzero(mask):
        t, row = float(stream.t[i]), int(i)
        out.append(Query(stream.src[i], stream.dst[i], t, 1, row))
        out.append(Query(stream.src[i], str(dsts[rng.integers(len(dsts))]), t, 0, row))
    return out


class ServiceClient:
    """The replay's view of the service, on ``service.client.DygserveClient``: events
    go with ids derived from the dataset and row (a rerun against the same store is
    answered as duplicates, not applied twice), cut under the client's limits, retried
    on 503 and dropped connections; scores come back in query order."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        timeout: float = 60.0,
        *,
        client: DygserveClient | None = None,
    ) -> None:
        self.client = client or DygserveClient(
            ClientConfig(url=url, api_key=api_key, timeout_s=timeout)
        )

    def ingest(self, stream: EdgeStream, index: np.ndarray, batch: int) -> None:
        for start in range(0, len(index), batch):
            rows = index[start : start + batch]
            events = [
                {
                    "src": stream.src[i],
                    "dst": stream.dst[i],
                    "t": float(stream.t[i]),
                    "features": stream.features[i].tolist(),
                    "event_id": f"{stream.name}:{i}",
                }
                for i in rows
            ]
            result = self.client.ingest(events)
            if result.rejected:
                raise RuntimeError(f"service rejected events: {result.rejected[:3]}")

    def close(self) -> None:
        self.client.close()

    def reads_newest_neighbours(self) -> bool:
        """Whether the served model reads, for a node, its newest neighbour's record too
        (``latest_transition_at_query``): then a merged run must not cut there either."""
        return bool(self.client.model().config.get("latest_transition_at_query", False))

    def score(self, queries: list[Query]) -> list[float]:
        if not queries:
            return []
        answer = self.client.score_pairs({"src": q.src, "dst": q.dst, "t": q.t} for q in queries)
        return [s.logit for s in answer.scores]


def replay(
    client: ServiceClient,
    stream: EdgeStream,
    start_time: float,
    queries: list[Query],
    batch: int = 1000,
    progress: bool = False,
    visibility: str = "exact",
    batch_events: int = DYGLIB_EVAL_BATCH,
    reads_newest_neighbours: bool | None = None,
) -> list[float]:
    """Ingest events with t <= start_time, then score-then-ingest each later timestamp
    group (exact visibility) or each later group of ``batch_events`` events (batch).

    Consecutive groups are merged into one score call and one ingest call while no
    query of a group involves a node that an earlier group of the run has events for:
    a query reads only its two nodes' states and neighbour lists, so that is exactly
    "score group g, then ingest group g" for each g, with far fewer requests. A model
    that also reads each node's newest neighbour (``reads_newest_neighbours``; None: ask
    the service) involves those too, followed here from the events sent.
    """
    if visibility not in ("exact", "batch"):
        raise ValueError("visibility must be 'exact' or 'batch'")
    if reads_newest_neighbours is None:
        reads_newest_neighbours = client.reads_newest_neighbours()
    newest: dict[str, str] = {}  # each node's newest neighbour among the events sent

    def sent(index: np.ndarray) -> None:
        if reads_newest_neighbours:
            for u, v in zip(stream.src[index].tolist(), stream.dst[index].tolist(), strict=True):
                newest[u], newest[v] = v, u

    first = np.flatnonzero(stream.t <= start_time)
    client.ingest(stream, first, batch)
    sent(first)
    after = np.flatnonzero(stream.t > start_time)
    if visibility == "exact":
        groups = np.split(after, np.flatnonzero(np.diff(stream.t[after])) + 1) if len(after) else []
        group_keys = [float(stream.t[g[0]]) for g in groups]
    else:
        groups = [after[i : i + batch_events] for i in range(0, len(after), batch_events)]
        group_keys = list(range(len(groups)))
    # The queries of each group: by time (exact) or by their positive's row (batch).
    by_group: dict[float | int, list[int]] = {}
    for k, q in enumerate(queries):
        if visibility == "exact":
            by_group.setdefault(q.t, []).append(k)
        elif q.event is None:
            raise ValueError("batch visibility needs each query's event row (the evaluator's CSV)")
        else:
            by_group.setdefault(int(np.searchsorted(after, q.event)) // batch_events, []).append(k)
    logits = [float("nan")] * len(queries)

    run_queries: list[int] = []
    run_events: list[np.ndarray] = []
    touched: set[str] = set()

    def flush() -> None:
        if run_queries:
            for k, logit in zip(
                run_queries, client.score([queries[k] for k in run_queries]), strict=True
            ):
                logits[k] = logit
        if run_events:
            events = np.concatenate(run_events)
            client.ingest(stream, events, batch)
            sent(events)
        run_queries.clear()
        run_events.clear()
        touched.clear()

    from tqdm import tqdm

    for key, group in tqdm(
        zip(group_keys, groups, strict=True), desc="replay", disable=not progress
    ):
        ks = by_group.pop(key, [])
        read = [n for k in ks for n in (queries[k].src, queries[k].dst)]
        if reads_newest_neighbours:
            read += [newest[n] for n in read if n in newest]
        if any(n in touched for n in read):
            flush()
        run_queries.extend(ks)
        run_events.append(group)
        touched.update(stream.src[group])
        touched.update(stream.dst[group])
    flush()
    rest = [k for ks in by_group.values() for k in ks]  # queries with no event of their own
    for k, logit in zip(rest, client.score([queries[k] for k in rest]), strict=True):
        logits[k] = logit
    return logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dygserve replay", description=__doc__)
    p.add_argument("--data", required=True, help="edges.csv.gz or its folder")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--queries",
        type=Path,
        default=None,
        help="queries CSV from `dygserve evaluate --write-scores`",
    )
    p.add_argument("--split", choices=["test", "val"], default="test")
    p.add_argument("--limit", type=int, default=None, help="only the first N events of the file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1000, help="events per ingest request")
    p.add_argument(
        "--visibility",
        choices=("exact", "batch"),
        default="exact",
        help="score-then-ingest per timestamp (exact) or per --batch-events events (batch:"
        " for a checkpoint the trainer trained with batch visibility, a snapshot stream)",
    )
    p.add_argument("--batch-events", type=int, default=DYGLIB_EVAL_BATCH)
    p.add_argument("--write-scores", type=Path, default=None)
    args = p.parse_args(argv)

    stream = read_edge_stream(args.data, limit=args.limit)
    split = chronological_split(stream)
    start = split.test_time if args.split == "test" else split.val_time
    mask = split.test if args.split == "test" else split.val
    queries = (
        read_queries(args.queries) if args.queries else random_queries(stream, mask, args.seed)
    )
    client = ServiceClient(args.url, args.api_key)
    try:
        logits = replay(
            client,
            stream,
            start,
            queries,
            args.batch,
            progress=True,
            visibility=args.visibility,
            batch_events=args.batch_events,
        )
    finally:
        client.close()
    labels = np.array([q.label for q in queries])
    scores = np.array(logits)
    ap, auc = average_precision(labels, scores), roc_auc(labels, scores)
    print(f"replayed {len(queries)} queries: AP {ap:.4f}  AUC {auc:.4f}")
    if args.write_scores:
        with open(args.write_scores, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["src", "dst", "t", "label", "logit"])
            for q, logit in zip(queries, logits, strict=True):
                w.writerow([q.src, q.dst, repr(q.t), q.label, repr(logit)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
