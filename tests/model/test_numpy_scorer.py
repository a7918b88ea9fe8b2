"""model.numpy_scorer, the service's kernel for calls of a few pairs, against the torch
path it repeats (``streaming.score_nodes``), for every model variant: several layers,
identity match, no state, no pair features, snapshot counts, role counts; stale, fresh and never-seen nodes;
neighbours before, at and after the query time; one query time and many."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from model.node_state import PAD_KEY, NeighbourLists, NodeStates
from model.numpy_scorer import NumpyScorer, latest_visible_neighbours, pair_features
from model.pair_features import latest_visible_neighbours as torch_latest_visible
from model.pair_features import pair_features as torch_pair_features
from model.role_counts import advance_records, empty_records
from model.streaming import score_nodes
from model.transition_counts import DenseTransitions, record_width
from service.settings import DEFAULT_CHECKPOINT

N_NODES = 12


def _nodes(
    cfg: ModelConfig, gen: torch.Generator
) -> tuple[NodeStates, NeighbourLists, torch.Tensor]:
    """Random node states and neighbour lists drawn from a small key range, so that
    pairs share neighbours and repeat each other."""
    s = NodeStates.initial(N_NODES, cfg)
    s.h = torch.randn(s.h.shape, generator=gen)
    t_last = torch.rand(N_NODES, generator=gen, dtype=torch.float64) * 2000.0
    s.t_last = torch.where(torch.arange(N_NODES) % 4 == 3, float("-inf"), t_last)  # some never seen
    s.n_events = torch.where(
        torch.isfinite(s.t_last), torch.randint(1, 500, (N_NODES,), generator=gen), 0
    )
    length = cfg.neighbour_list_len
    keys = torch.randint(0, 9, (N_NODES, length), generator=gen)
    times = torch.rand((N_NODES, length), generator=gen, dtype=torch.float64) * 2500.0
    fill = torch.randint(0, length + 1, (N_NODES,), generator=gen)
    empty = torch.arange(length).unsqueeze(0) < (length - fill).unsqueeze(1)  # right-aligned lists
    lists = NeighbourLists(
        keys=torch.where(empty, PAD_KEY, keys), times=torch.where(empty, float("inf"), times)
    )
    if cfg.role_counts:  # records of up to 40 events per node at 5 snapshot times
        per_node = []
        for _ in range(N_NODES):
            n = int(torch.randint(0, 40, (1,), generator=gen))
            t = torch.sort(torch.randint(0, 5, (n,), generator=gen)).values * 500.0
            roles = torch.randint(0, 2, (n,), generator=gen)
            per_node.append(
                [SimpleNamespace(t=float(a), role=int(r)) for a, r in zip(t, roles, strict=True)]
            )
        lists.records = torch.from_numpy(advance_records(empty_records(N_NODES), per_node))
    if cfg.transition_buckets:  # counts at the buckets of the small key range, and beyond
        width = record_width(cfg.transition_buckets, cfg.transition_decay, cfg.transition_order2)
        counts = torch.randint(0, 6, (N_NODES, width), generator=gen).numpy().astype(np.float32)
        if cfg.transition_decay:  # decayed counts are fractions
            counts[:, cfg.transition_buckets :] *= 0.37
        lists.transitions = DenseTransitions(counts, cfg.transition_buckets, cfg.transition_decay)
    node_keys = (
        torch.arange(N_NODES, dtype=torch.int64) % 9
    )  # node keys collide with neighbour keys
    return s, lists, node_keys


def _pairs(
    n: int, same_time: bool, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    iu = torch.randint(0, N_NODES, (n,), generator=gen)
    iv = torch.randint(0, N_NODES, (n,), generator=gen)
    tau = torch.rand(n, generator=gen, dtype=torch.float64) * 2500.0
    if same_time:
        tau = tau[:1].expand(n).clone()
    return iu, iv, tau


def _numpy_logits(
    scorer: NumpyScorer, s: NodeStates, lists: NeighbourLists, keys, iu, iv, tau
) -> np.ndarray:
    return scorer.score_nodes(
        s.h.numpy(),
        s.t_last.numpy(),
        s.n_events.numpy(),
        lists.keys.numpy(),
        lists.times.numpy(),
        keys.numpy(),
        iu.numpy(),
        iv.numpy(),
        tau.numpy(),
        None if lists.records is None else lists.records.numpy(),
        None if lists.transitions is None else lists.transitions.counts,
    )


VARIANTS = {
    "default": {},
    "two_layers": {"n_layers": 2},
    "identity_match": {"identity_match_dim": 8, "identity_match_depth": 3},
    "no_state": {"use_state": False, "identity_match_dim": 4},
    "no_pair_features": {"use_pair_features": False},
    "snapshot_counts": {"snapshot_pair_features": True},
    "role_counts": {"snapshot_pair_features": True, "role_counts": True, "role_count_unit": 500.0},
    "transition_counts": {"transition_buckets": 7},
    "decayed_transition_counts": {"transition_buckets": 7, "transition_decay": 400.0},
    "second_order_transition_counts": {
        "transition_buckets": 7,
        "transition_decay": 400.0,
        "transition_order2": True,
    },
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("same_time", [True, False])
def test_numpy_scorer_equals_torch_score_nodes(variant, same_time):
    torch.manual_seed(0)
    cfg = ModelConfig(neighbour_list_len=16, **VARIANTS[variant])
    model = DygMambaLinkModel(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    s, lists, keys = _nodes(cfg, gen)
    iu, iv, tau = _pairs(40, same_time, gen)
    if cfg.snapshot_pair_features:  # snapshots: many list entries share a time, some tau
        lists.times, tau = (
            torch.floor(lists.times / 500.0) * 500.0,
            torch.floor(tau / 500.0) * 500.0,
        )
    expected = score_nodes(model, s, lists, keys, iu, iv, tau).numpy()
    got = _numpy_logits(NumpyScorer(model), s, lists, keys, iu, iv, tau)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)
    assert np.ptp(expected) > 0.01  # the pairs differ: equal outputs are not one constant


def test_numpy_scorer_equals_torch_on_the_bundled_checkpoint():
    ck = load_checkpoint(DEFAULT_CHECKPOINT)
    gen = torch.Generator().manual_seed(2)
    s, lists, keys = _nodes(ck.config, gen)
    for same_time in (True, False):
        iu, iv, tau = _pairs(25, same_time, gen)
        expected = score_nodes(ck.model, s, lists, keys, iu, iv, tau).numpy()
        np.testing.assert_allclose(
            _numpy_logits(NumpyScorer(ck.model), s, lists, keys, iu, iv, tau),
            expected,
            rtol=1e-5,
            atol=2e-5,
        )


def test_pair_features_and_latest_neighbours_equal_their_torch_twins():
    cfg = ModelConfig(neighbour_list_len=16)
    gen = torch.Generator().manual_seed(3)
    s, lists, keys = _nodes(cfg, gen)
    iu, iv, tau = _pairs(60, False, gen)
    args = (
        keys[iu],
        keys[iv],
        tau,
        lists.keys[iu],
        lists.times[iu],
        lists.keys[iv],
        lists.times[iv],
        s.n_events[iu],
        s.n_events[iv],
        s.t_last[iu],
        s.t_last[iv],
        cfg.time_norm,
    )
    expected = torch_pair_features(*args).numpy()
    got = pair_features(*(a.numpy() if isinstance(a, torch.Tensor) else a for a in args))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert (expected[:, 0] > 0).any() and (
        expected[:, 4] == 0
    ).any()  # repeats and never-seen pairs both present
    np.testing.assert_array_equal(
        latest_visible_neighbours(
            lists.keys.numpy(), lists.times.numpy(), tau[:N_NODES].numpy(), 4
        ),
        torch_latest_visible(lists.keys, lists.times, tau[:N_NODES], 4).numpy(),
    )


def test_extreme_query_times_agree_without_warnings():
    """The wire allows |t| up to 1e20: such gaps decay states to exactly 0 in both
    kernels, and numpy meets no floating-point error on the way (raised here)."""
    ck = load_checkpoint(DEFAULT_CHECKPOINT)
    s, lists, keys = _nodes(ck.config, torch.Generator().manual_seed(4))
    iu, iv = torch.arange(N_NODES), torch.arange(N_NODES).flip(0)
    for t in (1e20, -1e20, 1e12):
        tau = torch.full((N_NODES,), t, dtype=torch.float64)
        with np.errstate(all="raise"):
            got = _numpy_logits(NumpyScorer(ck.model), s, lists, keys, iu, iv, tau)
        np.testing.assert_allclose(
            got, score_nodes(ck.model, s, lists, keys, iu, iv, tau).numpy(), rtol=1e-5, atol=2e-5
        )
