"""Negative samplers, after DyGLib's ``NegativeEdgeSampler`` (Poursafaei et al. 2022).

All samplers are seeded (``numpy.random.RandomState``), so the same negatives come
out on every run. Node arguments are dense node indices (``IndexedStream``).

* training (``TrainNegativeSampler``): one negative per positive, at the positive's
  time. By default a random destination drawn from the training split's
  destinations, with the positive's source. With ``historical_fraction`` > 0, that
  share of the negatives are instead whole (src, dst) pairs drawn uniformly from the
  distinct training edges first seen before the current batch and absent from it (the
  historical negatives of the evaluation, made from the training split alone); with
  ``historical_extra`` they come on top of the random ones instead. Random
  negatives alone teach the head that "this pair met before" means "positive", which
  is exactly what historical and inductive evaluation negatives are built to defeat.
* ``random`` (evaluation): the source is kept, the destination is drawn uniformly
  from every destination of the stream (DyGLib: ``full_data.dst_node_ids``).
* ``historical``: whole (src, dst) pairs drawn without replacement from the edges
  observed strictly before the current evaluation batch (t < batch start) and absent
  from the current batch's time window [start, end]; topped up with random pairs
  (re-drawn when they collide with a positive of the batch).
* ``inductive``: as historical, but only edges never observed up to the end of the
  training period (t <= last_observed_time), i.e. edges first seen after training
  (in validation or test), before the batch, and not in the batch; topped up with
  random pairs.

"The current batch" is DyGLib's evaluation batch of ``batch_size`` consecutive
evaluated events (200). Every negative pair is therefore built from events strictly
earlier than every query of its batch: no future edge leaks into the negatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STRATEGIES = ("random", "historical", "inductive")


def train_negatives(rng: np.random.Generator, train_dst: np.ndarray, size: int) -> np.ndarray:
    """One random training destination per positive."""
    return train_dst[rng.integers(0, len(train_dst), size)]


class TrainNegativeSampler:
    """Training negatives: random destinations, mixed with historical pairs."""

    def __init__(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        num_nodes: int,
        historical_fraction: float = 0.0,
        historical_extra: bool = False,
        per_positive: int = 1,
    ) -> None:
        """``src``/``dst``: the training events in their training order.

        ``per_positive`` > 1: that many draws per positive, each from the same mix
        (a random destination, or a historical pair with ``historical_fraction``), so
        the head sees more of the destinations it must rank the true one above while
        the share of historical pairs stays what the trainer chose.

        ``historical_extra``: the historical pairs come on top of every positive's
        random negative instead of replacing it, so the random ranking the head learns is
        not diluted (the batch then holds more negatives than positives)."""
        if not 0.0 <= historical_fraction <= 1.0:
            raise ValueError("historical_fraction must be in [0, 1]")
        if per_positive < 1:
            raise ValueError("per_positive must be at least 1")
        self.per_positive = per_positive
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.num_nodes = num_nodes
        self.historical_fraction = historical_fraction
        self.historical_extra = historical_extra
        self.train_dst = np.unique(self.dst)
        self.code = self.src * num_nodes + self.dst
        # Position of each distinct edge's first occurrence, in training order: the
        # distinct edges seen before position b are first_seen[:searchsorted(first_seen, b)].
        _, first = np.unique(self.code, return_index=True)
        self.first_seen = np.sort(first)

    def sample(
        self, rng: np.random.Generator, b0: int, b1: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, row): the negatives and, for each, the position in [b0, b1) of the
        positive it is drawn for (its query time). One per positive, in order, then the
        extra historical ones when ``historical_extra``; with ``per_positive`` =
        K, K such rounds one after another."""
        rounds = [self._one_each(rng, b0, b1) for _ in range(self.per_positive)]
        if len(rounds) == 1:
            return rounds[0]
        return (
            np.concatenate([r[0] for r in rounds]),
            np.concatenate([r[1] for r in rounds]),
            np.concatenate([r[2] for r in rounds]),
        )

    def _one_each(
        self, rng: np.random.Generator, b0: int, b1: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = self.src[b0:b1]
        rows_all = np.arange(len(u))
        neg_src, neg_dst = u.copy(), train_negatives(rng, self.train_dst, len(u))
        if self.historical_fraction <= 0.0:
            return neg_src, neg_dst, rows_all  # the same draws as before the mix existed
        known = int(np.searchsorted(self.first_seen, b0))
        if known == 0:
            return neg_src, neg_dst, rows_all
        pick = rng.random(len(u)) < self.historical_fraction
        edge = self.first_seen[rng.integers(0, known, int(pick.sum()))]
        # A historical pair that is also a positive of this batch is no negative: keep
        # the random one there.
        clash = np.isin(self.code[edge], self.code[b0:b1])
        rows = np.flatnonzero(pick)[~clash]
        hist_src, hist_dst = self.src[edge[~clash]], self.dst[edge[~clash]]
        if self.historical_extra:
            return (
                np.concatenate([neg_src, hist_src]),
                np.concatenate([neg_dst, hist_dst]),
                np.concatenate([rows_all, rows]),
            )
        neg_src[rows], neg_dst[rows] = hist_src, hist_dst
        return neg_src, neg_dst, rows_all


@dataclass
class EvalNegativeSampler:
    """DyGLib-style evaluation negatives over a stream (dense node indices)."""

    src: np.ndarray  # (E,) all events of the stream
    dst: np.ndarray
    t: np.ndarray
    num_nodes: int
    last_observed_time: float  # end of the training period
    strategy: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown negative strategy {self.strategy!r}, expected one of {STRATEGIES}"
            )
        self.unique_src = np.unique(self.src)
        self.unique_dst = np.unique(self.dst)
        self.code = self.src.astype(np.int64) * self.num_nodes + self.dst.astype(np.int64)
        self.observed = np.unique(self.code[self.t <= self.last_observed_time])
        self.random_state = np.random.RandomState(self.seed)

    def reset(self) -> None:
        self.random_state = np.random.RandomState(self.seed)

    # ----- pools --------------------------------------------------------------------
    def edges_between(self, start: float, end: float, strict_end: bool = False) -> np.ndarray:
        """Unique edge codes with start <= t <= end (or t < end when strict_end)."""
        lo = np.searchsorted(self.t, start, side="left")
        hi = np.searchsorted(self.t, end, side="left" if strict_end else "right")
        return np.unique(self.code[lo:hi])

    def historical_pool(self, start: float, end: float) -> np.ndarray:
        past = self.edges_between(-np.inf, start, strict_end=True)
        return np.setdiff1d(past, self.edges_between(start, end), assume_unique=True)

    def inductive_pool(self, start: float, end: float) -> np.ndarray:
        return np.setdiff1d(self.historical_pool(start, end), self.observed, assume_unique=True)

    # ----- sampling -----------------------------------------------------------------
    def random_pairs_avoiding(
        self, size: int, pos_src: np.ndarray, pos_dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        positives = set(
            (pos_src.astype(np.int64) * self.num_nodes + pos_dst.astype(np.int64)).tolist()
        )
        s = self.unique_src[self.random_state.randint(0, len(self.unique_src), size)]
        d = self.unique_dst[self.random_state.randint(0, len(self.unique_dst), size)]
        for _ in range(100):
            clash = np.array(
                [int(a) * self.num_nodes + int(b) in positives for a, b in zip(s, d, strict=True)],
                dtype=bool,
            )
            if not clash.any():
                break
            k = int(clash.sum())
            s[clash] = self.unique_src[self.random_state.randint(0, len(self.unique_src), k)]
            d[clash] = self.unique_dst[self.random_state.randint(0, len(self.unique_dst), k)]
        return s, d

    def sample(
        self, pos_src: np.ndarray, pos_dst: np.ndarray, pos_t: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Negatives (src, dst) for one evaluation batch of positives (in time order)."""
        size = len(pos_src)
        if size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.strategy == "random":
            d = self.unique_dst[self.random_state.randint(0, len(self.unique_dst), size)]
            return pos_src.astype(np.int64).copy(), d.astype(np.int64)
        start, end = float(pos_t[0]), float(pos_t[-1])
        pool = (
            self.historical_pool(start, end)
            if self.strategy == "historical"
            else self.inductive_pool(start, end)
        )
        if len(pool) >= size:
            pick = pool[self.random_state.choice(len(pool), size=size, replace=False)]
            return pick // self.num_nodes, pick % self.num_nodes
        rs, rd = self.random_pairs_avoiding(size - len(pool), pos_src, pos_dst)
        return (
            np.concatenate([rs, pool // self.num_nodes]).astype(np.int64),
            np.concatenate([rd, pool % self.num_nodes]).astype(np.int64),
        )

    def sample_batches(
        self, pos_src: np.ndarray, pos_dst: np.ndarray, pos_t: np.ndarray, batch_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Negatives for all positives, batch by batch (DyGLib's evaluation loop)."""
        self.reset()
        out_s, out_d = [], []
        for b in range(0, len(pos_src), batch_size):
            s, d = self.sample(
                pos_src[b : b + batch_size], pos_dst[b : b + batch_size], pos_t[b : b + batch_size]
            )
            out_s.append(s)
            out_d.append(d)
        if not out_s:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(out_s), np.concatenate(out_d)


def mrr_negatives(pos_dst: np.ndarray, candidates: np.ndarray, k: int, seed: int) -> np.ndarray:
    """K random destinations per positive (TGB style), never the positive's own one."""
    rs = np.random.RandomState(seed)
    out = candidates[rs.randint(0, len(candidates), (len(pos_dst), k))]
    for _ in range(100):
        clash = out == pos_dst[:, None]
        if not clash.any() or len(candidates) < 2:
            break
        out[clash] = candidates[rs.randint(0, len(candidates), int(clash.sum()))]
    return out.astype(np.int64)
