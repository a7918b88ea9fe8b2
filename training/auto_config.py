"""Settings the trainer picks from the training split alone, so that ``dygserve train
--data X`` needs no dataset-specific flags.

Each rule reads a statistic of the TRAINING events (never validation or test, never the
dataset's name) and says why it fired; the choices and their reasons go into the
checkpoint's ``metrics.json`` (``auto``). A setting given explicitly (``--set``,
``--historical-negatives``) always wins over its rule.

Rules:

* **Lists of 128 on a bipartite stream with a small item side.** When sources and
  destinations never share an id and the destination side has at most
  ``ITEM_SIDE_MAX`` distinct ids (courses, pages, products), each node keeps its latest
  128 neighbours instead of 32: a source revisits the same few items, and the
  co-occurrence features read further back. The identity match (the match of v's
  hashed id against u's latest neighbours, ``identity_match_dim``) is no longer chosen
  on any stream: with the transition counts its table only memorises which item
  follows which, and without it validation and test AP are as high or higher on both
  streams that have this shape (Wikipedia and MOOC, 3 seeds each:
  docs/results/current-defaults.md, "The identity match"). It stays a setting
  (``--set identity_match_dim=128``).
* **Transition counts on a bipartite stream.** When sources and destinations never
  share an id, each node also keeps a hashed count of where its counterparts had been
  just before (``transition_buckets``, ``TRANSITION_BUCKETS``; ``model/transition_counts.py``):
  for an item, which items its visitors came from, the online "what follows what"
  table that no node's own events can learn. MOOC, seed 0, 2 epochs: validation AP
  91.1 -> 94.9, test 90.0 -> 94.3; Wikipedia, seed 0: test AP 98.65 / 94.45 / 93.57 ->
  98.81 / 95.11 / 94.16 (docs/results/mooc-experiments.md, "Fifth round").
  **And on snapshot streams** (batch visibility, below): within a snapshot the log's
  order says which sponsors a voter backed one after another, and the counts read it
  (test AP over 3 seeds, Can. Parl.: 91.24 / 95.29 / 89.49 -> 92.48 / 95.42 / 89.10;
  US Legis.: 80.79 / 96.34 / 87.40 -> 81.05 / 97.26 / 91.18;
  docs/results/visibility-experiments.md, "Transition counts on snapshot streams").
  A continuous-time unipartite stream gains nothing (UCI: validation AP 95.48 against
  95.62), so it keeps them off.
* **Decayed transition counts on a bipartite stream in continuous time.** Beside the raw
  counts, a second row weighted by exp(-age / T), T = ``TRANSITION_DECAY_SHARE`` of the
  training span (``transition_decay``): where an item's visitors came from lately.
  3 seeds each, T = 1 day (the rule gives 1.04 on MOOC, 1.08 on Wikipedia), test AP
  random / historical / inductive: MOOC 94.27 / 98.05 / 96.28 -> 94.72 / 98.20 / 96.48;
  Wikipedia 98.87 / 94.91 / 93.96 -> 98.89 / 95.10 / 94.14
  (docs/results/mooc-experiments.md, "Seventh round"). Snapshot streams keep the raw
  counts only: under batch visibility the decay was never measured.
* **Second-order transition counts on the same streams.** A second record of where the
  counterparts had been two steps back: the pair of their two previous neighbours
  (``transition_order2``): which item follows a student's last *two*. Test AP random /
  historical / inductive, the default command without and with it, 3 seeds: MOOC 94.72 /
  98.20 / 96.48 -> 94.96 / 98.32 / 96.64 (every seed's validation and random-negative
  AP up); Wikipedia seed 0 98.83 / 95.20 / 94.23 -> 98.82 / 95.31 / 94.42
  (docs/results/mooc-experiments.md, "Eighth round").
* **The latest transition count, read at the query, on the same streams.** How often
  a node's newest step (from its second-newest neighbour to its newest) had been taken by
  anyone, read from that neighbour's record as it stands when the node is scored
  (``latest_transition_count`` with ``latest_transition_at_query``). MOOC, 3 seeds,
  ``--epochs 2``: test AP 94.96 / 98.32 / 96.64 -> 95.36 / 98.53 / 97.23, every seed and
  column up; Wikipedia seeds 0 and 1 (then with the identity match): random AP 98.82 /
  99.04 -> 98.99 / 99.05 (docs/results/mooc-experiments.md, "Tenth round").
* **Historical training negatives, whatever the share of repeated pairs.** Where pairs
  recur, random negatives alone teach the head that "met before" means "positive",
  which historical and inductive evaluation negatives are built to defeat (on UCI:
  historical AP 84.7 -> 95.0, inductive 79.5 -> 93.0, random 97.1 -> 96.1). Where no
  pair recurs, random negatives say nothing about a pair met before, and the head's
  guess is as bad (bitcoin-otc, where every pair rates once: historical AP 67.9 ->
  96.2, inductive 64.9 -> 95.3, random 96.7 -> 95.9). So a tenth of the training
  negatives are past training pairs on every stream; the share of repeated pairs is
  only reported (docs/results/negatives-experiments.md).
* **A shorter patience on long streams.** Early stopping waits ``DEFAULT_PATIENCE`` epochs
  for a better validation AP, or ``PATIENCE_EVENTS`` training events if that is fewer
  epochs (at least ``PATIENCE_MIN``): an epoch of MOOC is 187k updates, and every run of
  it with a patience of 5 kept its 2nd epoch and then ran five more for nothing (3 seeds
  of ``make results``, and the run of 2026-11-26; docs/results/current-defaults.md), an
  hour of a 2-core machine's time per seed. MOOC gets 3, the other streams here keep 5.
* **Batch visibility on snapshot streams.** When most training events sit in timestamp
  groups of at least ``SNAPSHOT_GROUP_MIN`` events (a vote per congress, a year of
  parliament), exact visibility hides a whole snapshot from every query inside it,
  while the service, fed in arrival order, has applied the snapshot's earlier events
  by the time a query comes. The trainer then trains (and the evaluator, by default,
  evaluates) with ``batch`` visibility: a query sees every event of earlier batches of
  ``batch_size`` events, ties included, which is how TGN, JODIE and TPNet are evaluated
  in DyGLib (US Legis. test AP random / historical / inductive 67.9 / 81.0 / 63.0 ->
  80.3 / 93.7 / 81.6; docs/results/visibility-experiments.md).
* **Snapshot pair features, under batch visibility.** The head also counts each
  endpoint's list entries at the query time and at its previous time: its events of the
  snapshot so far and of the one before (Can. Parl., 3 seeds: random AP 86.2 -> 88.0;
  US Legis., 3 seeds: historical 94.5 -> 96.4, inductive 83.5 -> 87.8;
  docs/results/visibility-experiments.md).
* **Role counts, under batch visibility.** The head also reads each endpoint's in- and
  out-events in the query's snapshot so far, the one before, the three before and all
  earlier ones, and the snapshots since it was last a destination, from a record kept
  beside its neighbour list (``model/role_counts.py``), in units of the median spacing
  of the training snapshots. A Can. Parl. bill sponsor has 40-330 in-events a year,
  which a list of 32 cannot count (Can. Parl. test AP, 3 seeds: 88.0 / 91.1 / 76.5 ->
  91.2 / 95.3 / 89.5; docs/results/visibility-experiments.md, "Role counts").
* **Epochs chosen on all three kinds of negatives, on dense snapshots.** Where a node
  has more than ``DENSE_SNAPSHOT_NODE_EVENTS`` events in a typical snapshot (under batch
  visibility), a random negative is often a pair the snapshot still holds, so the
  validation AP with random negatives stops moving after the first epochs (US Legis.:
  within 1.0 over 15) while the historical and inductive ones swing by 3-5 points: it
  picks an epoch almost at random for them. The trainer then keeps the epoch with the
  best mean of the random, historical and inductive validation APs, with a patience of
  ``SNAPSHOT_PATIENCE`` epochs (the inductive AP rises late). US Legis., 3 seeds:
  80.1 / 96.2 / 87.0 -> 80.5 / 96.4 / 89.3. On Can. Parl.'s sparse snapshots (15 events)
  the random validation AP still climbs, and the same choice traded 1.5 points of it
  for 2.4 of inductive AP over 2 seeds, so the rule leaves it alone
  (docs/results/selection-experiments.md).
* **Neighbour lists that hold a snapshot, under batch visibility.** A query inside a
  snapshot reads the snapshot so far from its neighbour lists (``<= tau``): which pairs
  it already holds, and so which will not come again in it (each US Legis. congress
  joins every pair of its ~100 senators exactly once). A list shorter than a node's
  events in one snapshot has forgotten the start of it. The lists then get the next
  power of two at or above ``SNAPSHOTS_IN_LIST`` times the median of a node's events
  in one snapshot, at most ``SNAPSHOT_LIST_MAX`` (US Legis.: 91 events, lists of 128,
  3-seed test AP 79.7 / 94.3 / 81.4 -> 80.1 / 94.5 / 83.5, the inductive one uneven
  across seeds; Can. Parl.: 15 events, the default 32 stays, where lists of 128 cost 16
  points of random AP; two snapshots' worth, 256 on US Legis., gave the same 3-seed
  inductive mean with a wider spread; docs/results/visibility-experiments.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from model.config import ModelConfig

ITEM_SIDE_MAX = 1024  # destinations of a "small item side"; also <= the default hash buckets
# Share of historical training negatives (docs/results/negatives-experiments.md).
HISTORICAL_SHARE = 0.1
SNAPSHOT_GROUP_MIN = 200  # a timestamp group at least one training batch long is a snapshot
SNAPSHOT_SHARE_MIN = 0.5  # share of training events in snapshots for batch visibility
DENSE_SNAPSHOT_NODE_EVENTS = 32  # a node's events in one snapshot (median) above which...
SNAPSHOT_PATIENCE = 10  # ...epochs are chosen on the mean of 3 validation APs, with this patience
# Early stopping's patience, counted in training events as well as in epochs: on a long
# stream an epoch is many updates, so fewer epochs without a better validation AP say as
# much (never fewer than PATIENCE_MIN epochs, never more than DEFAULT_PATIENCE).
DEFAULT_PATIENCE = 5
PATIENCE_MIN = 3
PATIENCE_EVENTS = 500_000
SNAPSHOTS_IN_LIST = 1  # snapshots' worth of a typical node's events its list should hold
SNAPSHOT_LIST_MAX = 256  # the longest list that rule picks (16 bytes an entry in the blob)
TRANSITION_BUCKETS = 256  # transition-count buckets (bipartite or snapshot streams; 4 B each)
# The decayed transition counts' time constant, as a share of the training span.
TRANSITION_DECAY_SHARE = 1 / 20


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
    # median, over (node, snapshot) pairs, of a node's events in one snapshot (0: none)
    snapshot_node_events: float = 0.0
    # median time between consecutive snapshots (0: fewer than two snapshots)
    snapshot_spacing: float = 0.0
    span: float = 0.0  # last training time minus the first

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> StreamProfile:
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        n = len(src)
        if n == 0:
            return cls(0, 0, 0, False, 0.0, 0.0, 0.0)
        code = src * (int(max(src.max(), dst.max())) + 1) + dst
        first = np.unique(code, return_index=True)[1]
        t = np.asarray(t)
        t_values, t_of, t_counts = np.unique(t, return_inverse=True, return_counts=True)
        in_snapshot = t_counts[t_of] >= SNAPSHOT_GROUP_MIN
        node_events = 0.0
        if in_snapshot.any():
            # Each endpoint of each snapshot event, keyed by (node, snapshot index).
            ends = np.concatenate([src[in_snapshot], dst[in_snapshot]])
            snaps = np.concatenate([t_of[in_snapshot], t_of[in_snapshot]])
            per_node = np.unique(ends * len(t_values) + snaps, return_counts=True)[1]
            node_events = float(np.median(per_node))
        snapshot_times = t_values[t_counts >= SNAPSHOT_GROUP_MIN]
        spacing = float(np.median(np.diff(snapshot_times))) if len(snapshot_times) > 1 else 0.0
        return cls(
            events=n,
            sources=len(np.unique(src)),
            destinations=len(np.unique(dst)),
            bipartite=not np.intersect1d(src, dst).size,
            repeat_share=1.0 - len(first) / n,
            tied_share=float(t_counts[t_counts > 1].sum()) / n,
            snapshot_share=float(in_snapshot.mean()),
            snapshot_node_events=node_events,
            snapshot_spacing=spacing,
            span=float(t.max() - t.min()),
        )


@dataclass
class AutoSettings:
    """What the rules chose, and why."""

    config: dict[str, Any] = field(default_factory=dict)
    historical_negatives: float = 0.0
    visibility: str = "exact"
    select_on: str = "random"
    patience: int | None = None  # None: the trainer's default
    reasons: list[str] = field(default_factory=list)

    def as_json(self, profile: StreamProfile) -> dict[str, Any]:
        return {"profile": asdict(profile), **asdict(self)}


def choose_settings(
    profile: StreamProfile,
    explicit_config: dict[str, Any],
    explicit_historical: float | None,
    explicit_visibility: str | None = None,
    explicit_select_on: str | None = None,
    explicit_patience: int | None = None,
) -> AutoSettings:
    """The rules above, skipping any setting the caller gave explicitly."""
    auto = AutoSettings(select_on=explicit_select_on or "random", patience=explicit_patience)
    buckets = int(explicit_config.get("node_hash_buckets", ModelConfig().node_hash_buckets))
    small_items = 0 < profile.destinations <= min(ITEM_SIDE_MAX, buckets)
    if profile.bipartite and small_items and "neighbour_list_len" not in explicit_config:
        auto.config.update(neighbour_list_len=128)
        auto.reasons.append(
            f"bipartite with {profile.destinations} destinations (<= {ITEM_SIDE_MAX}):"
            " lists of 128 (no identity match: with the transition counts it memorises)"
        )
    # The snapshot pair features, role counts and transition counts are pair features:
    # a model without them (the ablation's "state only") gets none of those rules.
    pair_features = bool(explicit_config.get("use_pair_features", True))
    if explicit_historical is None:
        auto.historical_negatives = HISTORICAL_SHARE
        # Where pairs recur, random negatives teach that "met before" means positive;
        # where none does, nothing teaches what it means. Either way past pairs as
        # negatives are what historical and inductive evaluation negatives test.
        auto.reasons.append(
            f"{profile.repeat_share:.0%} of training events repeat a pair:"
            f" {HISTORICAL_SHARE:.0%} historical negatives"
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
    if (
        auto.visibility == "batch"
        and pair_features
        and "snapshot_pair_features" not in explicit_config
    ):
        auto.config["snapshot_pair_features"] = True
        auto.reasons.append(
            "batch visibility: the head also counts each node's events of the snapshot so far"
            " and of the one before (snapshot pair features)"
        )
    transitions_where = None
    if profile.bipartite:
        transitions_where = "bipartite"
    elif auto.visibility == "batch":
        transitions_where = "batch visibility (a snapshot stream)"
    if transitions_where and pair_features and "transition_buckets" not in explicit_config:
        auto.config["transition_buckets"] = TRANSITION_BUCKETS
        auto.reasons.append(
            f"{transitions_where}: transition counts ({TRANSITION_BUCKETS} buckets), where each"
            " node's counterparts had been just before"
        )
    decay_wanted = (
        profile.bipartite
        and auto.visibility == "exact"
        and profile.span > 0
        and auto.config.get("transition_buckets")
        and "transition_decay" not in explicit_config
    )
    if decay_wanted:
        decay = profile.span * TRANSITION_DECAY_SHARE
        auto.config["transition_decay"] = decay
        auto.reasons.append(
            f"bipartite in continuous time: the transition counts also decayed, with a time"
            f" constant of {decay:g} ({TRANSITION_DECAY_SHARE:g} of the training span)"
        )
    continuous_counts = (
        profile.bipartite and auto.visibility == "exact" and auto.config.get("transition_buckets")
    )
    if continuous_counts and "transition_order2" not in explicit_config:
        auto.config["transition_order2"] = True
        auto.reasons.append(
            "bipartite in continuous time: second-order transition counts too (where each"
            " node's counterparts had been two steps back)"
        )
    latest_chosen = (
        "latest_transition_count" in explicit_config
        or "latest_transition_at_query" in explicit_config
    )
    if continuous_counts and not latest_chosen:
        # Served with one more read of the newest neighbours' records (docs/STATE_STORE.md,
        # "The latest transition count, read at the query"); the form kept from the event
        # is equal on validation but has no writer that could keep it, so it is not chosen.
        auto.config.update(latest_transition_count=True, latest_transition_at_query=True)
        auto.reasons.append(
            "bipartite in continuous time: each node's latest transition count, read at the"
            " query from its newest neighbour's record (how often that step had been taken)"
        )
    counts_chosen = "role_counts" in explicit_config
    if (
        auto.visibility == "batch"
        and profile.snapshot_spacing > 0
        and pair_features
        and not counts_chosen
    ):
        auto.config["role_counts"] = True
        if "role_count_unit" not in explicit_config:
            auto.config["role_count_unit"] = profile.snapshot_spacing
        unit = auto.config.get("role_count_unit", explicit_config.get("role_count_unit"))
        auto.reasons.append(
            "batch visibility: the head also reads each node's in- and out-events over its"
            f" whole history (role counts, in units of {unit:g}, the snapshot spacing)"
        )
    dense = profile.snapshot_node_events > DENSE_SNAPSHOT_NODE_EVENTS
    if auto.visibility == "batch" and dense and explicit_select_on is None:
        auto.select_on = "mean"
        if explicit_patience is None:
            auto.patience = SNAPSHOT_PATIENCE
        auto.reasons.append(
            f"a node has {profile.snapshot_node_events:g} events in a snapshot (median,"
            f" > {DENSE_SNAPSHOT_NODE_EVENTS}): the best epoch is the one with the best mean of"
            f" the random, historical and inductive validation APs (patience {auto.patience})"
        )
    if auto.patience is None and profile.events > 0:
        by_events = max(PATIENCE_MIN, math.ceil(PATIENCE_EVENTS / profile.events))
        if by_events < DEFAULT_PATIENCE:
            auto.patience = by_events
            auto.reasons.append(
                f"{profile.events:,} training events an epoch: a patience of {by_events} epochs"
                f" (>= {PATIENCE_EVENTS:,} events without a better validation AP)"
            )
    list_len = snapshot_list_len(profile)
    chosen_len = "neighbour_list_len" in explicit_config or "neighbour_list_len" in auto.config
    if auto.visibility == "batch" and list_len is not None and not chosen_len:
        auto.config["neighbour_list_len"] = list_len
        auto.reasons.append(
            f"a node has {profile.snapshot_node_events:g} events in a snapshot (median):"
            f" neighbour lists of {list_len} hold the snapshot so far"
        )
    return auto


def snapshot_list_len(profile: StreamProfile) -> int | None:
    """The neighbour-list length that holds ``SNAPSHOTS_IN_LIST`` snapshots of a typical
    node's events (a power of two, at most ``SNAPSHOT_LIST_MAX``); None where the default
    already does."""
    default = ModelConfig().neighbour_list_len
    need = SNAPSHOTS_IN_LIST * profile.snapshot_node_events
    if need <= default:
        return None
    return min(SNAPSHOT_LIST_MAX, 1 << (int(np.ceil(need)) - 1).bit_length())
