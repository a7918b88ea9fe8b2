"""model.streaming.advance: the rank-major packed kernel (``apply_ranked``, the serving
path) and the segmented step (models without that kernel, e.g. ONNX) must both give
the states of a plain fold of ``step``, from initial and from carried states."""

from __future__ import annotations

import pytest
import torch

import model.streaming as streaming
from model.config import ModelConfig
from model.events import EventInputs, NodeEvent, advance_stepwise, pad_events
from model.link_model import DygMambaLinkModel
from model.node_state import NeighbourLists, NodeStates
from model.rank_plan import RankPlan


def _events(lengths: tuple[int, ...], t0: float, gen: torch.Generator) -> list[list[NodeEvent]]:
    per_node = []
    for n_events in lengths:
        t = t0 + torch.cumsum(torch.rand(n_events, generator=gen, dtype=torch.float64) * 10, 0)
        t[1::3] = t[0::3][: len(t[1::3])]  # some equal timestamps: zero gaps
        t = torch.cummax(t, 0).values
        per_node.append(
            [
                NodeEvent(int(k) * 7 + 1, int(k % 2), [0.5, -float(k)], float(t[k]), int(k))
                for k in range(n_events)
            ]
        )
    return per_node


def _carried_states(n: int, cfg: ModelConfig, gen: torch.Generator) -> NodeStates:
    s = NodeStates.initial(n, cfg)
    s.h = torch.randn(s.h.shape, generator=gen)
    s.conv = torch.randn(s.conv.shape, generator=gen)
    s.t_last = torch.where(
        torch.arange(n) % 2 == 0, torch.full((n,), -5.0, dtype=torch.float64), s.t_last
    )
    s.n_events = torch.where(torch.isfinite(s.t_last), 3, 0)
    return s


def _fold_step(
    model: DygMambaLinkModel, s0: NodeStates, i: int, events: list[NodeEvent]
) -> NodeStates:
    cur = s0.select([i])
    with torch.no_grad():
        for e in events:
            ev = EventInputs(
                torch.tensor([e.other_key]),
                torch.tensor([e.role]),
                torch.tensor([list(e.features)], dtype=torch.float32),
                torch.tensor([e.t], dtype=torch.float64),
                torch.tensor([e.seq]),
            )
            cur = model.step(cur, ev)
    return cur


@pytest.mark.parametrize("route", ["ranked", "stepwise", "ranked_small_blocks"])
@pytest.mark.parametrize("n_layers,d_conv", [(1, 4), (2, 4), (2, 1)])
@pytest.mark.parametrize("carried", [False, True])
def test_advance_equals_a_fold_of_step(route, n_layers, d_conv, carried, monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(edge_feature_dim=2, n_layers=n_layers, d_conv=d_conv)
    model = DygMambaLinkModel(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    per_node = _events((1, 3, 33, 120, 0, 40, 2, 0), 0.0, gen)
    s0 = (
        _carried_states(len(per_node), cfg, gen)
        if carried
        else NodeStates.initial(len(per_node), cfg)
    )
    if route == "stepwise":
        out = advance_stepwise(model, s0, per_node)
    else:
        if route == "ranked_small_blocks":  # forces many runs of ranks (bounded memory path)
            layer_ranked = type(model.layers[0]).ranked
            monkeypatch.setattr(
                type(model.layers[0]),
                "ranked",
                lambda self, *a, **k: layer_ranked(self, *a, **{**k, "block_elements": 3000}),
            )
        out = streaming.advance(model, s0, per_node)
    for i, events in enumerate(per_node):
        ref = _fold_step(model, s0, i, events)
        torch.testing.assert_close(out.h[i : i + 1], ref.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.conv[i : i + 1], ref.conv, rtol=1e-5, atol=1e-5)
        assert int(out.n_events[i]) == int(s0.n_events[i]) + len(events)
        assert float(out.t_last[i]) == float(ref.t_last[0]) or (
            not events and not torch.isfinite(out.t_last[i])
        )
        assert int(out.last_seq[i]) == int(ref.last_seq[0])


def test_ranked_agrees_with_the_scan():
    """The packed kernel and the associative scan are different computations of one recurrence."""
    torch.manual_seed(3)
    cfg = ModelConfig(edge_feature_dim=2, n_layers=2)
    model = DygMambaLinkModel(cfg).eval()
    gen = torch.Generator().manual_seed(4)
    per_node = _events((5, 64, 17, 1), 100.0, gen)
    s0 = _carried_states(len(per_node), cfg, gen)
    ranked = streaming.advance(model, s0, per_node)
    ev, lengths = pad_events(per_node, cfg.edge_feature_dim)
    with torch.no_grad():
        scanned, _ = model.scan(s0, ev, lengths)
    torch.testing.assert_close(ranked.h, scanned.h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ranked.conv, scanned.conv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("delta_min", [0.0, 1e-4, 0.05])
@pytest.mark.parametrize("route", ["ranked", "ranked_small_blocks"])
def test_ranked_scan_and_step_agree_on_zero_and_huge_gaps(delta_min, route, monkeypatch):
    """The clamp of the event step (floor at zero gaps, cap at huge ones) is the same in
    the rank-major kernel, the scan and the step, from carried and initial states."""
    torch.manual_seed(7)
    cfg = ModelConfig(edge_feature_dim=2, n_layers=2, delta_min=delta_min)
    model = DygMambaLinkModel(cfg).eval()
    gen = torch.Generator().manual_seed(8)
    per_node = _events((6, 30, 1, 12, 0), 10.0, gen)
    # zero gaps everywhere in one node, a huge gap (every decay flushed) in two others
    per_node[0] = [e._replace(t=per_node[0][0].t) for e in per_node[0]]
    for i in (1, 3):
        k = len(per_node[i]) // 2
        per_node[i] = per_node[i][:k] + [e._replace(t=e.t + 1e18) for e in per_node[i][k:]]
    if route == "ranked_small_blocks":
        layer_ranked = type(model.layers[0]).ranked
        monkeypatch.setattr(
            type(model.layers[0]),
            "ranked",
            lambda self, *a, **k: layer_ranked(self, *a, **{**k, "block_elements": 500}),
        )
    s0 = _carried_states(len(per_node), cfg, gen)
    s0.t_last = torch.where(torch.isfinite(s0.t_last), 5.0, s0.t_last)
    ranked = streaming.advance(model, s0, per_node)
    ev, lengths = pad_events(per_node, cfg.edge_feature_dim)
    with torch.no_grad():
        scanned, _ = model.scan(s0, ev, lengths, chunk=8)
    for i, events in enumerate(per_node):
        ref = _fold_step(model, s0, i, events)
        torch.testing.assert_close(ranked.h[i : i + 1], ref.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scanned.h[i : i + 1], ref.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ranked.conv[i : i + 1], ref.conv, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ranked.h).all()


def test_no_events_leaves_states_unchanged():
    cfg = ModelConfig()
    model = DygMambaLinkModel(cfg).eval()
    s0 = _carried_states(3, cfg, torch.Generator().manual_seed(0))
    out = streaming.advance(model, s0, [[], [], []])
    assert (
        torch.equal(out.h, s0.h)
        and torch.equal(out.conv, s0.conv)
        and torch.equal(out.n_events, s0.n_events)
    )


def test_rank_plan_layout():
    plan = RankPlan.build([2, 0, 3, 1])
    # sorted longest first: original rows 2 (3 events), 0 (2), 3 (1), 1 (0)
    assert plan.order.tolist() == [2, 0, 3, 1]
    assert plan.counts.tolist() == [3, 2, 1]
    assert plan.offsets.tolist() == [0, 3, 5, 6]
    assert plan.node_of.tolist() == [0, 1, 2, 0, 1, 0]
    assert plan.rank_of.tolist() == [0, 0, 0, 1, 1, 2]
    # node-major listing (node 0: ranks 0,1,2; node 1: 0,1; node 2: 0) -> packed slots
    assert plan.packed_pos.tolist() == [0, 3, 5, 1, 4, 2]
    prev, has = plan.previous_event()
    assert has.tolist() == [False, False, False, True, True, True]
    assert prev[has].tolist() == [0, 1, 3]
    assert plan.last_event().tolist() == [5, 4, 2, 0]
    # d_conv = 3 (k1 = 2): event (rank 1, node 0) sees tail[0][1], x(rank 0), x(rank 1)
    windows = plan.conv_windows(2)
    e = 3  # rank 1, node 0
    assert windows[e].tolist() == [6 + 0 * 2 + 1, 0, 3]
    tails = plan.final_tails(2)
    assert tails[0].tolist() == [3, 5]  # last two events of node 0
    assert tails[2].tolist() == [6 + 2 * 2 + 1, 2]  # node 2: tail[1] then its only event
    assert tails[3].tolist() == [6 + 3 * 2, 6 + 3 * 2 + 1]  # no events: the tail stays


@pytest.mark.parametrize("same_time", [True, False])
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"use_pair_features": False},
        {"use_state": False},
        {"identity_match_dim": 8},
        {"identity_match_dim": 8, "identity_match_depth": 3},
        {"snapshot_pair_features": True},
    ],
)
def test_score_nodes_equals_score_of_gathered_pairs(same_time, variant):
    """The service's indexed scoring (each node read out once) against ``score`` on
    states copied out per pair, with repeated nodes, never-seen nodes and queries
    before a node's last event."""
    gen = torch.Generator().manual_seed(5)
    cfg = ModelConfig(edge_feature_dim=2, neighbour_list_len=6, **variant)
    model = DygMambaLinkModel(cfg).eval()
    per_node = _events((3, 0, 7, 1, 5, 2), 0.0, gen)
    states = streaming.advance(model, _carried_states(6, cfg, gen), per_node)
    lists = NeighbourLists.empty(6, 6).extended(per_node)
    keys = torch.arange(6, dtype=torch.int64) * 7 + 1  # node keys that also occur as neighbours
    iu = torch.tensor([0, 0, 2, 3, 5, 1, 4])
    iv = torch.tensor([2, 4, 2, 1, 0, 1, 3])
    tau = (
        torch.full((7,), 40.0, dtype=torch.float64)
        if same_time
        else torch.tensor([40.0, 3.0, 12.5, 60.0, 0.0, 8.0, 25.0], dtype=torch.float64)
    )
    got = streaming.score_nodes(model, states, lists, keys, iu, iv, tau)
    want = streaming.score(
        model,
        states.select(iu),
        states.select(iv),
        keys[iu],
        keys[iv],
        tau,
        lists.select(iu),
        lists.select(iv),
    )
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got.shape == (7,) and not torch.equal(got[0], got[1])  # the pairs differ


def test_chunked_read_out_equals_one_pass() -> None:
    """The serving path reads states out in cache-sized row chunks; rows must not notice."""
    from model.ssm import CACHE_BLOCK_ELEMENTS

    torch.manual_seed(4)
    cfg = ModelConfig()
    model = DygMambaLinkModel(cfg).eval()
    rows = CACHE_BLOCK_ELEMENTS // (cfg.n_layers * cfg.d_inner * cfg.d_state)
    n = 3 * rows + 5
    h = torch.randn(n, cfg.n_layers, cfg.d_inner, cfg.d_state)
    t_last = torch.rand(n, dtype=torch.float64) * 100
    t_last[::7] = float("-inf")
    tau = t_last.nan_to_num(neginf=0.0) + torch.rand(n, dtype=torch.float64) * 50
    with torch.no_grad():
        torch.testing.assert_close(
            model.node_readout_chunked(h, t_last, tau),
            model.node_readout(h, t_last, tau),
            rtol=1e-6,
            atol=1e-6,
        )
        small = model.node_readout_chunked(h[:3], t_last[:3], tau[:3])
    assert small.shape == (3, cfg.d_out) and rows > 1
