"""The cold rebuild in the kernels' layout (padded, Delta and u = Delta_in x / Delta,
D and the gate outside, each conv tail gathered at its node's length), run here through
the CPU twin of the kernels, equals the model's own rank-major path (``ranked``) and its
associative scan (``scan``) from the zero state. This checks the reparametrisation on
every machine; tests/model/kernels/test_cuda_kernels.py swaps in the CUDA kernels."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.events import NodeEvent, pad_events
from model.kernels.cold_scan import cold_scan
from model.kernels.ops import TWIN_OPS
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.streaming import advance
from tests.support.histories import stream_histories
from training.data import read_edge_stream

RTOL, ATOL = 1e-5, 1e-5


def _events(lengths, gap_kind: str, feature_dim: int, seed: int) -> list[list[NodeEvent]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        gaps = torch.rand(n, generator=g, dtype=torch.float64) * 3
        if gap_kind == "zero":
            gaps[:] = 0.0
        elif gap_kind == "huge" and n > 2:
            gaps[n // 2] = 1e15  # every decay flushed: Delta is capped at delta_max
        elif gap_kind == "mixed":
            gaps[gaps < 1.5] = 0.0
        t = 1e6 + torch.cumsum(gaps, 0)
        out.append(
            [
                NodeEvent(
                    int(torch.randint(0, 2**62, (1,), generator=g)),
                    k % 2,
                    torch.randn(feature_dim, generator=g).tolist(),
                    float(t[k]),
                    k,
                )
                for k in range(n)
            ]
        )
    return out


def _assert_states_close(a: NodeStates, b: NodeStates) -> None:
    torch.testing.assert_close(a.h, b.h, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(a.conv, b.conv, rtol=RTOL, atol=ATOL)
    assert torch.equal(a.t_last, b.t_last)
    assert torch.equal(a.last_seq, b.last_seq)
    assert torch.equal(a.n_events, b.n_events)


@pytest.mark.parametrize("gap_kind", ["regular", "zero", "huge", "mixed"])
@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(),
        ModelConfig(n_layers=3, d_conv=2, edge_feature_dim=3, d_state=5),
        ModelConfig(n_layers=2, d_conv=1, expand=1, time_encoder="sinusoidal"),
        ModelConfig(d_conv=4, delta_min=0.05, node_hash_buckets=0),
    ],
    ids=["default", "3-layers-conv2", "conv1", "coarse-floor"],
)
def test_twin_cold_scan_equals_ranked_and_scan(cfg, gap_kind):
    torch.manual_seed(0)
    model = DygMambaLinkModel(cfg).eval()
    per_node = _events((17, 1, 40, 0, 5, 40), gap_kind, cfg.edge_feature_dim, seed=1)
    s0 = NodeStates.initial(len(per_node), cfg)
    with torch.no_grad():
        kernel = cold_scan(model, TWIN_OPS, per_node)
        ranked = advance(model, s0, per_node)
        ev, lengths = pad_events(per_node, cfg.edge_feature_dim)
        scanned, _ = model.scan(s0, ev, lengths)
    _assert_states_close(kernel, ranked)
    _assert_states_close(kernel, scanned)


def test_twin_cold_scan_on_real_uci_histories(data_dir):
    """The bundled model's shapes, with a step floor, on the first 3,000 UCI events."""
    torch.manual_seed(0)
    model = DygMambaLinkModel(ModelConfig(n_layers=2)).eval()
    _, per_node = stream_histories(read_edge_stream(data_dir / "uci", limit=3000))
    s0 = NodeStates.initial(len(per_node), model.config)
    with torch.no_grad():
        kernel = cold_scan(model, TWIN_OPS, per_node)
        ranked = advance(model, s0, per_node)
    assert max(len(e) for e in per_node) > 100  # hubs: long padded rows beside short ones
    _assert_states_close(kernel, ranked)


def test_no_events_keeps_the_initial_state():
    cfg = ModelConfig()
    model = DygMambaLinkModel(cfg).eval()
    with torch.no_grad():
        out = cold_scan(model, TWIN_OPS, [[], []])
    _assert_states_close(out, NodeStates.initial(2, cfg))


def test_the_check_has_teeth():
    """Dropping the u = x / Delta fold (feeding the kernels d_in * x) is caught."""
    torch.manual_seed(0)
    model = DygMambaLinkModel(ModelConfig()).eval()
    per_node = _events((12, 7), "regular", 0, seed=2)
    layer = model.ssm_layers()[0]
    with torch.no_grad():
        ranked = advance(model, NodeStates.initial(2, model.config), per_node)
        original = layer.kernel_input
        layer.kernel_input = lambda dx, delta: dx  # type: ignore[method-assign]
        try:
            wrong = cold_scan(model, TWIN_OPS, per_node)
        finally:
            layer.kernel_input = original  # type: ignore[method-assign]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong.h, ranked.h, rtol=RTOL, atol=ATOL)
