"""The cold rebuild as mamba-ssm's kernels compute it: a batch of nodes, each from the
zero state, right-padded to the longest history in the batch.

Per layer, for N nodes and L padded positions::

    x, z      = split(W_in RMSNorm(r))                       torch
    xc        = causal_conv1d_fn(x, w, b, activation="silu")  (N, d_inner, L), zero initial tail
    tail      = [0, x][length : length + d_conv - 1]          each node's at its own length
    B, C      = W_B xc, W_C xc                                (N, d_state, L)
    Delta     = clamp(softplus(lam) g, delta_min, delta_max)   0 at padding
    u         = Delta_in xc / Delta                            0 at padding
    y, h_last = selective_scan_fn(u, Delta, A, B, C, return_last_state=True)
    r        <- r + W_out((y + D xc) * silu(z))               torch, D and the gate outside

Padding (Delta = 0, u = 0) leaves the state unchanged, so ``h_last`` is each node's state
after its own last event. Equal to ``SelectiveSSMLayer.ranked`` and ``scan`` from the zero
state (tested on the CPU with the twin, ``model.kernels.reference``; with the CUDA
kernels on a GPU machine, tests marked ``gpu``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from state_store.blob_header import NO_SEQ, NO_TIME

from ..events import EventInputs, NodeEvent, pad_events
from ..link_model import DygMambaLinkModel
from ..node_state import NodeStates
from ..ssm import SelectiveSSMLayer
from .ops import KernelOps


def layer_cold_scan(
    layer: SelectiveSSMLayer,
    ops: KernelOps,
    r: torch.Tensor,
    g: torch.Tensor,
    phi: torch.Tensor,
    lengths: torch.Tensor,
    need_outputs: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """One layer over padded events from the zero state: (residual stream after the layer
    if ``need_outputs``, final h (N, d_inner, d_state), final conv tail (N, d_inner, d_conv-1)).

    r: (N, L, d_model); g: (N, L) gaps in units; phi: (N, L, d_time); lengths: (N,).
    """
    n, t_len, _ = r.shape
    k1 = layer.d_conv - 1
    valid = (torch.arange(t_len, device=r.device)[None, :] < lengths[:, None]).to(r.dtype)
    x, z = layer.in_proj(layer.norm(r)).chunk(2, dim=-1)  # (N, L, di)
    x_k = x.transpose(1, 2).contiguous()  # (N, di, L): the kernels' layout
    conv = ops.conv_for(layer.d_conv)
    xc_k = conv(x_k, layer.conv_weight, bias=layer.conv_bias, activation="silu")
    seq = torch.cat([x_k.new_zeros(n, layer.d_inner, k1), x_k], dim=-1)
    idx = lengths.view(n, 1, 1) + torch.arange(k1, device=r.device).view(1, 1, k1)
    tail = torch.gather(seq, 2, idx.expand(n, layer.d_inner, k1))
    xc = xc_k.transpose(1, 2)  # (N, L, di)
    b, c = layer.x_proj(xc).split(layer.d_state, dim=-1)  # (N, L, ds)
    dx = F.softplus(layer.dt_proj(phi)) * xc  # (N, L, di): this layer's input term / B
    delta = layer.event_delta(g) * valid.unsqueeze(-1)  # padding: Delta = 0 ...
    u = layer.kernel_input(dx, delta)  # ... and u = 0
    out = ops.selective_scan(
        u.transpose(1, 2).contiguous(),
        delta.transpose(1, 2).contiguous(),
        layer.state_matrix().contiguous(),
        b.transpose(1, 2).contiguous(),
        c.transpose(1, 2).contiguous(),
        D=None,
        z=None,
        delta_bias=None,
        delta_softplus=False,
        return_last_state=True,
    )
    y, h_last = out
    r_next = None
    if need_outputs:
        r_next = r + layer.out_proj((y.transpose(1, 2) + layer.D * xc) * F.silu(z))
    return r_next, h_last.contiguous(), tail


def cold_scan(
    model: DygMambaLinkModel,
    ops: KernelOps,
    per_node: Sequence[Sequence[NodeEvent]],
    device: torch.device | str = "cpu",
) -> NodeStates:
    """States of N nodes after their events (in (t, seq) order), each from the zero state
    (``NodeStates.initial``), in one padded batch through ``ops``. Nodes without events
    keep the initial state."""
    if not any(per_node):
        return NodeStates.initial(len(per_node), model.config).to(device)
    ev, lengths = pad_events(per_node, model.config.edge_feature_dim)
    return cold_scan_padded(model, ops, ev.to(device), lengths.to(device))


def cold_scan_padded(
    model: DygMambaLinkModel, ops: KernelOps, ev: EventInputs, lengths: torch.Tensor
) -> NodeStates:
    """``cold_scan`` of padded events (fields (N, L), valid up to ``lengths``), on their device."""
    n, t_len = ev.t.shape
    if t_len == 0:
        return NodeStates.initial(n, model.config).to(ev.t.device)
    t = ev.t.to(torch.float64)
    start = torch.full((n, 1), NO_TIME, dtype=torch.float64, device=t.device)
    gap, first = DygMambaLinkModel._gap(t, torch.cat([start, t[:, :-1]], 1))
    r, g, phi = model.tokens(ev, gap, first)
    layers = model.ssm_layers()
    hs, convs = [], []
    for i, layer in enumerate(layers):
        r_next, h, tail = layer_cold_scan(
            layer, ops, r, g, phi, lengths, need_outputs=i < len(layers) - 1
        )
        r = r_next if r_next is not None else r
        hs.append(h)
        convs.append(tail)
    has = lengths > 0
    last = (lengths - 1).clamp(min=0).unsqueeze(1)
    return NodeStates(
        h=torch.stack(hs, dim=1),
        conv=torch.stack(convs, dim=1),
        t_last=torch.where(has, t.gather(1, last).squeeze(1), NO_TIME),
        last_seq=torch.where(has, ev.seq.gather(1, last).squeeze(1), NO_SEQ),
        n_events=lengths.to(torch.int64),
    )
