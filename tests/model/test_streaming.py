"""model.streaming.advance takes two routes (segmented step, batch scan for long
per-node sequences); both must give the same states as a plain fold of step."""

from __future__ import annotations

import torch

import model.streaming as streaming
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel, EventInputs
from model.node_state import NodeStates


def test_both_routes_agree_with_a_fold_of_step():
    torch.manual_seed(0)
    cfg = ModelConfig(edge_feature_dim=2, n_layers=2)
    model = DygMambaLinkModel(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    per_node = []
    for n_events in (1, 3, streaming.SCAN_FROM_EVENTS_CPU + 1, 120, 0, 40):
        t = torch.cumsum(torch.rand(n_events, generator=gen, dtype=torch.float64) * 10, 0)
        per_node.append([streaming.NodeEvent(int(k), int(k % 2), [0.5, -float(k)], float(t[k]), int(k)) for k in range(n_events)])
    s0 = NodeStates.initial(len(per_node), cfg)
    out = streaming.advance(model, s0, per_node)
    for i, events in enumerate(per_node):
        cur = s0.select([i])
        with torch.no_grad():
            for e in events:
                ev = EventInputs(torch.tensor([e.other_key]), torch.tensor([e.role]), torch.tensor([list(e.features)], dtype=torch.float32),
                                 torch.tensor([e.t], dtype=torch.float64), torch.tensor([e.seq]))  # fmt: skip
                cur = model.step(cur, ev)
        torch.testing.assert_close(out.h[i : i + 1], cur.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.conv[i : i + 1], cur.conv, rtol=1e-5, atol=1e-5)
        assert int(out.n_events[i]) == len(events)
