"""Index plan of the rank-major ("packed") layout used by the serving advance.

N nodes with L_i new events each. Nodes are sorted by L_i, longest first, and their
events packed RANK-MAJOR: block k holds the k-th event of every node that has one,
in that sorted order. Because the order is by length, the nodes with a k-th event
are a PREFIX of the sorted nodes, so in block k, row j is sorted node j; a running
per-node state ``h[:count[k]]`` lines up with block k without any gather, and the
whole sequential recurrence is one slice-multiply-add per rank.

Everything that does not depend on the recurrent state (tokens, projections, the
causal conv, the selective parameters, the decays) is computed for all packed events
at once; only ``h <- a h + u`` walks the ranks. No padding: E events cost E rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RankPlan:
    order: np.ndarray  # (N,) original row of sorted node j
    lengths: np.ndarray  # (N,) events of sorted node j (non-increasing)
    counts: np.ndarray  # (T,) nodes with a k-th event = rows of block k (non-increasing)
    offsets: np.ndarray  # (T + 1,) start of block k in the packed events
    node_of: np.ndarray  # (E,) sorted node of each packed event
    rank_of: np.ndarray  # (E,) rank k of each packed event
    packed_pos: (
        np.ndarray
    )  # (E,) packed position of each event listed node-major (sorted node, then rank)

    @property
    def num_events(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_nodes(self) -> int:
        return int(self.order.shape[0])

    @property
    def keeps_order(self) -> bool:
        """The nodes came already sorted (``sort_order``): no gather in or out is needed."""
        return bool((self.order == np.arange(len(self.order))).all())

    @staticmethod
    def sort_order(lengths: np.ndarray | list[int]) -> np.ndarray:
        """The plan's node order: longest first, ties in the given order. A caller that
        lists its nodes in this order gets a plan that ``keeps_order``."""
        return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")

    @classmethod
    def build(cls, lengths: np.ndarray | list[int]) -> RankPlan:
        lengths = np.asarray(lengths, dtype=np.int64)
        order = cls.sort_order(lengths)
        sorted_len = lengths[order]
        t_len = int(sorted_len[0]) if len(sorted_len) else 0
        # counts[k] = #nodes with length > k (sorted_len is non-increasing).
        counts = np.searchsorted(-sorted_len, -np.arange(t_len), side="left")
        counts = np.asarray(counts, dtype=np.int64)
        offsets = np.zeros(t_len + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        e = int(offsets[-1])
        rank_of = np.repeat(np.arange(t_len, dtype=np.int64), counts)
        node_of = np.arange(e, dtype=np.int64) - offsets[rank_of]
        # Node-major enumeration (sorted node j, its events 0..L_j-1) -> packed position.
        nm_node = np.repeat(np.arange(len(order), dtype=np.int64), sorted_len)
        nm_rank = np.arange(e, dtype=np.int64) - np.repeat(
            np.cumsum(sorted_len) - sorted_len, sorted_len
        )
        packed_pos = offsets[nm_rank] + nm_node
        return cls(order, sorted_len, counts, offsets, node_of, rank_of, packed_pos)

    # ----- index helpers (numpy in, torch out) ------------------------------------------
    def previous_event(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For each packed event: packed position of the same node's previous event in
        this batch, and a mask of events that have one (rank > 0)."""
        k = self.rank_of
        has_prev = k > 0
        prev = np.where(has_prev, np.arange(self.num_events) - self.counts[np.maximum(k - 1, 0)], 0)
        return torch.from_numpy(prev), torch.from_numpy(has_prev)

    def conv_windows(self, k1: int) -> torch.Tensor:
        """(E, k1 + 1) indices into ``cat([x_packed (E rows), tails (N * k1 rows)])``.

        Event (k, j) sees positions k .. k + k1 of node j's sequence [tail_j, x_j]; a
        position p < k1 is tail row j * k1 + p, else the packed event of rank p - k1.
        """
        p = self.rank_of[:, None] + np.arange(k1 + 1)[None, :]
        return torch.from_numpy(self._sequence_index(p, self.node_of[:, None], k1))

    def final_tails(self, k1: int) -> torch.Tensor:
        """(N, k1) indices of each sorted node's last k1 sequence positions (its new tail)."""
        p = self.lengths[:, None] + np.arange(k1)[None, :]
        return torch.from_numpy(self._sequence_index(p, np.arange(self.num_nodes)[:, None], k1))

    def last_event(self) -> torch.Tensor:
        """(N,) packed position of each sorted node's last event (0 for nodes without one)."""
        k = np.maximum(self.lengths - 1, 0)
        return torch.from_numpy(
            np.where(self.lengths > 0, self.offsets[k] + np.arange(self.num_nodes), 0)
        )

    def _sequence_index(self, p: np.ndarray, node: np.ndarray, k1: int) -> np.ndarray:
        in_tail = p < k1
        rank = np.maximum(p - k1, 0)
        return np.where(in_tail, self.num_events + node * k1 + p, self.offsets[rank] + node)
