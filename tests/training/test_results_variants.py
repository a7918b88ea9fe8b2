"""The ablation rows of ``training.results``: each one takes away exactly what it names
from what the trainer chose for the stream, and is trained only where there is
something to take away."""

from __future__ import annotations

import numpy as np
import pytest

from training.auto_config import StreamProfile, choose_settings
from training.batches import IndexedStream
from training.data import chronological_split, read_edge_stream
from training.results import VARIANTS


def _chosen_config(data_dir, name: str, explicit: dict) -> dict:
    stream = read_edge_stream(data_dir / name / "edges.csv.gz", limit=20000)
    data, split = IndexedStream.build(stream), chronological_split(stream)
    ev = np.where(split.train)[0]
    profile = StreamProfile.of(data.src[ev], data.dst[ev], data.t[ev])
    # What train() runs with: the explicit settings over the rules that skip them.
    return {**choose_settings(profile, explicit, None).config, **explicit}


# Settings that only qualify a lever (what the rule sets with it): gone with it.
COMPANIONS = {
    "identity_match_dim": {"identity_match_depth"},
    "role_counts": {"role_count_unit"},
    "transition_buckets": {
        "transition_decay",
        "transition_order2",
        "latest_transition_count",
        "latest_transition_at_query",
    },
    "latest_transition_count": {"latest_transition_at_query"},
}


@pytest.mark.parametrize(
    ("stream", "variant", "lever"),
    [
        ("mooc", "no_transitions", "transition_buckets"),
        ("mooc", "no_transition_decay", "transition_decay"),
        ("mooc", "no_transition_order2", "transition_order2"),
        ("mooc", "no_latest_transition", "latest_transition_count"),
        ("canparl", "no_role_counts", "role_counts"),
    ],
)
def test_a_row_takes_away_only_its_own_lever(data_dir, stream, variant, lever) -> None:
    full = _chosen_config(data_dir, stream, {})
    spec = VARIANTS[variant]
    assert spec.applies(full) and full[lever]
    row = _chosen_config(data_dir, stream, spec.change(full))
    assert not row.get(lever)
    # Everything else the trainer chose for the full model is kept (the lists of 128
    # included), except what the row itself names.
    changed = set(spec.change(full)) | COMPANIONS.get(lever, set())
    assert {k: v for k, v in full.items() if k not in changed} == {
        k: v for k, v in row.items() if k not in changed and k in full
    }
    assert full.get("neighbour_list_len") == row.get("neighbour_list_len")


def test_rows_without_anything_to_take_away_are_not_trained(data_dir) -> None:
    uci = _chosen_config(data_dir, "uci", {})
    rows = (
        "identity_match",
        "no_identity_match",
        "no_transitions",
        "no_transition_decay",
        "no_transition_order2",
        "no_latest_transition",
    )
    for variant in (*rows, "no_role_counts"):
        assert not VARIANTS[variant].applies(uci), variant
    for variant in ("state_only", "features_only", "linear_time"):
        assert VARIANTS[variant].applies(uci), variant
    assert not VARIANTS["linear_time"].applies({"time_encoder": "linear"})


def test_the_identity_match_row_adds_it_to_the_long_lists_only(data_dir) -> None:
    """The lever no default takes any more, as a row that adds it back: the trainer's
    choice for MOOC plus the match, nothing else changed; not on a stream without the
    small item side's lists of 128, nor where the match is already on."""
    full = _chosen_config(data_dir, "mooc", {})
    spec = VARIANTS["identity_match"]
    assert spec.applies(full) and not full.get("identity_match_dim")
    row = _chosen_config(data_dir, "mooc", spec.change(full))
    assert row["identity_match_dim"] == 128 and row["identity_match_depth"] == 3
    assert {k: v for k, v in row.items() if not k.startswith("identity_match")} == full
    assert not spec.applies(_chosen_config(data_dir, "uci", {}))
    assert not spec.applies(row)
