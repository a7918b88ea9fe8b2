from __future__ import annotations

import numpy as np
import pytest

from training.data import chronological_split, read_edge_stream


@pytest.mark.parametrize(
    "name, rows, nodes, features",
    [
        ("uci", 59_835, 1_899, ()),
        ("mooc", 411_749, 7_144, ("f0", "f1", "f2", "f3")),
        ("bitcoin-otc", 35_592, 5_881, ("rating",)),
    ],
)
def test_real_files(data_dir, name, rows, nodes, features):
    s = read_edge_stream(data_dir / name / "edges.csv.gz")
    assert len(s) == rows
    assert len(s.nodes) == nodes
    assert s.feature_names == features
    assert s.features.shape == (rows, len(features)) and s.features.dtype == np.float32
    assert s.t.dtype == np.float64 and np.all(np.diff(s.t) >= 0)
    assert isinstance(s.src[0], str)


def test_split_follows_dyglib(data_dir):
    s = read_edge_stream(data_dir / "uci" / "edges.csv.gz")
    sp = chronological_split(s)
    assert sp.val_time == pytest.approx(np.quantile(s.t, 0.70))
    assert sp.test_time == pytest.approx(np.quantile(s.t, 0.85))
    assert not (sp.train & sp.val).any() and not (sp.val & sp.test).any()
    assert s.t[sp.train].max() <= sp.val_time < s.t[sp.test].min()
    # held-out nodes never appear in training, and make up about 10% of the nodes
    assert not (set(s.src[sp.train]) | set(s.dst[sp.train])) & sp.new_nodes
    assert len(sp.new_nodes) == int(0.1 * len(s.nodes))
    assert sp.inductive(s, sp.test).sum() > 0


def test_limit_reads_a_prefix(data_dir):
    s = read_edge_stream(data_dir / "uci", limit=100)
    assert len(s) == 100
