"""The ingestion and scoring pipelines, over one loaded checkpoint and one state store.

Everything here is blocking (torch, sync Redis): the app calls it from worker
threads, never on the event loop. The numbers come from ``model.streaming`` so
that they are exactly those of the offline evaluator.

Ingest: validate -> append to the log (one atomic script: dedupe, late check,
sequence numbers) -> apply: one read of all touched states, one padded step/scan
over every touched node, one compare-and-set pipelined write (``apply_logged``).
Score: one read of the states, one of the neighbour lists; cold nodes (history
but no blob) are rebuilt together by one batch scan and written back with a
compare-and-set that never overwrites a newer state; then decay, read-out, head.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.checkpoint import LoadedCheckpoint, load_checkpoint
from model.events import ROLE_DST, ROLE_SRC, NodeEvent, endpoint_events
from model.kernels.dispatch import kernel_advancer
from model.node_head_checkpoint import load_node_head
from model.node_ids import node_key, node_keys
from model.node_state import NeighbourLists, NodeStates, StateCodec
from model.numpy_scorer import NumpyScorer
from model.protocol import ServedModel
from model.rank_plan import RankPlan
from model.streaming import score_nodes
from state_store.applier import LoggedBatch, apply_logged, redrive
from state_store.base import LoggedEvent, NewEvent, StateStore
from state_store.faults import maybe_crash

from . import metrics
from .schemas import EventsResponse, NodeSummary, Rejected

log = logging.getLogger("dygserve")


# A candidate link: (src, dst, t); t None means the latest event time seen.
Pair = tuple[str, str, float | None]


class RequestRefused(ValueError):
    """A whole request refused with a 4xx (nothing applied)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@contextmanager
def timed_store(op: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.STORE_LATENCY.labels(op=op).observe(time.perf_counter() - start)


class ModelRuntime:
    """One loaded checkpoint: model, codec, and the store-facing advance function."""

    def __init__(
        self,
        checkpoint: LoadedCheckpoint,
        backend: str = "torch",
        onnx_dir: Path | None = None,
        device: str = "cpu",
    ) -> None:
        self.checkpoint = checkpoint
        self.backend = backend
        # States are decoded and encoded on the host; the model's work (the rank-major
        # advance of ingest and cold rebuilds, the read-out and head) runs on ``device``.
        self.device = torch.device("cpu")
        if backend == "onnx":
            from model.onnx.runtime import OnnxLinkModel

            # Same surface as the torch model for model.streaming; refuses a stale export.
            self.model: ServedModel = OnnxLinkModel.from_loaded(checkpoint, onnx_dir=onnx_dir)
            # Scoring runs the ONNX read-out/head graph (about 2.5x torch's speed per
            # call); state updates keep torch's rank-major kernel, which applies a batch
            # in one pass where the ONNX step graph runs once per event rank (half the
            # ingest rate, docs/ONNX.md). Both are tested equal to the plain step.
            self.advance_model = checkpoint.model
        else:
            self.device = resolve_device(device)
            self.model = self.advance_model = checkpoint.model.to(self.device)
        self.config = checkpoint.config
        self.version = checkpoint.version
        # What advances states: mamba-ssm's kernels on CUDA where they run, else torch's
        # rank-major path (model/kernels/dispatch.py); /v1/model and a metric show which.
        self.kernels = kernel_advancer(self.advance_model, self.device)
        self.codec = StateCodec(self.config, self.version)
        # The torch backend's kernel for calls of a few pairs (model/numpy_scorer.py).
        self.numpy_scorer = NumpyScorer(checkpoint.model) if backend == "torch" else None
        # The node-classification head, where the checkpoint has one (service/classify.py).
        self.node_head = load_node_head(checkpoint.path, checkpoint.version)

    @classmethod
    def load(
        cls, path: Path, backend: str = "torch", onnx_dir: Path | None = None, device: str = "cpu"
    ) -> ModelRuntime:
        return cls(load_checkpoint(path), backend, onnx_dir, device)

    def decode(self, blobs: Sequence[bytes | None]) -> tuple[NodeStates, NeighbourLists]:
        """States and recent-neighbour lists for a list of blobs; None -> the initial state."""
        present = [i for i, b in enumerate(blobs) if b is not None]
        if len(present) == len(blobs):
            return self.codec.decode_with_neighbours(list(blobs))  # type: ignore[arg-type]
        states = NodeStates.initial(len(blobs), self.config)
        lists = NeighbourLists.empty(len(blobs), self.codec.list_len)
        if present:
            dec, nbr = self.codec.decode_with_neighbours([blobs[i] for i in present])  # type: ignore[misc]
            idx = torch.tensor(present)
            states.h[idx], states.conv[idx] = dec.h, dec.conv
            states.t_last[idx], states.last_seq[idx], states.n_events[idx] = (
                dec.t_last,
                dec.last_seq,
                dec.n_events,
            )
            lists.keys[idx], lists.times[idx] = nbr.keys, nbr.times
        return states, lists

    def advance_blobs(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        """The applier's callback: apply each node's new events to its state and its
        neighbour list, return the new blobs."""
        per_node = [
            node_events(node, events) for node, events in zip(nodes, new_events, strict=True)
        ]
        # Decoded straight into the rank plan's order: the advance then gathers nothing.
        order = RankPlan.sort_order([len(p) for p in per_node]).tolist()
        nodes, blobs, per_node = (
            [nodes[i] for i in order],
            [blobs[i] for i in order],
            [per_node[i] for i in order],
        )
        states, lists = self.decode(blobs)
        new = self.kernels.advance(states.to(self.device), per_node).to("cpu")
        return dict(zip(nodes, self.codec.encode_many(new, lists.extended(per_node)), strict=True))


def resolve_device(device: str) -> torch.device:
    """ "auto" -> CUDA when this torch build sees a GPU, else the CPU; "cuda" without one is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device 'cuda' asked for, but torch sees no CUDA device (CPU build or no GPU)"
        )
    return torch.device(device)


def distinct_nodes(pairs: Sequence[Pair]) -> list[str]:
    """The pairs' nodes, each once (sources first), in a stable order."""
    return list(dict.fromkeys([p[0] for p in pairs] + [p[1] for p in pairs]))


def node_events(node: str, events: Sequence[LoggedEvent]) -> list[NodeEvent]:
    """The logged events as seen from ``node``. A self-loop (u, u) is two entries for u
    (in its state and its neighbour list), the source's then the destination's, as the
    trainer and evaluator see it (``model.events.endpoint_events``); the store keeps
    it once in the history. (One loop per node, not a call per event: an ingest of
    1,000 events builds ~2,000 of these.)"""
    key = node_key(node)
    out: list[NodeEvent] = []
    for e in events:
        if e.src == e.dst:
            out += endpoint_events(key, key, e.features, e.t, e.seq)
        elif e.src == node:  # the source's view: the other endpoint is the destination
            out.append(NodeEvent(node_key(e.dst), ROLE_SRC, e.features, e.t, e.seq))
        else:
            out.append(NodeEvent(node_key(e.src), ROLE_DST, e.features, e.t, e.seq))
    return out


@dataclass
class ScoredPair:
    src: str
    dst: str
    t: float
    logit: float
    src_age: float | None
    dst_age: float | None
    src_inductive: bool
    dst_inductive: bool
    clamped: bool

    @property
    def probability(self) -> float:
        return (
            1.0 / (1.0 + math.exp(-self.logit))
            if self.logit >= 0
            else math.exp(self.logit) / (1.0 + math.exp(self.logit))
        )


class Engine:
    def __init__(
        self, runtime: ModelRuntime, store: StateStore, numpy_max_pairs: int = 256
    ) -> None:
        self._runtime = runtime
        self.store = store
        # Score calls up to this many pairs take the runtime's numpy kernel (when it has
        # one): 3x less CPU for one pair, level with torch near 1,000 (docs/BENCHMARKS.md).
        self.numpy_max_pairs = numpy_max_pairs
        self._swap = threading.Lock()
        # One apply at a time per process. Concurrent applies of batches that share a
        # node (a hub is in nearly every batch) only conflict on its compare-and-set
        # and redo their work, and their torch ops fight over the GIL anyway; logging
        # (the Lua append) and scoring still run beside an apply. Across worker
        # processes the compare-and-set keeps it exactly once.
        self._apply_lock = threading.Lock()
        self.needs_redrive = True  # on start: re-drive whatever a crash left logged but unapplied

    @property
    def runtime(self) -> ModelRuntime:
        return self._runtime

    def swap(self, runtime: ModelRuntime) -> ModelRuntime:
        """Hot switch: requests already running finish on the runtime they started with."""
        with self._swap:
            old, self._runtime = self._runtime, runtime
        return old

    # ----- ingest --------------------------------------------------------------------
    def ingest(self, events: list[dict[str, Any]], apply: bool = True) -> EventsResponse:
        """Log the events, then (``apply``) commit both endpoints' states before returning."""
        rt = self.runtime
        result, logged = self.log_events(rt, events)
        if logged and apply:
            self.apply(rt, logged)
        result.applied = apply or not logged
        return result

    def log_events(
        self, rt: ModelRuntime, events: list[dict[str, Any]]
    ) -> tuple[EventsResponse, LoggedBatch]:
        """Validate against the model and append to the log; nothing applied yet."""
        dim = rt.config.edge_feature_dim
        new = []
        for i, e in enumerate(events):
            feats = e.get("features") or []
            if len(feats) != dim:
                raise RequestRefused(
                    422, f"events[{i}].features has length {len(feats)}, the model expects {dim}"
                )
            new.append(
                NewEvent(
                    e["src"], e["dst"], float(e["t"]), tuple(map(float, feats)), e.get("event_id")
                )
            )
        with timed_store("append"):
            result = self.store.append_events(new)
        logged = [
            LoggedEvent(seq, ev.src, ev.dst, ev.t, ev.features, ev.event_id or "")
            for ev, seq in zip(new, result.seqs, strict=True)
            if seq is not None
        ]
        maybe_crash("after_log")
        metrics.EVENTS_INGESTED.inc(len(logged))
        metrics.EVENTS_DUPLICATE.inc(len(result.duplicates))
        for _, reason in result.late:
            metrics.EVENTS_REJECTED.labels(reason=reason.split(":", 1)[0]).inc()
        summary = EventsResponse(
            accepted=len(logged),
            duplicates=len(result.duplicates),
            rejected=[Rejected(index=i, reason=r) for i, r in result.late],
            applied=False,
        )
        return summary, LoggedBatch(logged, result.previous_seq)

    def apply_in_background(self, rt: ModelRuntime, logged: LoggedBatch) -> None:
        """For ``wait=false``: a failure leaves the events pending for the re-drive."""
        try:
            self.apply(rt, logged)
        except Exception:
            log.warning(
                "background apply failed; the re-drive will apply the events", exc_info=True
            )

    def apply(self, rt: ModelRuntime, logged: LoggedBatch) -> None:
        try:
            with self._apply_lock, timed_store("apply"):
                stats = apply_logged(
                    self.store,
                    rt.version,
                    logged.events,
                    rt.advance_blobs,
                    previous_seq=logged.previous_seq,
                )
            metrics.EVENTS_APPLIED.inc(stats.marked)
        except Exception:
            self.needs_redrive = True  # logged but maybe not applied: re-drive later
            raise

    def redrive(self) -> int:
        rt = self.runtime
        with self._apply_lock, timed_store("redrive"):
            stats = redrive(self.store, rt.version, rt.advance_blobs)
        metrics.EVENTS_APPLIED.inc(stats.marked)
        self.needs_redrive = False
        return getattr(stats, "events_applied", 0)

    # ----- score ---------------------------------------------------------------------
    def load_states(
        self, rt: ModelRuntime, nodes: list[str]
    ) -> tuple[NodeStates, NeighbourLists, np.ndarray]:
        """States and neighbour lists of ``nodes`` (unique), rebuilding cold ones in one
        batch; and which nodes have no history at all (scored inductively)."""
        with timed_store("read_states"):
            blobs = self.store.read_states(rt.version, nodes)
        missing = [i for i, b in enumerate(blobs) if b is None]
        inductive = np.zeros(len(nodes), dtype=bool)
        if missing:
            miss_nodes = [nodes[i] for i in missing]
            with timed_store("read_histories"):
                histories = self.store.read_histories(miss_nodes)
            cold = [(i, n, h) for i, n, h in zip(missing, miss_nodes, histories, strict=True) if h]
            for i, _, h in zip(missing, miss_nodes, histories, strict=True):
                inductive[i] = not h
            if cold:
                cold_nodes = [n for _, n, _ in cold]
                rebuilt = rt.advance_blobs(cold_nodes, [None] * len(cold), [h for _, _, h in cold])
                with timed_store("write_states"):
                    self.store.write_states(rt.version, rebuilt, dict.fromkeys(cold_nodes))
                metrics.COLD_REBUILDS.inc(len(cold))
                for i, n, _ in cold:
                    blobs[i] = rebuilt[n]
        return (*rt.decode(blobs), inductive)

    def score_pairs(self, pairs: Sequence[Pair]) -> tuple[list[ScoredPair], str]:
        rt = self.runtime
        if not pairs:
            return [], rt.version
        default_t = None
        if any(t is None for _, _, t in pairs):
            with timed_store("clock"):
                default_t = self.store.last_event_time()
            default_t = 0.0 if default_t is None else default_t
        nodes = distinct_nodes(pairs)
        states, lists, inductive = self.load_states(rt, nodes)
        return self._score(rt, pairs, nodes, states, lists, inductive, default_t), rt.version

    async def score_pairs_on_loop(
        self, pairs: Sequence[Pair]
    ) -> tuple[list[ScoredPair], str] | None:
        """``score_pairs`` on the event loop, for a few pairs: an awaited state read (no
        worker thread to wake and wait for), then the read-out in place.

        None where it does not apply, and the caller takes ``score_pairs`` in a worker
        thread: a store without non-blocking reads, a pair without a time (the clock is
        another read), or a node with no cached state (a cold rebuild or an unknown node
        needs its history).
        """
        rt = self.runtime
        if not pairs or not self.store.async_reads or any(t is None for _, _, t in pairs):
            return None
        nodes = distinct_nodes(pairs)
        with timed_store("read_states"):
            blobs = await self.store.read_states_async(rt.version, nodes)
        if any(b is None for b in blobs):
            return None
        states, lists = rt.decode(blobs)
        return self._score(
            rt, pairs, nodes, states, lists, np.zeros(len(nodes), dtype=bool), None
        ), rt.version

    def _score(
        self,
        rt: ModelRuntime,
        pairs: Sequence[Pair],
        nodes: list[str],
        states: NodeStates,
        lists: NeighbourLists,
        inductive: np.ndarray,
        default_t: float | None,
    ) -> list[ScoredPair]:
        pos = {n: i for i, n in enumerate(nodes)}
        n = len(pairs)
        iu = np.fromiter((pos[s] for s, _, _ in pairs), dtype=np.int64, count=n)
        iv = np.fromiter((pos[d] for _, d, _ in pairs), dtype=np.int64, count=n)
        tau = np.fromiter(
            (default_t if t is None else t for _, _, t in pairs), dtype=np.float64, count=n
        )
        keys = node_keys(nodes)
        if rt.numpy_scorer is not None and n <= self.numpy_max_pairs:
            lg = rt.numpy_scorer.score_nodes(
                states.h.numpy(),
                states.t_last.numpy(),
                states.n_events.numpy(),
                lists.keys.numpy(),
                lists.times.numpy(),
                keys,
                iu,
                iv,
                tau,
            ).tolist()
        else:
            dev = rt.device
            lg = score_nodes(
                rt.model,
                states.to(dev),
                lists.to(dev),
                torch.from_numpy(keys).to(dev),
                torch.from_numpy(iu).to(dev),
                torch.from_numpy(iv).to(dev),
                torch.from_numpy(tau).to(dev),
            ).tolist()
        out = []
        # Plain Python floats in one go: indexing tensors per pair costs microseconds each.
        t_last = states.t_last.tolist()
        tl_u, tl_v = [t_last[i] for i in iu.tolist()], [t_last[i] for i in iv.tolist()]
        taus = tau.tolist()
        ind = inductive.tolist()
        for k, (s, d, _) in enumerate(pairs):
            t = taus[k]
            age_u = t - tl_u[k] if math.isfinite(tl_u[k]) else None
            age_v = t - tl_v[k] if math.isfinite(tl_v[k]) else None
            clamped = (age_u is not None and age_u < 0) or (age_v is not None and age_v < 0)
            out.append(ScoredPair(s, d, t, lg[k], age_u, age_v, ind[pos[s]], ind[pos[d]], clamped))
        return out

    # ----- introspection -------------------------------------------------------------
    def node_summary(self, node: str) -> NodeSummary:
        rt = self.runtime
        blob = self.store.read_states(rt.version, [node])[0]
        history = self.store.read_histories([node])[0]
        st, _ = rt.decode([blob])
        t_last = float(st.t_last[0])
        return NodeSummary(
            node=node,
            model_version=rt.version,
            cached=blob is not None,
            t_last=t_last if math.isfinite(t_last) else (history[-1].t if history else None),
            events_applied=int(st.n_events[0]),  # 0 while not cached (cold: rebuilt on first use)
            last_seq=int(st.last_seq[0])
            if blob is not None
            else (history[-1].seq if history else None),
            history_length=len(history),
        )
