"""Settings chosen from the training split's statistics: the rules fire on the streams'
shapes (never their names), and an explicit setting always wins."""

from __future__ import annotations

import numpy as np
import pytest

from model.config import ModelConfig
from training.auto_config import (
    DENSE_SNAPSHOT_NODE_EVENTS,
    HISTORICAL_SHARE,
    ITEM_SIDE_MAX,
    SNAPSHOT_GROUP_MIN,
    SNAPSHOT_LIST_MAX,
    SNAPSHOT_PATIENCE,
    SNAPSHOT_SHARE_MIN,
    TRANSITION_BUCKETS,
    TRANSITION_DECAY_SHARE,
    StreamProfile,
    choose_settings,
    snapshot_list_len,
)
from training.batches import IndexedStream
from training.data import chronological_split, read_edge_stream


def _profile(data_dir, name, limit=20000) -> StreamProfile:
    stream = read_edge_stream(data_dir / name / "edges.csv.gz", limit=limit)
    data, split = IndexedStream.build(stream), chronological_split(stream)
    ev = np.where(split.train)[0]
    return StreamProfile.of(data.src[ev], data.dst[ev], data.t[ev])


def test_profile_statistics_on_a_hand_made_stream() -> None:
    src = np.array([0, 0, 1, 0])
    dst = np.array([5, 5, 6, 5])
    t = np.array([1.0, 2.0, 2.0, 3.0])
    p = StreamProfile.of(src, dst, t)
    assert (p.events, p.sources, p.destinations, p.bipartite) == (4, 2, 2, True)
    assert p.repeat_share == pytest.approx(0.5)  # the 2nd and 4th events repeat (0, 5)
    assert p.tied_share == pytest.approx(0.5)  # two events share t = 2
    assert not StreamProfile.of(np.array([0, 5]), np.array([5, 0]), t[:2]).bipartite


def test_bipartite_stream_with_few_items_gets_long_lists(data_dir) -> None:
    p = _profile(data_dir, "mooc")
    assert p.bipartite and p.destinations <= ITEM_SIDE_MAX
    chosen = choose_settings(p, {}, None)
    assert chosen.config["neighbour_list_len"] == 128
    assert any("bipartite" in r for r in chosen.reasons)
    # ...and the transition counts: which items each item's visitors came from.
    assert chosen.config["transition_buckets"] == TRANSITION_BUCKETS
    assert any("transition counts" in r for r in chosen.reasons)
    # ...decayed, on a time scale of the training span.
    assert p.span > 0
    assert chosen.config["transition_decay"] == pytest.approx(p.span * TRANSITION_DECAY_SHARE)
    assert any("decayed" in r for r in chosen.reasons)


def test_no_stream_gets_the_identity_match(data_dir) -> None:
    """Beside the transition counts the match's table only memorises which item follows
    which (MOOC and Wikipedia, 3 seeds each): lists of 128 without it, however many
    training events each item has; asked for, it is kept with the lists."""
    items = 40
    for per_item in (100, 5000):
        n = items * per_item
        src = np.arange(n) % 997
        dst = 10_000 + np.arange(n) % items
        chosen = choose_settings(StreamProfile.of(src, dst, np.arange(float(n))), {}, None)
        assert chosen.config["neighbour_list_len"] == 128
        assert "identity_match_dim" not in chosen.config
        asked = choose_settings(
            StreamProfile.of(src, dst, np.arange(float(n))), {"identity_match_dim": 128}, None
        )
        assert asked.config["neighbour_list_len"] == 128
    for name in ("mooc", "wikipedia"):
        assert (
            "identity_match_dim" not in choose_settings(_profile(data_dir, name), {}, None).config
        )


def test_decayed_transition_counts_only_in_continuous_time() -> None:
    """A bipartite snapshot stream keeps its transition counts raw (batch visibility,
    where the decay was never measured); an explicit decay, or none, wins."""
    src = np.repeat(np.arange(10), 40)
    dst = 100 + np.tile(np.arange(40), 10)
    snapshots = StreamProfile.of(src, dst, np.repeat([0.0, 1.0], 200))
    chosen = choose_settings(snapshots, {}, None)
    assert chosen.visibility == "batch" and chosen.config["transition_buckets"]
    assert "transition_decay" not in chosen.config
    continuous = StreamProfile.of(src, dst, np.arange(400.0))
    assert choose_settings(continuous, {}, None).config["transition_decay"] == pytest.approx(
        399 * TRANSITION_DECAY_SHARE
    )
    assert (
        "transition_decay"
        not in choose_settings(continuous, {"transition_decay": 0.0}, None).config
    )
    assert (
        "transition_decay"
        not in choose_settings(continuous, {"transition_buckets": 0}, None).config
    )


def test_second_order_transition_counts_where_the_counts_are_decayed() -> None:
    """The second-order record comes with the decayed counts (bipartite, continuous
    time), not on snapshot streams; an explicit setting, or no counts at all, wins."""
    src = np.repeat(np.arange(10), 40)
    dst = 100 + np.tile(np.arange(40), 10)
    continuous = StreamProfile.of(src, dst, np.arange(400.0))
    chosen = choose_settings(continuous, {}, None)
    assert chosen.config["transition_order2"] is True
    assert any("second-order" in r for r in chosen.reasons)
    snapshots = StreamProfile.of(src, dst, np.repeat([0.0, 1.0], 200))
    assert "transition_order2" not in choose_settings(snapshots, {}, None).config
    explicit_off = choose_settings(continuous, {"transition_order2": False}, None)
    assert "transition_order2" not in explicit_off.config
    assert (
        "transition_order2"
        not in choose_settings(continuous, {"transition_buckets": 0}, None).config
    )


def test_latest_transition_count_read_at_the_query_on_the_same_streams() -> None:
    """The latest transition count comes in its servable form (read at the query) where
    the counts are decayed; snapshot streams, streams without counts and an explicit
    setting of either field keep it off (or as given)."""
    src = np.repeat(np.arange(10), 40)
    dst = 100 + np.tile(np.arange(40), 10)
    continuous = StreamProfile.of(src, dst, np.arange(400.0))
    chosen = choose_settings(continuous, {}, None)
    assert chosen.config["latest_transition_count"] is True
    assert chosen.config["latest_transition_at_query"] is True
    assert any("read at the query" in r for r in chosen.reasons)
    ModelConfig(**chosen.config)  # the combination the rules pick is a valid config
    snapshots = StreamProfile.of(src, dst, np.repeat([0.0, 1.0], 200))
    assert "latest_transition_at_query" not in choose_settings(snapshots, {}, None).config
    for explicit in ({"latest_transition_count": False}, {"latest_transition_at_query": False}):
        assert (
            "latest_transition_at_query" not in choose_settings(continuous, explicit, None).config
        )
    assert (
        "latest_transition_count"
        not in choose_settings(continuous, {"transition_buckets": 0}, None).config
    )


def test_patience_counts_training_events_on_long_streams() -> None:
    """A long stream stops after fewer epochs without a better validation AP (never under
    PATIENCE_MIN); short streams keep the default; the snapshot rule and an explicit
    patience win."""
    from training.auto_config import DEFAULT_PATIENCE, PATIENCE_EVENTS, PATIENCE_MIN

    def profile(n: int, t: np.ndarray | None = None) -> StreamProfile:
        src, dst = np.arange(n) % 97, 1000 + np.arange(n) % 89
        return StreamProfile.of(src, dst, np.arange(float(n)) if t is None else t)

    assert choose_settings(profile(PATIENCE_EVENTS // DEFAULT_PATIENCE), {}, None).patience is None
    long_stream = choose_settings(profile(PATIENCE_EVENTS // 3 + 1), {}, None)
    assert long_stream.patience == 3 and any("patience of 3" in r for r in long_stream.reasons)
    assert choose_settings(profile(PATIENCE_EVENTS), {}, None).patience == PATIENCE_MIN
    assert choose_settings(profile(PATIENCE_EVENTS), {}, None, explicit_patience=7).patience == 7


def test_unipartite_stream_keeps_the_defaults(data_dir) -> None:
    p = _profile(data_dir, "uci")
    assert not p.bipartite
    chosen = choose_settings(p, {}, None)
    assert "identity_match_dim" not in chosen.config
    assert "transition_buckets" not in chosen.config
    # UCI's pairs recur: historical negatives are mixed in.
    assert p.repeat_share >= 0.3 and chosen.historical_negatives == HISTORICAL_SHARE


def test_explicit_settings_win(data_dir) -> None:
    p = _profile(data_dir, "mooc")
    chosen = choose_settings(p, {"neighbour_list_len": 32, "transition_buckets": 0}, 0.0)
    assert chosen.config == {} and chosen.historical_negatives == 0.0
    assert "transition_decay" not in choose_settings(p, {"transition_decay": 0.0}, None).config
    # Too many items for the hash buckets: not a small item side, the lists stay short.
    assert "neighbour_list_len" not in choose_settings(p, {"node_hash_buckets": 16}, None).config


def test_a_model_without_pair_features_gets_no_pair_feature_rules(data_dir) -> None:
    """The ablation's "state only" model: the counts that are pair features (snapshot
    counts, role counts, transition counts) would not validate without them."""
    for name in ("mooc", "uslegis"):
        chosen = choose_settings(_profile(data_dir, name), {"use_pair_features": False}, None)
        picked = {"snapshot_pair_features", "role_counts", "transition_buckets"} & set(
            chosen.config
        )
        assert not picked, (name, picked)
        ModelConfig().with_updates(**chosen.config, use_pair_features=False)  # validates


def test_historical_negatives_also_where_no_pair_recurs() -> None:
    # Nothing in random negatives says what a past pair means when none recurs.
    src, dst = np.arange(100), np.arange(100, 200)
    p = StreamProfile.of(src, dst, np.arange(100.0))
    assert p.repeat_share == 0.0
    chosen = choose_settings(p, {}, None)
    assert chosen.historical_negatives == HISTORICAL_SHARE
    assert any("0% of training events repeat a pair" in r for r in chosen.reasons)


def test_snapshot_streams_train_with_batch_visibility(data_dir) -> None:
    # US Legis.: one timestamp per congress, thousands of events each.
    p = _profile(data_dir, "uslegis")
    assert p.snapshot_share >= SNAPSHOT_SHARE_MIN
    chosen = choose_settings(p, {}, None)
    assert chosen.visibility == "batch"
    assert any("batch visibility" in r for r in chosen.reasons)
    # An explicit visibility wins.
    assert choose_settings(p, {}, None, "exact").visibility == "exact"
    # Under batch visibility a unipartite snapshot stream gets the transition counts
    # too (the order inside a snapshot); under exact visibility it keeps them off.
    assert not p.bipartite and chosen.config["transition_buckets"] == TRANSITION_BUCKETS
    assert any(
        r.startswith("batch visibility (a snapshot stream): transition") for r in chosen.reasons
    )
    assert "transition_buckets" not in choose_settings(p, {}, None, "exact").config


def test_snapshot_streams_choose_epochs_on_all_three_negative_kinds(data_dir) -> None:
    p = _profile(data_dir, "uslegis")
    chosen = choose_settings(p, {}, None)
    assert (chosen.select_on, chosen.patience) == ("mean", SNAPSHOT_PATIENCE)
    assert any("mean of the random, historical and inductive" in r for r in chosen.reasons)
    assert p.snapshot_node_events > DENSE_SNAPSHOT_NODE_EVENTS
    # Explicit choices win: a given patience is kept, a given criterion ends the rule.
    assert choose_settings(p, {}, None, None, None, 3).patience == 3
    assert choose_settings(p, {}, None, None, None, 3).select_on == "mean"
    explicit = choose_settings(p, {}, None, None, "random")
    assert (explicit.select_on, explicit.patience) == ("random", None)
    # Exact visibility (given, or on a stream without snapshots) keeps the defaults.
    assert choose_settings(p, {}, None, "exact").select_on == "random"
    uci = choose_settings(_profile(data_dir, "uci"), {}, None)
    assert (uci.select_on, uci.patience) == ("random", None)


def test_sparse_snapshots_keep_epochs_chosen_on_random_negatives() -> None:
    # Batch visibility, but each node has only 10 events in a snapshot of 250.
    t = np.repeat([0.0, 1.0], 250)
    src = np.arange(500) % 25
    p = StreamProfile.of(src, src + 25, t)
    assert p.snapshot_node_events == 10.0 <= DENSE_SNAPSHOT_NODE_EVENTS
    chosen = choose_settings(p, {}, None)
    assert chosen.visibility == "batch"
    assert (chosen.select_on, chosen.patience) == ("random", None)


def test_continuous_time_streams_keep_exact_visibility(data_dir) -> None:
    p = _profile(data_dir, "uci")
    assert p.snapshot_share < SNAPSHOT_SHARE_MIN
    assert choose_settings(p, {}, None).visibility == "exact"


def test_snapshot_share_counts_only_groups_of_a_batch_or_more() -> None:
    # 300 events at t = 0 (a snapshot), then 300 events with distinct times, of which
    # pairs share a time (ties, but no snapshot).
    t = np.concatenate([np.zeros(SNAPSHOT_GROUP_MIN + 100), 1.0 + np.arange(300) // 2])
    src = np.arange(len(t))
    p = StreamProfile.of(src, src + len(t), t)
    assert p.snapshot_share == pytest.approx((SNAPSHOT_GROUP_MIN + 100) / len(t))
    assert p.tied_share == pytest.approx(1.0)


def test_snapshot_node_events_is_the_median_per_node_and_snapshot() -> None:
    # Two snapshots of 250 events; in each, nodes 0-4 send 50 events each to 5-9.
    t = np.repeat([0.0, 1.0], 250)
    src = np.arange(500) % 5
    p = StreamProfile.of(src, src + 5, t)
    assert p.snapshot_node_events == 50.0
    assert snapshot_list_len(p) == 64  # the next power of two above it
    # A stream without snapshots has none.
    assert StreamProfile.of(src, src + 5, np.arange(500.0)).snapshot_node_events == 0.0


def test_snapshot_streams_get_lists_that_hold_a_snapshot(data_dir) -> None:
    # US Legis.: each congress joins every pair of its ~100 senators once.
    p = _profile(data_dir, "uslegis")
    assert p.snapshot_node_events > 64
    chosen = choose_settings(p, {}, None)
    assert chosen.config["neighbour_list_len"] == 128
    assert any("hold the snapshot so far" in r for r in chosen.reasons)
    assert chosen.config["snapshot_pair_features"] is True  # batch visibility: count it
    # An explicit choice wins; exact visibility and streams without snapshots get none.
    assert (
        "snapshot_pair_features"
        not in choose_settings(p, {"snapshot_pair_features": False}, None).config
    )
    assert "snapshot_pair_features" not in choose_settings(p, {}, None, "exact").config
    assert (
        "snapshot_pair_features" not in choose_settings(_profile(data_dir, "uci"), {}, None).config
    )
    # An explicit length, or exact visibility (nothing of the snapshot is seen), wins.
    assert "neighbour_list_len" not in choose_settings(p, {"neighbour_list_len": 32}, None).config
    assert "neighbour_list_len" not in choose_settings(p, {}, None, "exact").config
    # Never longer than the cap, however busy a snapshot.
    busy = StreamProfile(**{**p.__dict__, "snapshot_node_events": 10_000.0})
    assert snapshot_list_len(busy) == SNAPSHOT_LIST_MAX


def test_sparse_snapshots_keep_the_default_lists(data_dir) -> None:
    # Can. Parl.: a member has about 15 events a year, which the default 32 holds.
    p = _profile(data_dir, "canparl")
    assert p.snapshot_share >= SNAPSHOT_SHARE_MIN and p.snapshot_node_events <= 32
    chosen = choose_settings(p, {}, None)
    assert chosen.visibility == "batch" and "neighbour_list_len" not in chosen.config


def test_snapshot_streams_get_role_counts_in_snapshot_units(data_dir) -> None:
    # Can. Parl.: one snapshot a year (timestamps in seconds).
    p = _profile(data_dir, "canparl")
    assert p.snapshot_spacing == pytest.approx(365 * 86400, rel=0.01)
    chosen = choose_settings(p, {}, None)
    assert chosen.config["role_counts"] is True
    assert chosen.config["role_count_unit"] == p.snapshot_spacing
    assert any("role counts" in r for r in chosen.reasons)
    # An explicit unit is kept; an explicit "off", exact visibility and streams without
    # snapshots get none.
    assert choose_settings(p, {"role_count_unit": 7.0}, None).config.get("role_count_unit") is None
    assert "role_counts" not in choose_settings(p, {"role_counts": False}, None).config
    assert "role_counts" not in choose_settings(p, {}, None, "exact").config
    uci = _profile(data_dir, "uci")
    assert uci.snapshot_spacing == 0.0
    assert "role_counts" not in choose_settings(uci, {}, None).config
