"""The streaming replay behind every evaluation: TGB's "score, then update" with
exact visibility, over per-node states and recent-neighbour lists.

``StreamReplay`` holds the states; ``build_queries`` makes the DyGLib queries
(positives and their random / historical / inductive negatives, MRR negatives);
``replay`` scores each timestamp group's queries with ``streaming.score`` and then
ingests the group with ``streaming.advance`` -- the two functions the HTTP service
runs; ``summarise`` turns the scored queries into DyGLib's batched AP/AUC and MRR.
The evaluator (``training.evaluate``) and the baselines (``training.baselines``)
are built on it.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.events import NodeEvent, endpoint_events, pad_events
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.pair_features import PAD_KEY
from model.role_counts import advance_records, empty_records
from model.streaming import NeighbourLists, advance, score
from model.transition_counts import (
    DenseTransitions,
    add_transitions,
    counterpart_previous,
    counterpart_previous_two,
    empty_counts,
    latest_transition_at_query,
    latest_transition_counts,
    pair_keys,
)

from .batches import IndexedStream
from .data import ChronologicalSplit
from .metrics import DYGLIB_EVAL_BATCH, batched, mrr
from .negatives import STRATEGIES, EvalNegativeSampler, mrr_negatives

SPLIT_SEEDS = {
    ("val", "transductive"): 0,
    ("val", "inductive"): 1,
    ("test", "transductive"): 2,
    ("test", "inductive"): 3,
}
MRR_SEEDS = {"val": 10, "test": 12}
# Bound on rows x padded length of one advance() call when ingesting a big group
# (keeps the scan's chunk kernels small); nodes are independent, so splitting the
# nodes of a group over several calls changes nothing.
INGEST_ROW_BUDGET = 2048
# Bound on queries x L x L of one score() call (pair features build (N, L, L) masks).
SCORE_BUDGET = 32 * 1024 * 1024


# ===================================================================== replay state
class StreamReplay:
    """Per-node states and recent-neighbour lists of every node of a stream."""

    def __init__(self, model: DygMambaLinkModel, data: IndexedStream) -> None:
        self.model = model
        self.data = data
        n = data.num_nodes
        self.length = model.config.neighbour_list_len
        self.states = NodeStates.initial(n, model.config)
        self.nbr_keys = np.full((n, self.length), PAD_KEY, dtype=np.int64)
        self.nbr_t = np.full((n, self.length), np.inf, dtype=np.float64)
        self.records = empty_records(n) if model.config.role_counts else None
        self.buckets = model.config.transition_buckets
        self.decay = model.config.transition_decay
        self.order2 = model.config.transition_order2
        self.transitions = (
            empty_counts(n, self.buckets, self.decay, self.order2) if self.buckets else None
        )
        # each node's latest transition count (ModelConfig.latest_transition_count), where
        # it is kept from the event; read at the query instead, from the newest
        # neighbour's row (found by its key) with latest_transition_at_query
        cfg = model.config
        kept = cfg.latest_transition_count and not cfg.latest_transition_at_query
        self.latest = np.zeros(n) if kept else None
        self.at_query = cfg.latest_transition_at_query
        if self.at_query:  # rows of the newest neighbours' keys
            self._key_order = np.argsort(data.keys)
            self._sorted_keys = data.keys[self._key_order]
        self.applied = 0

    def per_node_events(self, events: np.ndarray) -> tuple[np.ndarray, list[list[NodeEvent]]]:
        """Each touched node's events in (t, seq) order (a self-loop: src entry first)."""
        d = self.data
        per: dict[int, list[NodeEvent]] = {}
        keys = d.keys
        for e in np.asarray(events, dtype=np.int64).tolist():
            u, v = int(d.src[e]), int(d.dst[e])
            a, b = endpoint_events(
                int(keys[u]), int(keys[v]), d.features[e].tolist(), float(d.t[e]), e
            )
            per.setdefault(u, []).append(a)
            per.setdefault(v, []).append(b)
        nodes = np.fromiter(per.keys(), dtype=np.int64, count=len(per))
        return nodes, [per[int(k)] for k in nodes]

    def ingest(self, events: np.ndarray, bulk: bool = False) -> None:
        """Apply events (stream indices, in stream order) with ``streaming.advance``.

        ``bulk`` (unscored history before the evaluated region) runs the same padded
        ``model.scan`` that ``advance`` runs, with a chunk of 1 position instead of
        16: the same recurrence, only cheaper for long per-node runs (its results
        agree with ``advance`` to float32 rounding).
        """
        if len(events) == 0:
            return
        nodes, lists = self.per_node_events(events)
        lengths = np.array([len(x) for x in lists])
        order = np.argsort(lengths, kind="stable")
        start = 0
        while start < len(order):
            stop = start + 1
            while (
                stop < len(order) and (stop - start + 1) * lengths[order[stop]] <= INGEST_ROW_BUDGET
            ):
                stop += 1
            idx = order[start:stop]
            sel = torch.from_numpy(nodes[idx])
            if bulk:
                ev, lens = pad_events([lists[i] for i in idx], self.model.config.edge_feature_dim)
                with torch.no_grad():
                    new, _ = self.model.scan(self.states.select(sel), ev, lens, chunk=1)
            else:
                new = advance(self.model, self.states.select(sel), [lists[i] for i in idx])
            self.states.h[sel] = new.h
            self.states.conv[sel] = new.conv
            self.states.t_last[sel] = new.t_last
            self.states.last_seq[sel] = new.last_seq
            self.states.n_events[sel] = new.n_events
            start = stop
        if self.transitions is not None:  # before the lists move past these events
            d = self.data
            # each node's latest neighbour so far: the newest entry of its list
            latest = dict(
                zip(d.keys[nodes].tolist(), self.nbr_keys[nodes, -1].tolist(), strict=True)
            )
            idx = np.asarray(events, dtype=np.int64)
            src_keys, dst_keys = d.keys[d.src[idx]].tolist(), d.keys[d.dst[idx]].tolist()
            pairs = None
            if self.order2:  # and the one before it: the second-latest entry of the list
                before = dict(
                    zip(d.keys[nodes].tolist(), self.nbr_keys[nodes, -2].tolist(), strict=True)
                )
                for_src, for_dst, for_src2, for_dst2 = counterpart_previous_two(
                    src_keys, dst_keys, latest, before
                )
                pairs = pair_keys(
                    np.array(for_src2 + for_dst2, dtype=np.int64),
                    np.array(for_src + for_dst, dtype=np.int64),
                )
            else:
                for_src, for_dst = counterpart_previous(src_keys, dst_keys, latest)
            if self.latest is not None:  # before this call's adds: read them in order
                met_src, met_dst = latest_transition_counts(
                    self.transitions,
                    d.src[idx].tolist(),
                    d.dst[idx].tolist(),
                    for_dst,
                    for_src,
                    self.buckets,
                )
                for u, v, a, b in zip(
                    d.src[idx].tolist(), d.dst[idx].tolist(), met_src, met_dst, strict=True
                ):
                    self.latest[u], self.latest[v] = a, b
            rows = np.concatenate([d.src[idx], d.dst[idx]])
            prev = np.array(for_src + for_dst, dtype=np.int64)
            times = np.concatenate([d.t[idx], d.t[idx]])
            newest = self.nbr_t[:, -1] if self.length else np.full(d.num_nodes, np.inf)
            add_transitions(
                self.transitions, rows, prev, self.buckets, self.decay, times, newest, pairs
            )
        for node, evs in zip(nodes.tolist(), lists, strict=True):
            k = min(len(evs), self.length)
            tail = evs[-k:]
            self.nbr_keys[node, : self.length - k] = self.nbr_keys[node, k:]
            self.nbr_t[node, : self.length - k] = self.nbr_t[node, k:]
            self.nbr_keys[node, self.length - k :] = [e.other_key for e in tail]
            self.nbr_t[node, self.length - k :] = [e.t for e in tail]
        if self.records is not None:
            self.records[nodes] = advance_records(self.records[nodes], lists)
        self.applied += len(events)

    def rows_of_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense rows of node keys, and which keys are nodes of the stream (PAD is not)."""
        at = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
        rows = self._key_order[at]
        return rows, self._sorted_keys[at] == keys

    def latest_at_query(self, nodes: np.ndarray) -> np.ndarray:
        """``latest_transition_at_query`` of ``nodes`` from the records held now."""
        assert self.transitions is not None
        newest, has = self.rows_of_keys(self.nbr_keys[nodes, -1])
        records = DenseTransitions(self.transitions[newest], self.buckets, self.decay)
        return latest_transition_at_query(records, self.nbr_keys[nodes, -2], self.buckets, has)

    def neighbour_lists(self, nodes: np.ndarray) -> NeighbourLists:
        latest: np.ndarray | None
        if self.at_query:
            latest = self.latest_at_query(nodes)
        else:
            latest = None if self.latest is None else self.latest[nodes]
        return NeighbourLists(
            torch.from_numpy(self.nbr_keys[nodes]),
            torch.from_numpy(self.nbr_t[nodes]),
            None if self.records is None else torch.from_numpy(self.records[nodes]),
            None
            if self.transitions is None
            else DenseTransitions(
                self.transitions[nodes],
                self.buckets,
                self.decay,
                latest,
            ),
        )  # (a second-order record, where kept, is the second half of the same rows)

    def score(self, qs: np.ndarray, qd: np.ndarray, qt: np.ndarray) -> np.ndarray:
        """Logits of (src, dst, t) queries (dense node indices) with ``streaming.score``.

        Large query sets go in slices (pair features cost N x L x L memory); a query's
        logit does not depend on the other queries of its call.
        """
        if len(qs) == 0:
            return np.zeros(0, dtype=np.float64)
        step = max(256, SCORE_BUDGET // (self.length * self.length))
        if len(qs) > step:
            return np.concatenate(
                [
                    self.score(qs[i : i + step], qd[i : i + step], qt[i : i + step])
                    for i in range(0, len(qs), step)
                ]
            )
        s_idx, d_idx = torch.from_numpy(qs), torch.from_numpy(qd)
        logits = score(
            self.model,
            self.states.select(s_idx),
            self.states.select(d_idx),
            torch.from_numpy(self.data.keys[qs]),
            torch.from_numpy(self.data.keys[qd]),
            torch.from_numpy(np.asarray(qt, dtype=np.float64)),
            self.neighbour_lists(qs),
            self.neighbour_lists(qd),
        )
        return logits.to(torch.float64).numpy()


# ===================================================================== queries
@dataclass
class Queries:
    """All queries of an evaluation, with the event (positive) each one belongs to."""

    src: np.ndarray
    dst: np.ndarray
    t: np.ndarray
    event: np.ndarray  # stream index of the positive event
    kind: np.ndarray  # object: "pos", "random", "historical", "inductive", "mrr"
    setting: np.ndarray  # object: "" for positives, "transductive", "inductive"
    split: np.ndarray  # object: "val" / "test"
    logit: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.t.shape[0])


def build_queries(
    data: IndexedStream,
    split: ChronologicalSplit,
    splits: Sequence[str] = ("val", "test"),
    settings: Sequence[str] = ("transductive", "inductive"),
    strategies: Sequence[str] = STRATEGIES,
    mrr_k: int = 20,
    batch_size: int = DYGLIB_EVAL_BATCH,
) -> Queries:
    last_observed = float(data.t[split.train].max()) if split.train.any() else -np.inf
    rows: list[tuple[np.ndarray, ...]] = []

    def add(s, d, t, e, kind, setting, split_name):
        n = len(s)
        rows.append(
            (
                np.asarray(s, np.int64),
                np.asarray(d, np.int64),
                np.asarray(t, np.float64),
                np.asarray(e, np.int64),
                np.full(n, kind, dtype=object),
                np.full(n, setting, dtype=object),
                np.full(n, split_name, dtype=object),
            )
        )

    train_nodes = np.array([nid in split.train_nodes for nid in data.node_ids], dtype=bool)
    for split_name in splits:
        mask = {"val": split.val, "test": split.test}[split_name]
        ev = np.where(mask)[0]
        add(data.src[ev], data.dst[ev], data.t[ev], ev, "pos", "", split_name)
        for setting in settings:
            if setting == "transductive":
                sub = ev
            else:
                sub = ev[~(train_nodes[data.src[ev]] & train_nodes[data.dst[ev]])]
            for strategy in strategies:
                sampler = EvalNegativeSampler(
                    data.src,
                    data.dst,
                    data.t,
                    data.num_nodes,
                    last_observed,
                    strategy,
                    SPLIT_SEEDS[(split_name, setting)],
                )
                ns, nd = sampler.sample_batches(
                    data.src[sub], data.dst[sub], data.t[sub], batch_size
                )
                add(ns, nd, data.t[sub], sub, strategy, setting, split_name)
        if mrr_k > 0:
            neg = mrr_negatives(data.dst[ev], np.unique(data.dst), mrr_k, MRR_SEEDS[split_name])
            add(
                data.src[ev].repeat(mrr_k),
                neg.reshape(-1),
                data.t[ev].repeat(mrr_k),
                ev.repeat(mrr_k),
                "mrr",
                "transductive",
                split_name,
            )
    cols = list(zip(*rows, strict=True)) if rows else [[np.zeros(0)]] * 7
    q = Queries(*(np.concatenate(c) for c in cols))
    q.logit = np.full(len(q), np.nan)
    return q


# ===================================================================== replay
ScoreFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def replay(
    model: DygMambaLinkModel,
    data: IndexedStream,
    queries: Queries,
    visibility: str = "exact",
    batch_events: int = DYGLIB_EVAL_BATCH,
    progress: bool = False,
    scorer: Callable[[StreamReplay], ScoreFn] | None = None,
    bulk_chunk: int = 2000,
    merge: bool = True,
) -> StreamReplay:
    """Score every query (filling ``queries.logit``), score-then-update, in time order.

    Events before the first queried event are ingested without scoring (in chunks;
    per node the order is the same, so the states are the same). From there on the
    stream is cut into groups (one per timestamp, or per ``batch_events`` events for
    batch visibility); each group's queries are scored, then the group is ingested.
    ``scorer`` swaps the scoring function (baselines); by default ``StreamReplay.score``.
    ``merge`` batches consecutive groups that cannot affect each other's queries
    (``_conflict_free_runs``): the same scores, far fewer calls.
    """
    if visibility not in ("exact", "batch"):
        raise ValueError("visibility must be 'exact' or 'batch'")
    model.eval()
    rep = StreamReplay(model, data)
    score_fn = scorer(rep) if scorer is not None else rep.score
    n_events = len(data)
    if len(queries) == 0:
        return rep
    first = int(queries.event.min())
    last = int(queries.event.max()) + 1
    for s in range(0, first, bulk_chunk):
        rep.ingest(np.arange(s, min(s + bulk_chunk, first)), bulk=True)
    # Groups over [first, last): by timestamp or by fixed-size batches.
    region = np.arange(first, last)
    if visibility == "exact":
        t_reg = data.t[first:last]
        cuts = np.r_[0, np.where(np.diff(t_reg) != 0)[0] + 1, len(region)]
    else:
        cuts = np.r_[np.arange(0, len(region), batch_events), len(region)]
    group_of_event = np.zeros(n_events, dtype=np.int64)
    for g in range(len(cuts) - 1):
        group_of_event[first + cuts[g] : first + cuts[g + 1]] = g
    q_group = group_of_event[queries.event]
    order = np.argsort(q_group, kind="stable")
    bounds = np.searchsorted(q_group[order], np.arange(len(cuts)))
    runs = (
        _conflict_free_runs(
            data,
            queries,
            order,
            bounds,
            region,
            cuts,
            reads_newest_neighbours=model.config.latest_transition_at_query,
        )
        if merge
        else [(g, g + 1) for g in range(len(cuts) - 1)]
    )
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cuts) - 1, desc="replay", unit="grp", leave=False, mininterval=1.0)
    with torch.no_grad():
        for g0, g1 in runs:
            qi = order[bounds[g0] : bounds[g1]]
            if len(qi):
                queries.logit[qi] = score_fn(queries.src[qi], queries.dst[qi], queries.t[qi])
            rep.ingest(region[cuts[g0] : cuts[g1]])
            if bar is not None:
                bar.update(g1 - g0)
    if bar is not None:
        bar.close()
    return rep


def _conflict_free_runs(
    data: IndexedStream,
    queries: Queries,
    order: np.ndarray,
    bounds: np.ndarray,
    region: np.ndarray,
    cuts: np.ndarray,
    reads_newest_neighbours: bool = False,
) -> list[tuple[int, int]]:
    """Cut the groups into runs [g0, g1) in which no query of a group involves a node
    that an EARLIER group of the same run has events for.

    Scoring all of a run's queries first and then ingesting all of its events is then
    exactly "score group g, ingest group g" for each g in turn: a query reads only its
    two nodes' states and neighbour lists, and those are not touched by the run's
    earlier groups. (Per node, events are still applied in (t, seq) order.)
    ``reads_newest_neighbours``: a query also reads its nodes' newest neighbours'
    records (``ModelConfig.latest_transition_at_query``), which must not be touched
    either.
    """
    touched_in = np.full(data.num_nodes, -1, dtype=np.int64)  # run id that last touched the node
    newest = np.full(data.num_nodes, -1, dtype=np.int64)  # each node's newest neighbour
    if reads_newest_neighbours:
        _note_newest(newest, data, np.arange(region[0] if len(region) else 0))
    runs: list[tuple[int, int]] = []
    run_id, start = 0, 0
    n_groups = len(cuts) - 1
    for g in range(n_groups):
        qi = order[bounds[g] : bounds[g + 1]]
        if g > start and len(qi):
            read = [queries.src[qi], queries.dst[qi]]
            if reads_newest_neighbours:
                read += [n[n >= 0] for n in (newest[read[0]], newest[read[1]])]
            if any((touched_in[nodes] == run_id).any() for nodes in read):
                runs.append((start, g))
                run_id += 1
                start = g
        ev = region[cuts[g] : cuts[g + 1]]
        touched_in[data.src[ev]] = run_id
        touched_in[data.dst[ev]] = run_id
        if reads_newest_neighbours:
            _note_newest(newest, data, ev)
    if n_groups:
        runs.append((start, n_groups))
    return runs


def _note_newest(newest: np.ndarray, data: IndexedStream, events: np.ndarray) -> None:
    """After ``events`` (in stream order), each endpoint's newest neighbour, in place."""
    if len(events) == 0:
        return
    nodes = np.stack([data.src[events], data.dst[events]], axis=1).ravel()[::-1]
    other = np.stack([data.dst[events], data.src[events]], axis=1).ravel()[::-1]
    last, at = np.unique(nodes, return_index=True)  # first in reverse: the newest
    newest[last] = other[at]


# ===================================================================== metrics
def summarise(queries: Queries, splits: Sequence[str] | None = None) -> dict[str, Any]:
    """Metrics per split / setting / negative strategy, plus MRR."""
    out: dict[str, Any] = {}
    splits = splits or sorted(set(queries.split.tolist()))
    for split_name in splits:
        in_split = queries.split == split_name
        pos = in_split & (queries.kind == "pos")
        pos_logit = dict(zip(queries.event[pos].tolist(), queries.logit[pos].tolist(), strict=True))
        res: dict[str, Any] = {}
        for setting in ("transductive", "inductive"):
            for strategy in STRATEGIES:
                m = in_split & (queries.setting == setting) & (queries.kind == strategy)
                if not m.any():
                    continue
                p = np.array([pos_logit[e] for e in queries.event[m].tolist()])
                res.setdefault(setting, {})[strategy] = batched(p, queries.logit[m])
        m = in_split & (queries.kind == "mrr")
        if m.any():
            ev = queries.event[m]
            k = int(np.sum(ev == ev[0]))
            negs = queries.logit[m].reshape(-1, k)
            p = np.array([pos_logit[e] for e in ev[::k].tolist()])
            res["mrr"] = {"mrr": mrr(p, negs), "k": k, "n_positives": len(p)}
        out[split_name] = res
    return out


def write_scores(path: str | Path, data: IndexedStream, queries: Queries) -> None:
    """Every query as CSV: split, setting, kind, event, src, dst, t, is_positive, logit."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["split", "setting", "kind", "event", "src", "dst", "t", "is_positive", "logit"])
        ids = data.node_ids
        for i in range(len(queries)):
            w.writerow(
                [
                    queries.split[i],
                    queries.setting[i],
                    queries.kind[i],
                    int(queries.event[i]),
                    ids[queries.src[i]],
                    ids[queries.dst[i]],
                    repr(float(queries.t[i])),
                    int(queries.kind[i] == "pos"),
                    repr(float(queries.logit[i])),
                ]
            )
