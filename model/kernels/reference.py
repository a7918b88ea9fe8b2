"""The CPU twin of the three mamba-ssm / causal-conv1d kernels this project calls.

Plain torch, written here from the published equations of the selective scan
(Gu & Dao, Mamba, eq. 2a-2b with mamba's discretisation ``A_bar = exp(Delta A)``,
``B_bar u = Delta B u``) and of a causal depthwise convolution, with the argument layout
and return values of the CUDA functions they stand for:

* ``selective_scan_ref``  ~ ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn``
* ``causal_conv1d_ref``   ~ ``causal_conv1d.causal_conv1d_fn``
* ``selective_state_update_ref`` ~ ``mamba_ssm.ops.triton.selective_state_update.selective_state_update``

They run on any device (the CPU here, CUDA tensors too), so the code that lays this
model's tensors out for the kernels (``model.kernels.cold_scan``, the ``step_update``
of ``SelectiveSSMLayer.ranked``) is tested against the model's own paths on every
machine; on a GPU machine the real kernels are tested against these (tests marked
``gpu``). Real ``A`` only (this model's A is real), no grouped heads in the step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _per_position(m: torch.Tensor, batch: int, dim: int, length: int) -> torch.Tensor:
    """B or C as (batch, dim, dstate, L): constant (dim, dstate), input-dependent
    (batch, dstate, L), or grouped (batch, groups, dstate, L) with dim // groups channels
    per group."""
    if m.dim() == 2:
        return m[None, :, :, None].expand(batch, dim, m.shape[1], length)
    if m.dim() == 3:
        return m[:, None, :, :].expand(batch, dim, m.shape[1], length)
    if m.dim() == 4:
        return m.repeat_interleave(dim // m.shape[1], dim=1)
    raise ValueError(f"B/C must have 2, 3 or 4 dimensions, not {tuple(m.shape)}")


def selective_scan_ref(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The selective scan from the zero state, one position at a time.

    u, delta, z: (batch, dim, L); A: (dim, dstate); B, C: see ``_per_position``;
    D, delta_bias: (dim,). For each position t::

        delta_t = softplus(delta_t + delta_bias) (if asked, else delta_t + delta_bias)
        h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t       (h_{-1} = 0)
        y_t = C_t . h_t ;   out_t = (y_t + D u_t) * silu(z_t)

    Returns out (batch, dim, L) in u's dtype and, if asked, h after the last position
    (batch, dim, dstate) in float32. A position with delta = 0 and u = 0 leaves h as it
    was, which is how right padding is written.
    """
    batch, dim, length = u.shape
    uf = u.float()
    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    a = A.float()
    b_all = _per_position(B.float(), batch, dim, length)
    c_all = _per_position(C.float(), batch, dim, length)
    h = torch.zeros(batch, dim, a.shape[1], dtype=torch.float32, device=u.device)
    y = torch.empty(batch, dim, length, dtype=torch.float32, device=u.device)
    for t in range(length):
        dt_t = dt[:, :, t, None]  # (batch, dim, 1)
        h = torch.exp(dt_t * a) * h + dt_t * b_all[..., t] * uf[:, :, t, None]
        y[:, :, t] = (h * c_all[..., t]).sum(-1)
    out = y if D is None else y + uf * D.float()[:, None]
    if z is not None:
        out = out * F.silu(z.float())
    out = out.to(u.dtype)
    return (out, h) if return_last_state else out


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise convolution over the last axis.

    x: (batch, dim, L); weight: (dim, width); bias: (dim,); initial_states: the
    (batch, dim, width - 1) inputs before position 0 (zeros if None). With the padded
    sequence p = [initial_states, x]::

        out[:, d, t] = bias[d] + sum_j weight[d, j] * p[:, d, t + j]     (j = 0 .. width-1)

    then SiLU if ``activation`` is "silu"/"swish". The taps are added in order j = 0, 1, ...
    (the order of this model's own step). ``return_final_states`` also returns the last
    width - 1 positions of p (the next call's initial state).
    """
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu or swish")
    batch, dim, length = x.shape
    width = weight.shape[1]
    pre = (
        torch.zeros(batch, dim, width - 1, dtype=x.dtype, device=x.device)
        if initial_states is None
        else initial_states.to(x.dtype)
    )
    p = torch.cat([pre, x], dim=-1).float()
    w = weight.float()
    out = p[:, :, 0:length] * w[:, 0, None]
    for j in range(1, width):
        out = out + p[:, :, j : j + length] * w[:, j, None]
    if bias is not None:
        out = out + bias.float()[:, None]
    if activation is not None:
        out = F.silu(out)
    out = out.to(x.dtype)
    if not return_final_states:
        return out
    final = p[:, :, p.shape[-1] - (width - 1) :].to(x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def selective_state_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> torch.Tensor:
    """One step of the selective scan for each row, from the given state.

    state: (batch, dim, dstate), updated IN PLACE; x, dt, z: (batch, dim);
    A: (dim, dstate); B, C: (batch, dstate); D, dt_bias: (dim,)::

        dt = softplus(dt + dt_bias) (if asked) ;  state <- exp(dt A) state + dt B x
        out = state . C (+ D x) (* silu(z))

    Returns out (batch, dim) in x's dtype.
    """
    if state.dim() != 3:
        raise ValueError("the twin takes states without heads: (batch, dim, dstate)")
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias.float()
    if dt_softplus:
        d = F.softplus(d)
    decay = torch.exp(d[:, :, None] * A.float())
    state.copy_(state * decay + d[:, :, None] * B.float()[:, None, :] * x.float()[:, :, None])
    out = (state * C.float()[:, None, :]).sum(-1)
    if D is not None:
        out = out + x.float() * D.float()
    if z is not None:
        out = out * F.silu(z.float())
    return out.to(x.dtype)
