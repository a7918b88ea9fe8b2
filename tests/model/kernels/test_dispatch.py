"""The advance dispatch: which path a model takes where, and the kernel path's split of a
batch (cold nodes -> padded batch scan; carried states with a few events -> one
``selective_state_update`` per rank; long catch-ups -> rank-major), run with the CPU twin
of the kernels and compared with torch's rank-major advance of the whole batch."""

from __future__ import annotations

import pytest
import torch

import model.kernels.dispatch as dispatch
from model.config import ModelConfig
from model.events import NodeEvent
from model.kernels.dispatch import KernelAdvancer, kernel_advancer
from model.kernels.ops import TWIN_OPS, KernelOps, load_mamba_ops
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.streaming import advance
from tests.support.histories import stream_histories
from training.data import read_edge_stream


class CountingOps:
    """The twin's functions, counting their calls (which branch ran)."""

    def __init__(self) -> None:
        self.calls = {"scan": 0, "conv": 0, "step": 0}

    def ops(self) -> KernelOps:
        def counted(name, fn):
            def call(*a, **k):
                self.calls[name] += 1
                return fn(*a, **k)

            return call

        return KernelOps(
            "twin",
            counted("scan", TWIN_OPS.selective_scan),
            counted("conv", TWIN_OPS.causal_conv1d),
            counted("step", TWIN_OPS.selective_state_update),
        )


def _carried(states: NodeStates, rows: list[int], gen: torch.Generator) -> None:
    """Give ``rows`` a state from earlier events (as a blob would carry)."""
    for i in rows:
        states.h[i] = torch.randn(states.h[i].shape, generator=gen)
        states.conv[i] = torch.randn(states.conv[i].shape, generator=gen)
        states.t_last[i] = 0.0  # before every UCI event
        states.n_events[i] = 4
        states.last_seq[i] = -2


@pytest.mark.parametrize("n_layers", [1, 2])
def test_mixed_batch_through_the_twin_equals_rank_major(n_layers, data_dir):
    torch.manual_seed(0)
    model = DygMambaLinkModel(ModelConfig(n_layers=n_layers)).eval()
    _, per_node = stream_histories(read_edge_stream(data_dir / "uci", limit=1500))
    per_node = per_node[:120]
    s0 = NodeStates.initial(len(per_node), model.config)
    gen = torch.Generator().manual_seed(1)
    _carried(s0, list(range(0, 120, 3)), gen)
    lengths = [len(e) for e in per_node]
    carried = set(range(0, 120, 3))
    # every branch has rows: cold, carried with few events, carried with many
    assert any(i not in carried and n for i, n in enumerate(lengths))
    assert any(i in carried and 0 < n <= 16 for i, n in enumerate(lengths))
    assert any(i in carried and n > 16 for i, n in enumerate(lengths))
    counting = CountingOps()
    adv = KernelAdvancer(model, torch.device("cpu"), counting.ops(), "twin", "test")
    out = adv.advance(s0, per_node)
    ref = advance(model, s0, per_node)
    torch.testing.assert_close(out.h, ref.h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.conv, ref.conv, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.t_last, ref.t_last) and torch.equal(out.n_events, ref.n_events)
    assert torch.equal(out.last_seq, ref.last_seq)
    assert counting.calls["scan"] >= n_layers and counting.calls["conv"] >= n_layers
    assert counting.calls["step"] >= n_layers * 2  # one call per rank per layer


def test_small_cold_batches_by_length_give_the_same_states():
    torch.manual_seed(0)
    model = DygMambaLinkModel(ModelConfig()).eval()
    per_node = [
        [NodeEvent(k, 0, [], float(t), t) for t in range(n)]
        for k, n in enumerate((30, 2, 9, 0, 17))
    ]
    s0 = NodeStates.initial(len(per_node), model.config)
    tight = KernelAdvancer(model, torch.device("cpu"), TWIN_OPS, "twin", "", max_padded_events=20)
    out = tight.advance(s0, per_node)  # one node per batch here
    ref = advance(model, s0, per_node)
    torch.testing.assert_close(out.h, ref.h, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.n_events, ref.n_events)


def test_cpu_takes_rank_major():
    model = DygMambaLinkModel(ModelConfig()).eval()
    adv = kernel_advancer(model, torch.device("cpu"))
    assert (adv.path, adv.ops) == ("torch-cpu", None)


def test_cuda_without_mamba_takes_torch_on_cuda():
    ops, why = load_mamba_ops()
    if ops is not None:
        pytest.skip("mamba-ssm imports here: the kernel path applies")
    adv = kernel_advancer(DygMambaLinkModel(ModelConfig()).eval(), torch.device("cuda"))
    assert adv.path == "torch-cuda" and adv.ops is None
    assert "mamba-ssm not importable" in adv.reason == why


def test_kernel_path_needs_a_step_floor(monkeypatch):
    """With kernels importable (the twin stands in for them here), a model whose event
    steps have a floor takes them; one without (an old checkpoint) stays on torch."""
    monkeypatch.setattr(dispatch, "load_mamba_ops", lambda: (TWIN_OPS, ""))
    cuda = torch.device("cuda")
    with_floor = kernel_advancer(DygMambaLinkModel(ModelConfig()).eval(), cuda)
    assert with_floor.path == "mamba-ssm" and with_floor.ops is TWIN_OPS
    no_floor = kernel_advancer(DygMambaLinkModel(ModelConfig(delta_min=0.0)).eval(), cuda)
    assert no_floor.path == "torch-cuda" and "delta_min = 0" in no_floor.reason
