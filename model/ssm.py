"""The continuous-time selective SSM layer of DyG-Mamba, in causal streaming form.

One layer carries, per node, the SSM state ``h`` (d_inner x d_state) and the tail of
its causal depthwise conv (the last d_conv-1 *pre-conv* inputs, d_inner x (d_conv-1)).
For an event with token ``r`` (d_model) and time span ``g`` since the node's previous
event (in units of the fitted scale), one step is::

    x, z   = split(W_in RMSNorm(r))
    xc     = SiLU(depthwise_conv([tail, x]) + b_conv)          # conv over event index
    B, C   = W_B xc, W_C xc                                     # selective (data-dependent)
    d_dec  = clamp(softplus(lam) * g, delta_min, delta_max)     # event decay step, per channel
    d_in   = softplus(W_dt phi(g) + b_dt)                       # input step: time-encoded gap
    h     <- exp(A * d_dec) * h + (d_in * xc) (x) B              # A = -exp(A_log) < 0, S4D-real
    y      = h C + D * xc ;   r <- r + W_out(y * SiLU(z))

This is exactly mamba's recurrence ``h <- exp(Delta A) h + Delta B u; y = C h`` with
``Delta = d_dec`` and ``u = d_in * xc / d_dec`` (``kernel_input``), which is why the
step has a floor and a ceiling (DESIGN "Decisions"):

* ``delta_min`` (a config field, > 0 in new checkpoints) keeps the division defined
  for zero gaps; a zero-gap event decays by exp(A * delta_min) ~ 1 and still adds input.
* ``delta_max`` (per channel, derived from A: ``delta_max``) is where every state of
  the channel has decayed below the flush floor; a longer step changes nothing here
  (the decay is 0 either way) but would push u towards float32's subnormals.

``D``, the gate and the projections stay outside the recurrence, so mamba-ssm's fused
kernels (``model.kernels``) compute this layer's recurrence unchanged. A query decays
by ``softplus(lam) * g`` with no floor or ceiling (``decay``): linear in the gap, so
decaying by a then by b equals decaying by a+b.

Two entry points over the same parameters:

* ``step``: one event for each of a batch of nodes (the serving hot path).
* ``ranked``: the events of many nodes packed rank-major (``model.rank_plan``), the
  serving advance. Everything but the recurrence runs once over all events; the
  recurrence h <- a h + u walks the ranks on a prefix slice of the node states.
  It computes exactly what folding ``step`` computes, in fewer, larger operations.
  With a ``step_update`` (mamba-ssm's ``selective_state_update`` or its CPU twin,
  ``model.kernels``) each rank is one call of that kernel instead.
* ``scan``: padded per-node event sequences from a given initial state. It is a
  genuinely different computation from folding ``step``: the conv runs as one
  grouped ``conv1d`` over [tail, x], and the recurrence h_t = a_t h_{t-1} + b_t is
  evaluated as an associative (Hillis-Steele) scan of the affine maps (a_t, b_t),
  log2(chunk) vectorised levels per time chunk. Only products of decays appear
  (no division by a cumulative decay), so huge gaps underflow to 0 cleanly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .rank_plan import RankPlan

# Gaps (in units of the fitted scale) are clamped here: exp(A * lam * 1e30) is 0
# already, and an infinite gap would turn 0 * inf into NaN in the scan.
MAX_GAP_UNITS = 1e30
# Decay factors are exp(max(x, FLOOR)) - exp(FLOOR): exactly 0 at or below the floor,
# exactly 1 at x = 0 (the subtrahend is below float32 resolution there), and never
# further than exp(FLOOR) = 8.7e-27 from exp(x). Left alone, the decays of stale nodes
# underflow into float32 denormals, where the CPU falls to slow paths: torch's
# vectorised exp (~10x slower below -87.3) and every later product and matmul (the
# read-out). A subtraction costs a third of a masked select (measured).
LOG_DECAY_FLOOR = -60.0
_FLOOR_FACTOR = math.exp(LOG_DECAY_FLOOR)
# An event's decay step is capped per channel where A * Delta reaches this for every
# state of the channel (``SelectiveSSMLayer.delta_max``): one unit below the flush floor,
# so float32 rounding of the product cannot land above it, and every decay of a capped
# step is exactly 0 on the CPU paths (exp(-61) = 3e-27 in the fused kernels, which do
# not flush). Without the cap a gap of 1e30 units would make Delta ~ 1e30 and the
# kernel input u = Delta_in * x / Delta subnormal or 0.
DELTA_MAX_LOG_DECAY = LOG_DECAY_FLOOR - 1.0

# mamba_ssm's ``selective_state_update(state, x, dt, A, B, C)``: one step of every row of
# ``state`` (N, d_inner, d_state), updated IN PLACE (exp(dt A) state + dt B x), returning
# the read-out (N, d_inner) = state . C. The CUDA (Triton) kernel or its CPU twin.
StepUpdate = Callable[..., torch.Tensor]


# Elementwise passes over (rows, d_inner, d_state) float32 blocks run several times
# faster while a block stays in the CPU's L2 cache (~1 MB here) than when it streams
# from memory: the rank-major advance of a 1,000-event UCI batch took 10.2 ms with
# blocks of 2^18 floats against 20.4 ms with 2^22, the read-out of 1,900 nodes 5.7 ms
# in chunks of 256 rows against 12.6 ms in one pass, with bit-identical results.
CACHE_BLOCK_ELEMENTS = 1 << 18


def decay_factor_(log_decay: torch.Tensor) -> torch.Tensor:
    """``decay_factor`` in place (no autograd): one buffer instead of three temporaries."""
    return log_decay.clamp_(min=LOG_DECAY_FLOOR).exp_().sub_(_FLOOR_FACTOR)


def decay_factor(log_decay: torch.Tensor) -> torch.Tensor:
    """exp(log_decay) for log_decay <= 0, flushed to 0 at ``LOG_DECAY_FLOOR``."""
    a = torch.exp(log_decay.clamp(min=LOG_DECAY_FLOOR))
    # In place only outside autograd: exp's backward reads its output.
    return a - _FLOOR_FACTOR if a.requires_grad else a.sub_(_FLOOR_FACTOR)


@dataclass
class LayerState:
    """Per-node state of one layer, batched over nodes."""

    h: torch.Tensor  # (N, d_inner, d_state) float32
    conv: torch.Tensor  # (N, d_inner, d_conv - 1) float32: pre-conv inputs, oldest first


@dataclass
class ScanResult:
    outputs: torch.Tensor  # (N, T, d_model): the residual stream after this layer
    final: LayerState  # state after each node's last valid position
    states: torch.Tensor | None  # (N, T, d_inner, d_state) state after every position, if asked


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def gap_units(gap: torch.Tensor, scale: float) -> torch.Tensor:
    """A float64 gap in the dataset's unit -> float32 gap in units of ``scale``, clamped.

    The division happens in float64 (timestamps are float64 end to end); the cast to
    float32 comes only after the gap exists.
    """
    g = torch.clamp(gap.to(torch.float64) / scale, min=0.0, max=MAX_GAP_UNITS)
    return g.to(torch.float32)


class SelectiveSSMLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        d_inner: int,
        d_state: int,
        d_conv: int,
        d_time: int,
        delta_min: float = 0.0,
    ) -> None:
        super().__init__()
        self.d_model, self.d_inner, self.d_state, self.d_conv = d_model, d_inner, d_state, d_conv
        self.delta_min = delta_min
        self.norm = RMSNorm(d_model)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(d_inner, d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(d_inner))
        self.x_proj = nn.Linear(d_inner, 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(d_time, d_inner)
        self.decay_rate = nn.Parameter(torch.empty(d_inner))  # lam: softplus(lam) per channel
        self.A_log = nn.Parameter(
            torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1)
        )
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        self._init_parameters()

    def _init_parameters(self) -> None:
        nn.init.uniform_(
            self.conv_weight, -1.0 / math.sqrt(self.d_conv), 1.0 / math.sqrt(self.d_conv)
        )
        # Mamba's dt init: softplus(b_dt) log-uniform in [1e-3, 1e-1].
        dt = torch.exp(torch.rand(self.d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            nn.init.normal_(self.dt_proj.weight, std=0.02)
            # Decay rates log-uniform in [0.01, 1] per unit of the fitted scale: some
            # channels remember across many typical gaps, some forget within one.
            lam = torch.exp(torch.rand(self.d_inner) * math.log(100.0) + math.log(0.01))
            self.decay_rate.copy_(lam + torch.log(-torch.expm1(-lam)))

    # ----- shared pieces -------------------------------------------------------------
    def log_decay_rate(self) -> torch.Tensor:
        """A * softplus(lam): (d_inner, d_state), all < 0. Log-decay per gap unit (queries)."""
        return -torch.exp(self.A_log) * F.softplus(self.decay_rate).unsqueeze(-1)

    def state_matrix(self) -> torch.Tensor:
        """A = -exp(A_log): (d_inner, d_state), all < 0 (mamba's ``A``)."""
        return -torch.exp(self.A_log)

    def delta_max(self) -> torch.Tensor:
        """(d_inner,): the event step at which A * Delta <= ``DELTA_MAX_LOG_DECAY`` for every
        state of the channel (the slowest state, max_n A[c, n], reaches it exactly).
        A bound, not a learned quantity: no gradient flows through it."""
        return DELTA_MAX_LOG_DECAY / self.state_matrix().detach().amax(-1)

    def event_delta(self, g: torch.Tensor) -> torch.Tensor:
        """An event's decay step, (..., d_inner) for gaps ``g`` (...) in units:
        clamp(softplus(lam) * g, delta_min, delta_max), mamba's Delta."""
        d = F.softplus(self.decay_rate) * g.unsqueeze(-1)
        return torch.minimum(d.clamp(min=self.delta_min), self.delta_max())

    def event_log_decay(self, delta: torch.Tensor) -> torch.Tensor:
        """A * Delta, (..., d_inner, d_state), for event steps ``delta`` (..., d_inner): the
        product in the kernels' order (Delta per channel first, then times A)."""
        return self.state_matrix() * delta.unsqueeze(-1)

    @staticmethod
    def kernel_input(dx: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """mamba's u for an input term ``dx`` = d_in * xc: u = dx / Delta, so that the
        kernels' Delta * B * u is this layer's (d_in * xc) B. 0 where Delta is 0 (padding)."""
        return torch.where(delta > 0, dx / torch.where(delta > 0, delta, 1.0), 0.0)

    def initial_state(self, n: int, device: torch.device | None = None) -> LayerState:
        return LayerState(
            h=torch.zeros(n, self.d_inner, self.d_state, device=device),
            conv=torch.zeros(n, self.d_inner, self.d_conv - 1, device=device),
        )

    def decay(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Zero-input evolution of ``h`` (N, d_inner, d_state) over gaps ``g`` (N,) in units."""
        return decay_factor(self.log_decay_rate() * g[:, None, None]) * h

    # ----- one event per node ----------------------------------------------------------
    def step(
        self, state: LayerState, r: torch.Tensor, g: torch.Tensor, phi: torch.Tensor
    ) -> tuple[torch.Tensor, LayerState]:
        """Apply one event to each node.

        r: (N, d_model) residual stream of the event token; g: (N,) gap in units;
        phi: (N, d_time) encoded gap. Returns the new residual stream and state.
        """
        x, z = self.in_proj(self.norm(r)).chunk(2, dim=-1)
        window = torch.cat([state.conv, x.unsqueeze(-1)], dim=-1)  # (N, d_inner, d_conv)
        xc = F.silu((window * self.conv_weight).sum(-1) + self.conv_bias)
        b, c = self.x_proj(xc).split(self.d_state, dim=-1)
        d_in = F.softplus(self.dt_proj(phi))
        decay = decay_factor(self.event_log_decay(self.event_delta(g)))
        h = decay * state.h + (d_in * xc).unsqueeze(-1) * b.unsqueeze(1)
        y = (h * c.unsqueeze(1)).sum(-1) + self.D * xc
        out = r + self.out_proj(y * F.silu(z))
        return out, LayerState(h=h, conv=window[:, :, 1:])

    # ----- rank-major packed events ----------------------------------------------------
    def ranked(
        self,
        state0: LayerState,
        r: torch.Tensor,
        g: torch.Tensor,
        phi: torch.Tensor,
        plan: RankPlan,
        windows: torch.Tensor,
        tails: torch.Tensor,
        need_outputs: bool = True,
        block_elements: int = CACHE_BLOCK_ELEMENTS,
        step_update: StepUpdate | None = None,
    ) -> tuple[torch.Tensor | None, LayerState]:
        """Apply E packed events (rank-major, ``plan``) to N nodes in the plan's sorted order.

        r: (E, d_model); g: (E,) gaps in units; phi: (E, d_time); windows/tails: the
        plan's ``conv_windows``/``final_tails`` for this layer's d_conv. Returns the
        residual stream after this layer (only if ``need_outputs``: the last layer's
        is never read) and the new state. Decays and inputs are materialised for runs
        of ranks of at most ``block_elements`` floats (one rank at least), so memory
        stays bounded for long cold rebuilds and the elementwise passes over a block
        run in cache. With ``step_update`` (mamba's ``selective_state_update``) each
        rank is one call of it on the prefix of the node states instead.
        """
        n, k1, di = plan.num_nodes, self.d_conv - 1, self.d_inner
        x, z = self.in_proj(self.norm(r)).chunk(2, dim=-1)  # (E, di)
        src = torch.cat([x, state0.conv.transpose(1, 2).reshape(n * k1, di)])
        # The causal conv tap by tap (gather, multiply-add): einsum("ekd,dk->ed") over the
        # gathered (E, d_conv, di) windows took 4x as long, and the taps add up in the
        # order of ``step``'s sum.
        weight = self.conv_weight.t()  # (d_conv, di)
        acc = src[windows[:, 0]] * weight[0]
        for j in range(1, windows.shape[1]):
            acc.addcmul_(src[windows[:, j]], weight[j])
        xc = F.silu(acc + self.conv_bias)
        b, c = self.x_proj(xc).split(self.d_state, dim=-1)  # (E, ds)
        dx = F.softplus(self.dt_proj(phi)) * xc  # (E, di)
        delta = self.event_delta(g)  # (E, di)
        if step_update is None:
            h, hc = self._ranked_recurrence(
                state0.h, dx, delta, b, c, plan, need_outputs, block_elements
            )
        else:
            h, hc = self._ranked_step_kernel(state0.h, dx, delta, b, c, plan, step_update)
        tail = src[tails].transpose(1, 2).contiguous() if k1 else state0.conv.clone()
        out = None
        if need_outputs:
            assert hc is not None
            out = r + self.out_proj((hc + self.D * xc) * F.silu(z))
        return out, LayerState(h=h, conv=tail)

    def _ranked_recurrence(
        self,
        h0: torch.Tensor,
        dx: torch.Tensor,
        delta: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        plan: RankPlan,
        need_outputs: bool,
        block_elements: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h <- a h + u rank by rank, on blocks of ranks: (final states, h . C per event)."""
        a_mat = self.state_matrix()
        h = h0.clone()  # final states; nodes without events keep theirs
        hc = torch.empty_like(dx) if need_outputs else None  # h C per event
        offsets = plan.offsets.tolist()
        last = plan.last_event().to(h.device)
        has = torch.from_numpy(plan.lengths > 0).to(h.device)
        per_event = self.d_inner * self.d_state
        prev = h0  # the states before the current rank, row j = sorted node j
        k = 0
        while k < len(plan.counts):
            # A run of ranks [k, k_end) whose decays and inputs fit the budget.
            k_end = k + 1
            while (
                k_end < len(plan.counts)
                and (offsets[k_end + 1] - offsets[k]) * per_event <= block_elements
            ):
                k_end += 1
            base, stop = offsets[k], offsets[k_end]
            a = decay_factor_(a_mat * delta[base:stop, :, None])
            # u holds each event's input and becomes the state after that event: one
            # fused multiply-add per rank, reading the previous rank's block.
            u = dx[base:stop, :, None] * b[base:stop, None, :]
            # Views of every rank in one split each (slicing per rank cost more than
            # the multiply-add of a lone hub's long tail of one-row ranks).
            sizes = [offsets[q + 1] - offsets[q] for q in range(k, k_end)]
            prev_rows = prev.shape[0]
            for u_q, a_q, rows in zip(u.split(sizes), a.split(sizes), sizes, strict=True):
                u_q.addcmul_(prev if prev_rows == rows else prev[:rows], a_q)
                prev, prev_rows = u_q, rows
            if hc is not None:
                hc[base:stop] = torch.bmm(u, c[base:stop, :, None]).squeeze(-1)
            ends_here = has & (last >= base) & (last < stop)
            h[ends_here] = u[last[ends_here] - base]
            k = k_end
        return h, hc

    def _ranked_step_kernel(
        self,
        h0: torch.Tensor,
        dx: torch.Tensor,
        delta: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        plan: RankPlan,
        step_update: StepUpdate,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``selective_state_update`` per rank, in place on the prefix of the node
        states that has a k-th event (rows past a node's last event are never touched,
        so each row ends as its node's final state)."""
        h = h0.clone().contiguous()
        u = self.kernel_input(dx, delta)
        a_mat = self.state_matrix().contiguous()
        hc = torch.empty_like(dx)
        offsets = plan.offsets.tolist()
        for k, rows in enumerate(plan.counts.tolist()):
            base = offsets[k]
            hc[base : base + rows] = step_update(
                h[:rows],
                u[base : base + rows],
                delta[base : base + rows],
                a_mat,
                b[base : base + rows],
                c[base : base + rows],
            )
        return h, hc

    # ----- padded sequences ------------------------------------------------------------
    def scan(
        self,
        state0: LayerState,
        r: torch.Tensor,
        g: torch.Tensor,
        phi: torch.Tensor,
        lengths: torch.Tensor,
        chunk: int = 64,
        return_states: bool = False,
    ) -> ScanResult:
        """Run ``T`` padded events per node from ``state0``.

        r: (N, T, d_model); g: (N, T) gaps in units; phi: (N, T, d_time);
        lengths: (N,) number of valid events per node (positions >= length are padding
        and leave the state unchanged).
        """
        n, t_len, _ = r.shape
        valid = torch.arange(t_len, device=r.device).unsqueeze(0) < lengths.unsqueeze(1)  # (N, T)
        x, z = self.in_proj(self.norm(r)).chunk(2, dim=-1)  # (N, T, d_inner)

        # Causal depthwise conv over [tail, x] in one grouped conv1d.
        seq = torch.cat([state0.conv, x.transpose(1, 2)], dim=-1)  # (N, d_inner, k-1+T)
        conv = F.conv1d(seq, self.conv_weight.unsqueeze(1), self.conv_bias, groups=self.d_inner)
        xc = F.silu(conv.transpose(1, 2))  # (N, T, d_inner)
        # New tail: the k-1 pre-conv inputs ending at each node's last valid event.
        k1 = self.d_conv - 1
        idx = lengths.view(n, 1, 1) + torch.arange(k1, device=r.device).view(1, 1, k1)
        tail = torch.gather(seq, 2, idx.expand(n, self.d_inner, k1))

        b, c = self.x_proj(xc).split(self.d_state, dim=-1)  # (N, T, d_state)
        d_in = F.softplus(self.dt_proj(phi))
        vmask = valid.to(xc.dtype)
        u = ((d_in * xc) * vmask.unsqueeze(-1)).unsqueeze(-1) * b.unsqueeze(2)  # (N,T,di,ds)
        # Padding: step 0 (after the clamp, which would floor it) and zero input -> identity.
        delta = self.event_delta(g) * vmask.unsqueeze(-1)  # (N, T, di)

        h = state0.h
        ys, all_states = [], []
        for start in range(0, t_len, chunk):
            stop = min(start + chunk, t_len)
            # Per-position decay a_t = exp(A Delta_t) and input b_t; fold h into b_0.
            a = decay_factor(self.event_log_decay(delta[:, start:stop]))  # (N, q, di, ds)
            b = u[:, start:stop]
            b = torch.cat([(b[:, :1] + a[:, :1] * h.unsqueeze(1)), b[:, 1:]], dim=1)
            # Hillis-Steele inclusive scan of the affine maps h -> a h + b:
            # (a2, b2) o (a1, b1) = (a2 a1, a2 b1 + b2), log2(q) vectorised levels.
            d = 1
            while d < stop - start:
                b = torch.cat([b[:, :d], b[:, d:] + a[:, d:] * b[:, :-d]], dim=1)
                a = torch.cat([a[:, :d], a[:, d:] * a[:, :-d]], dim=1)
                d *= 2
            hq = b  # state after each position of the chunk
            ys.append((hq * c[:, start:stop].unsqueeze(2)).sum(-1) + self.D * xc[:, start:stop])
            if return_states:
                all_states.append(hq)
            h = hq[:, -1]
        y = torch.cat(ys, dim=1) if ys else xc[:, :0]
        out = r + self.out_proj(y * F.silu(z))
        return ScanResult(
            outputs=out,
            final=LayerState(h=h, conv=tail),
            states=torch.cat(all_states, dim=1) if return_states and all_states else None,
        )
