"""Which past events of a node a link score owes most to.

The recurrence is linear in the state: after events 1..T (from the zero state)

    h_T = sum_j (a_{j+1} ... a_T) * u_j,    u_j = (Delta_in * xc)_j B_j   (outer product)

and a query at tau decays it once more by q = exp(A * softplus(lam) * (tau - t_T) / scale),
so each event's *term* in the decayed state, ``q * a_{j+1} ... a_T * u_j``, is exact and
the terms sum to the decayed state (per layer; every layer's state is a sum of its
own terms). What is not linear is what comes after the state: the read-out (a linear
map then a LayerNorm) and the head (an MLP of both read-outs, their product and the
pair features). An event's *contribution* is its term pushed through them to first
order -- gradient times input: ``<d logit / d h(tau), term_j>``, summed over layers.
The contributions add up to the first-order change of the logit from the zero state
to the node's state; where the head is far from linear over that path (saturated
units, the z_u * z_v product with large states) the sum and the real change differ.

What the decomposition holds fixed (documented with the API):

* the causal conv and the gates: an event's input u_j is computed as the model
  computed it, from the tokens of the events before it (the conv window of
  ``d_conv`` events), and each later event's step size depends on the gap since it.
  Removing event j would also change the next ``d_conv - 1`` inputs and the gap of
  event j+1; the contribution does not count those knock-on effects. Layers after
  the first read the previous layer's outputs, so their terms depend on the earlier
  events the same way.
* the pair features (co-occurrence counts and recency from the recent-neighbour lists)
  and the identity match: inputs of the head, not of the state, so no event's
  contribution includes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .events import NodeEvent, pad_events
from .link_model import DygMambaLinkModel
from .node_state import NodeStates
from .ssm import decay_factor, gap_units


def decayed_terms(
    model: DygMambaLinkModel, events: Sequence[NodeEvent], tau: float
) -> torch.Tensor:
    """(T, n_layers, d_inner, d_state), on the host: each event's term in the state rebuilt from the
    zero state over ``events``, decayed to ``tau`` (clamped to the last event's time)."""
    c = model.config
    layers = model.ssm_layers()
    if not events:
        return torch.zeros(0, c.n_layers, c.d_inner, c.d_state)
    dev = next(model.parameters()).device
    ev, lengths = pad_events([events], c.edge_feature_dim)
    ev, lengths = ev.to(dev), lengths.to(dev)
    with torch.no_grad():
        _, after = model.scan(NodeStates.initial(1, c).to(dev), ev, lengths, return_states=True)
        assert after is not None
        after = after[0]  # (T, n_layers, di, ds): the state after each event
        t = ev.t[0].to(torch.float64)
        prev = torch.cat([torch.full((1,), float("-inf"), dtype=torch.float64, device=dev), t[:-1]])
        gap, _ = model._gap(t, prev)
        g = gap_units(gap, c.time_norm.scale)  # (T,)
        g_query = gap_units(
            torch.tensor([max(tau - float(t[-1]), 0.0)], dtype=torch.float64, device=dev),
            c.time_norm.scale,
        )
        out = []
        for i, layer in enumerate(layers):
            a = decay_factor(layer.event_log_decay(layer.event_delta(g)))  # (T, di, ds)
            h = after[:, i]
            u = h - torch.cat([torch.zeros_like(h[:1]), a[1:] * h[:-1]])
            # decay from just after event j to the last event: a_{j+1} ... a_T
            later = torch.cat([a[1:], torch.ones_like(a[:1])])
            suffix = torch.flip(torch.cumprod(torch.flip(later, [0]), 0), [0])
            q = decay_factor(layer.log_decay_rate() * g_query)  # (di, ds)
            out.append(q * suffix * u)
        return torch.stack(out, dim=1).cpu()


@dataclass
class StateSensitivity:
    """The logit and its gradient with respect to each endpoint's decayed state."""

    logit: float
    grad_u: torch.Tensor  # (n_layers, di, ds)
    grad_v: torch.Tensor
    state_u: torch.Tensor  # the decayed states themselves
    state_v: torch.Tensor


def state_sensitivity(
    model: DygMambaLinkModel,
    su: NodeStates,
    sv: NodeStates,
    tau: torch.Tensor,
    pair: torch.Tensor | None,
    pair_ids: torch.Tensor | None,
) -> StateSensitivity:
    """d logit / d h(tau) for one pair (states with one row each), the rest held fixed."""
    with torch.enable_grad():
        hu = model.decay(su.h, su.t_last, tau).detach().requires_grad_(True)
        hv = model.decay(sv.h, sv.t_last, tau).detach().requires_grad_(True)
        z_u = model.readout(hu.flatten(1))
        z_v = model.readout(hv.flatten(1))
        logit = model.head_logit(z_u, z_v, pair, pair_ids)[0]
        gu, gv = torch.autograd.grad(logit, [hu, hv])
    return StateSensitivity(float(logit), gu[0], gv[0], hu[0].detach(), hv[0].detach())


def contributions(terms: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(T,): each event's first-order contribution to the logit, <grad, term_j>."""
    return (terms * grad.unsqueeze(0)).flatten(1).sum(1)
