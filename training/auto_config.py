"""Settings the trainer picks from the training split alone, so that ``dygserve train
--data X`` needs no dataset-specific flags.

Each rule reads a statistic of the TRAINING events (never validation or test, never the
dataset's name) and says why it fired; the choices and their reasons go into the
checkpoint's ``metrics.json`` (``auto``). A setting given explicitly (``--set``,
``--historical-negatives``) always wins over its rule.

Rules:

* **Identity match on a bipartite stream with a small item side.** When sources and
  destinations never share an id and the destination side has at most
  ``ITEM_SIDE_MAX`` distinct ids (courses, pages, products), which item follows a
  source's previous ones is a learnable table: the match of v's hashed id against u's
  latest neighbours (``identity_match_dim`` 128, depth 3, lists of 128; see
  ``docs/results/mooc-experiments.md``). With more items than hash buckets the rows
  would be shared and the table meaningless, so the side must also fit in the buckets.
* **Historical training negatives.** Where pairs recur (a large share of training
  events repeat an earlier pair), random negatives alone teach the head that "met
  before" means "positive", which historical and inductive evaluation negatives are
  built to defeat; a tenth of the training negatives are then past training pairs
  (on UCI: historical AP 84.7 -> 95.0, inductive 79.5 -> 93.0, random 97.1 -> 96.1;
  docs/results/negatives-experiments.md).
* **Batch visibility on snapshot streams.** When most training events sit in timestamp
  groups of at least ``SNAPSHOT_GROUP_MIN`` events (a vote per congress, a year of
  parliament), exact visibility hides a whole snapshot from every query inside it,
  while the service, fed in arrival order, has applied the snapshot's earlier events
  by the time a query comes. The trainer then trains (and the evaluator, by default,
  evaluates) with ``batch`` visibility: a query sees every event of earlier batches of
  ``batch_size`` events, ties included, which is how TGN, JODIE and TPNet are evaluated
  in DyGLib (US Legis. test AP random / historical / inductive 67.9 / 81.0 / 63.0 ->
  80.3 / 93.7 / 81.6; docs/results/visibility-experiments.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from model.config import ModelConfig

ITEM_SIDE_MAX = 1024  # destinations of a "small item side"; also <= the default hash buckets
REPEAT_SHARE_MIN = 0.3  # share of training events repeating an earlier pair
HISTORICAL_SHARE = 0.1  # share of historical training negatives where pairs recur (docs/results/negatives-experiments.md)
SNAPSHOT_GROUP_MIN = 200  # a timestamp group at least one training batch long is a snapshot
SNAPSHOT_SHARE_MIN = 0.5  # share of training events in snapshots for batch visibility


@dataclass(frozen=True)
class StreamProfile:
    """Statistics of the training events that the rules read."""

    events: int
    sources: int
    destinations: int
    bipartite: bool  # no id is both a source and a destination
    repeat_share: float  # events whose (src, dst) pair occurred before
    tied_share: float  # events sharing their timestamp with another event
    snapshot_share: float = 0.0  # events in timestamp groups of >= SNAPSHOT_GROUP_MIN events

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> StreamProfile:
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        n = len(src)
        if n == 0:
            return cls(0, 0, 0, False, 0.0, 0.0, 0.0)
        code = src * (int(max(src.max(), dst.max())) + 1) + dst
        first = np.unique(code, return_index=True)[1]
        _, t_counts = np.unique(np.asarray(t), return_counts=True)
        return cls(
            events=n,
            sources=len(np.unique(src)),
            destinations=len(np.unique(dst)),
            bipartite=not np.intersect1d(src, dst).size,
            repeat_share=1.0 - len(first) / n,
            tied_share=float(t_counts[t_counts > 1].sum()) / n,
            snapshot_share=float(t_counts[t_counts >= SNAPSHOT_GROUP_MIN].sum()) / n,
        )


@dataclass
class AutoSettings:
    """What the rules chose, and why."""

    config: dict[str, Any] = field(default_factory=dict)
    historical_negatives: float = 0.0
    visibility: str = "exact"
    reasons: list[str] = field(default_factory=list)

    def as_json(self, profile: StreamProfile) -> dict[str, Any]:
        return {"profile": asdict(profile), **asdict(self)}


def choose_settings(
    profile: StreamProfile,
    explicit_config: dict[str, Any],
    explicit_historical: float | None,
    explicit_visibility: str | None = None,
) -> AutoSettings:
    """The rules above, skipping any setting the caller gave explicitly."""
    auto = AutoSettings()
    buckets = int(explicit_config.get("node_hash_buckets", ModelConfig().node_hash_buckets))
    match_fields = ("identity_match_dim", "identity_match_depth", "neighbour_list_len")
    small_items = 0 < profile.destinations <= min(ITEM_SIDE_MAX, buckets)
    if profile.bipartite and small_items and not any(f in explicit_config for f in match_fields):
        auto.config.update(identity_match_dim=128, identity_match_depth=3, neighbour_list_len=128)
        auto.reasons.append(
            f"bipartite with {profile.destinations} destinations (<= {ITEM_SIDE_MAX}):"
            " identity match (width 128, depth 3) over lists of 128"
        )
    if explicit_historical is None:
        if profile.repeat_share >= REPEAT_SHARE_MIN:
            auto.historical_negatives = HISTORICAL_SHARE
            auto.reasons.append(
                f"{profile.repeat_share:.0%} of training events repeat a pair"
                f" (>= {REPEAT_SHARE_MIN:.0%}): {HISTORICAL_SHARE:.0%} historical negatives"
            )
    else:
        auto.historical_negatives = explicit_historical
    if explicit_visibility is None:
        if profile.snapshot_share >= SNAPSHOT_SHARE_MIN:
            auto.visibility = "batch"
            auto.reasons.append(
                f"{profile.snapshot_share:.0%} of training events share their timestamp with"
                f" >= {SNAPSHOT_GROUP_MIN - 1} others (>= {SNAPSHOT_SHARE_MIN:.0%}): batch visibility"
            )
    else:
        auto.visibility = explicit_visibility
    return auto
