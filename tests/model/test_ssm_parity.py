"""Invariant 1 (step/scan parity) and invariant 2 (decay composition).

Step, scan and the serving kernel (``ranked``, rank-major) are each compared with an
independent float64 loop written here from the equations (not from any of them), and
step and scan with each other; broken variants of the scan and of ``ranked`` must
fail that comparison.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import model.ssm as ssm_module
from model.config import ModelConfig
from model.events import EventInputs, NodeEvent
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.ssm import DELTA_MAX_LOG_DECAY, LOG_DECAY_FLOOR, SelectiveSSMLayer, decay_factor

RTOL, ATOL = 1e-5, 1e-5


def reference_fold(
    model: DygMambaLinkModel, s0: NodeStates, ev: EventInputs, lengths: torch.Tensor
):
    """Plain float64 loop over nodes, events and layers, from the layer equations."""
    cfg = model.config
    out_h = s0.h.double().clone()
    out_conv = s0.conv.double().clone()
    for n in range(ev.t.shape[0]):
        t_prev = float(s0.t_last[n])
        for k in range(int(lengths[n])):
            t = float(ev.t[n, k])
            first = not math.isfinite(t_prev)
            gap = 0.0 if first else t - t_prev
            t_prev = t
            single = EventInputs(
                ev.other_key[n, k : k + 1],
                ev.role[n, k : k + 1],
                ev.features[n, k : k + 1],
                ev.t[n, k : k + 1],
                ev.seq[n, k : k + 1],
            )
            r, _, phi = model.tokens(
                single, torch.tensor([gap], dtype=torch.float64), torch.tensor([first])
            )
            r, phi = r[0].double(), phi[0].double()
            g = min(max(gap / cfg.time_norm.scale, 0.0), 1e30)
            for i, layer in enumerate(model.layers):
                p = {name: v.detach().double() for name, v in layer.named_parameters()}
                xn = r / torch.sqrt((r * r).mean() + layer.norm.eps) * p["norm.weight"]
                xz = p["in_proj.weight"] @ xn
                x, z = xz[: layer.d_inner], xz[layer.d_inner :]
                window = torch.cat([out_conv[n, i], x[:, None]], dim=1)
                xc = torch.nn.functional.silu((window * p["conv_weight"]).sum(1) + p["conv_bias"])
                bc = p["x_proj.weight"] @ xc
                b, c = bc[: layer.d_state], bc[layer.d_state :]
                d_in = torch.nn.functional.softplus(p["dt_proj.weight"] @ phi + p["dt_proj.bias"])
                # The event step: clamp(softplus(lam) * g, delta_min, delta_max) per channel,
                # delta_max where the slowest state of the channel reaches exp(-61).
                a_mat = -torch.exp(p["A_log"])
                delta_max = DELTA_MAX_LOG_DECAY / a_mat.max(dim=1).values
                step = torch.nn.functional.softplus(p["decay_rate"]) * g
                step = torch.minimum(step.clamp(min=cfg.delta_min), delta_max)
                h = (
                    torch.exp(a_mat * step[:, None]) * out_h[n, i]
                    + (d_in * xc)[:, None] * b[None, :]
                )
                y = h @ c + p["D"] * xc
                r = r + p["out_proj.weight"] @ (y * torch.nn.functional.silu(z))
                out_h[n, i] = h
                out_conv[n, i] = window[:, 1:]
    return out_h, out_conv


def fold_step(
    model: DygMambaLinkModel, s0: NodeStates, ev: EventInputs, lengths: torch.Tensor
) -> NodeStates:
    cur = s0.clone()
    for k in range(ev.t.shape[1]):
        nxt = model.step(
            cur,
            EventInputs(
                ev.other_key[:, k], ev.role[:, k], ev.features[:, k], ev.t[:, k], ev.seq[:, k]
            ),
        )
        active = k < lengths
        for f in ("h", "conv", "t_last", "last_seq", "n_events"):
            a, b = getattr(cur, f), getattr(nxt, f)
            setattr(cur, f, torch.where(active.view(-1, *([1] * (a.dim() - 1))), b, a))
    return cur


def random_case(seed: int, n: int, t_len: int, cfg: ModelConfig, gap_kind: str):
    gen = torch.Generator().manual_seed(seed)
    if gap_kind == "equal":
        gaps = torch.zeros(n, t_len, dtype=torch.float64)
    elif gap_kind == "huge":
        gaps = torch.rand(n, t_len, generator=gen, dtype=torch.float64) * 10
        gaps[:, t_len // 2] = 1e12  # the state is wiped by the decay here
    elif gap_kind == "mixed":
        gaps = torch.rand(n, t_len, generator=gen, dtype=torch.float64) ** 4 * 50
        gaps[gaps < 5] = 0.0  # many equal timestamps
    else:
        gaps = torch.rand(n, t_len, generator=gen, dtype=torch.float64) * 5
    t = 1e6 + torch.cumsum(gaps, dim=1)  # large absolute times, small gaps: float64 matters
    ev = EventInputs(
        other_key=torch.randint(0, 2**62, (n, t_len), generator=gen),
        role=torch.randint(0, 2, (n, t_len), generator=gen),
        features=torch.randn(n, t_len, cfg.edge_feature_dim, generator=gen),
        t=t,
        seq=torch.arange(t_len).repeat(n, 1),
    )
    lengths = torch.randint(0, t_len + 1, (n,), generator=gen)
    lengths[0] = t_len
    s0 = NodeStates.initial(n, cfg)
    s0.h.normal_(generator=gen)
    s0.conv.normal_(generator=gen)
    s0.t_last[:] = 1e6 - torch.rand(n, generator=gen, dtype=torch.float64)
    s0.t_last[-1] = float("-inf")  # one node that has never seen an event
    s0.n_events[:-1] = 5
    return s0, ev, lengths


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.double(), b.double(), rtol=RTOL, atol=ATOL)


configs = st.builds(
    ModelConfig,
    edge_feature_dim=st.integers(0, 4),
    d_model=st.sampled_from([4, 8, 16]),
    expand=st.integers(1, 2),
    d_state=st.integers(1, 8),
    d_conv=st.integers(1, 4),
    n_layers=st.integers(1, 3),
    time_encoder=st.sampled_from(["linear", "sinusoidal", "both"]),
    d_time=st.integers(1, 8),
    node_hash_buckets=st.sampled_from([0, 7]),
    d_node=st.just(4),
    delta_min=st.sampled_from([0.0, 1e-4, 0.05]),  # 0: checkpoints saved before the floor
)


@settings(max_examples=25, deadline=None)
@given(
    cfg=configs,
    seed=st.integers(0, 2**16),
    n=st.integers(1, 5),
    t_len=st.integers(1, 40),
    gap_kind=st.sampled_from(["regular", "equal", "huge", "mixed"]),
    chunk=st.sampled_from([1, 3, 16]),
)
def test_step_scan_and_reference_agree(cfg, seed, n, t_len, gap_kind, chunk):
    torch.manual_seed(seed)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(seed, n, t_len, cfg, gap_kind)
    with torch.no_grad():
        scanned, _ = model.scan(s0, ev, lengths, chunk=chunk)
        stepped = fold_step(model, s0, ev, lengths)
        ref_h, ref_conv = reference_fold(model, s0, ev, lengths)
    assert_close(stepped.h, ref_h)
    assert_close(stepped.conv, ref_conv)
    assert_close(scanned.h, ref_h)
    assert_close(scanned.conv, ref_conv)
    assert_close(scanned.h, stepped.h)
    assert torch.equal(scanned.t_last, stepped.t_last)
    assert torch.equal(scanned.n_events, stepped.n_events)
    assert torch.equal(scanned.last_seq, stepped.last_seq)


def test_parity_on_real_shapes():
    """The default config with a long sequence and every gap pattern at once."""
    cfg = ModelConfig(edge_feature_dim=4, n_layers=2)
    torch.manual_seed(0)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(1, 16, 130, cfg, "mixed")
    with torch.no_grad():
        scanned, per_pos = model.scan(s0, ev, lengths, return_states=True)
        stepped = fold_step(model, s0, ev, lengths)
    assert_close(scanned.h, stepped.h)
    # The per-position states end at each node's final state.
    last = (lengths - 1).clamp(min=0)
    has = lengths > 0
    assert_close(per_pos[has, last[has]], scanned.h[has])


def test_padding_does_not_change_state():
    """Whatever sits past a node's length (times, features, ids) leaves its state alone."""
    cfg = ModelConfig(n_layers=2, edge_feature_dim=2)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(2, 4, 12, cfg, "regular")
    pad = torch.arange(12).unsqueeze(0) >= lengths.unsqueeze(1)
    noisy = EventInputs(
        torch.where(pad, 12345, ev.other_key),
        ev.role,
        torch.where(pad.unsqueeze(-1), torch.randn_like(ev.features) * 100, ev.features),
        torch.where(pad, ev.t + 1e9, ev.t),
        ev.seq,
    )
    with torch.no_grad():
        clean, _ = model.scan(s0, ev, lengths)
        dirty, _ = model.scan(s0, noisy, lengths)
    assert bool(pad.any())
    assert torch.equal(clean.h, dirty.h) and torch.equal(clean.conv, dirty.conv)
    assert torch.equal(clean.t_last, dirty.t_last)


def per_node_events(ev: EventInputs, lengths: torch.Tensor) -> list[list[NodeEvent]]:
    """The padded (N, T) events as each node's list, what ``advance`` (rank-major) takes."""
    return [
        [
            NodeEvent(
                int(ev.other_key[n, k]),
                int(ev.role[n, k]),
                ev.features[n, k].tolist(),
                float(ev.t[n, k]),
                int(ev.seq[n, k]),
            )
            for k in range(int(lengths[n]))
        ]
        for n in range(ev.t.shape[0])
    ]


def small_blocks(monkeypatch: pytest.MonkeyPatch, block_elements: int) -> None:
    """Make ``ranked`` materialise its decays in many small runs of ranks (its bounded
    memory path) instead of one."""
    ranked = SelectiveSSMLayer.ranked
    monkeypatch.setattr(
        SelectiveSSMLayer,
        "ranked",
        lambda self, *a, **k: ranked(self, *a, **{**k, "block_elements": block_elements}),
    )


@settings(max_examples=25, deadline=None)
@given(
    cfg=configs,
    seed=st.integers(0, 2**16),
    n=st.integers(1, 5),
    t_len=st.integers(1, 40),
    gap_kind=st.sampled_from(["regular", "equal", "huge", "mixed"]),
    blocks=st.sampled_from([None, 64]),
)
def test_ranked_agrees_with_the_float64_reference(cfg, seed, n, t_len, gap_kind, blocks):
    """The serving kernel (``advance``: rank-major ``SelectiveSSMLayer.ranked``) against
    the independent float64 loop, directly: carried states (random h and conv tails,
    a node that never saw an event), zero gaps ("equal", "mixed"), huge gaps, 1 to 3
    layers, and its small-block path."""
    torch.manual_seed(seed)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(seed, n, t_len, cfg, gap_kind)
    with pytest.MonkeyPatch.context() as mp:
        if blocks is not None:
            small_blocks(mp, blocks)
        with torch.no_grad():
            ranked = model.advance(s0, per_node_events(ev, lengths))
    with torch.no_grad():
        ref_h, ref_conv = reference_fold(model, s0, ev, lengths)
    assert_close(ranked.h, ref_h)
    assert_close(ranked.conv, ref_conv)
    assert torch.equal(ranked.n_events, s0.n_events + lengths)


@pytest.mark.parametrize("gap_kind", ["equal", "mixed", "huge"])
def test_ranked_on_three_layers_with_carried_states(gap_kind):
    cfg = ModelConfig(edge_feature_dim=3, n_layers=3, d_model=16, d_state=8, delta_min=1e-4)
    torch.manual_seed(11)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(12, 6, 50, cfg, gap_kind)
    assert bool(torch.isfinite(s0.t_last[:-1]).all()) and float(s0.h.abs().sum()) > 0
    with torch.no_grad():
        ranked = model.advance(s0, per_node_events(ev, lengths))
        ref_h, ref_conv = reference_fold(model, s0, ev, lengths)
    assert_close(ranked.h, ref_h)
    assert_close(ranked.conv, ref_conv)


def scan_dropping_last_position(original):  # type: ignore[no-untyped-def]
    """A scan whose valid mask is off by one: the last input of each node is dropped."""

    def broken(self, state0, r, g, phi, lengths, *args, **kwargs):  # type: ignore[no-untyped-def]
        return original(self, state0, r, g, phi, (lengths - 1).clamp(min=0), *args, **kwargs)

    return broken


def scan_with_wrong_decay(original):  # type: ignore[no-untyped-def]
    """A scan that decays by exp(0.9 A Delta) instead of exp(A Delta)."""

    def broken(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        right = self.event_log_decay
        self.event_log_decay = lambda delta: 0.9 * right(delta)
        try:
            return original(self, *args, **kwargs)
        finally:
            del self.event_log_decay

    return broken


@pytest.mark.parametrize("breakage", [scan_dropping_last_position, scan_with_wrong_decay])
def test_a_broken_scan_is_caught(breakage, monkeypatch):
    """The parity check has teeth: the scan itself is broken (its valid mask drops an
    input position, or its decay is wrong) on inputs left as they are, and the
    comparison with the float64 reference fails; the intact scan passes it."""
    cfg = ModelConfig(n_layers=2)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(3, 3, 20, cfg, "regular")
    with torch.no_grad():
        ref_h, _ = reference_fold(model, s0, ev, lengths)
        intact, _ = model.scan(s0, ev, lengths)
        assert_close(intact.h, ref_h)
        monkeypatch.setattr(SelectiveSSMLayer, "scan", breakage(SelectiveSSMLayer.scan))
        broken, _ = model.scan(s0, ev, lengths)
    with pytest.raises(AssertionError):
        assert_close(broken.h, ref_h)


def test_a_broken_ranked_decay_is_caught(monkeypatch):
    """Same for the serving kernel: a wrong decay in the rank-major recurrence."""
    cfg = ModelConfig(n_layers=2)
    model = DygMambaLinkModel(cfg).eval()
    s0, ev, lengths = random_case(4, 3, 20, cfg, "regular")
    per_node = per_node_events(ev, lengths)
    with torch.no_grad():
        ref_h, _ = reference_fold(model, s0, ev, lengths)
        assert_close(model.advance(s0, per_node).h, ref_h)
        right = ssm_module.decay_factor_
        monkeypatch.setattr(ssm_module, "decay_factor_", lambda x: right(0.9 * x))
        broken = model.advance(s0, per_node)
    with pytest.raises(AssertionError):
        assert_close(broken.h, ref_h)


@settings(max_examples=30, deadline=None)
@given(a=st.floats(0, 1e4), b=st.floats(0, 1e4), seed=st.integers(0, 1000))
def test_decay_composition(a, b, seed):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_state=4, d_model=8)
    model = DygMambaLinkModel(cfg).eval()
    h = torch.randn(3, cfg.n_layers, cfg.d_inner, cfg.d_state)
    t0 = torch.full((3,), 1e6, dtype=torch.float64)
    with torch.no_grad():
        once = model.decay(h, t0, t0 + a + b)
        twice = model.decay(model.decay(h, t0, t0 + a), t0 + a, t0 + a + b)
    # Decay factors below exp(LOG_DECAY_FLOOR) are flushed to 0 (denormal slow paths),
    # so composition holds up to that flush, applied at most twice.
    flush = 2 * math.exp(LOG_DECAY_FLOOR) * float(h.abs().max())
    torch.testing.assert_close(once, twice, rtol=1e-5, atol=flush)


def test_query_before_last_event_is_clamped_not_rewound():
    cfg = ModelConfig()
    model = DygMambaLinkModel(cfg).eval()
    h = torch.randn(2, cfg.n_layers, cfg.d_inner, cfg.d_state)
    t_last = torch.tensor([10.0, 10.0], dtype=torch.float64)
    with torch.no_grad():
        earlier = model.decay(h, t_last, torch.tensor([5.0, 10.0], dtype=torch.float64))
    assert torch.equal(earlier, h)


def test_zero_gap_event_still_adds_input():
    cfg = ModelConfig()
    model = DygMambaLinkModel(cfg).eval()
    s0 = NodeStates.initial(1, cfg)
    s0.t_last[:] = 7.0
    s0.n_events[:] = 1
    ev = EventInputs(
        torch.tensor([3]),
        torch.tensor([0]),
        torch.zeros(1, 0),
        torch.tensor([7.0], dtype=torch.float64),
        torch.tensor([1]),
    )
    with torch.no_grad():
        s1 = model.step(s0, ev)
    assert s1.h.abs().sum() > 0


def _one_event(t: float, key: int = 3) -> EventInputs:
    return EventInputs(
        torch.tensor([key]),
        torch.tensor([0]),
        torch.zeros(1, 0),
        torch.tensor([t], dtype=torch.float64),
        torch.tensor([1]),
    )


def _carried_state(cfg: ModelConfig, t_last: float) -> NodeStates:
    s0 = NodeStates.initial(1, cfg)
    s0.h.normal_(generator=torch.Generator().manual_seed(0))
    s0.t_last[:] = t_last
    s0.n_events[:] = 1
    return s0


@pytest.mark.parametrize("delta_min", [1e-4, 0.05])
def test_event_step_is_clamped_between_the_floor_and_the_flush(delta_min):
    layer = DygMambaLinkModel(ModelConfig(delta_min=delta_min)).ssm_layers()[0]
    with torch.no_grad():
        d = layer.event_delta(torch.tensor([0.0, 1e-12, 1.0, 1e30]))
        d_max = layer.delta_max()
        lam = torch.nn.functional.softplus(layer.decay_rate)
        assert torch.equal(d[0], torch.full_like(d[0], delta_min))  # zero gap: the floor
        assert torch.equal(d[1], torch.full_like(d[1], delta_min))
        torch.testing.assert_close(d[2], lam.clamp(min=delta_min).minimum(d_max))
        assert torch.equal(d[3], d_max)  # huge gap: the cap
        # At the cap every state of every channel has flushed to exactly 0.
        log_decay = layer.event_log_decay(d_max)
        assert float(log_decay.max()) <= LOG_DECAY_FLOOR - 0.99
        assert torch.equal(decay_factor(log_decay), torch.zeros_like(log_decay))
        # ... and the slowest state of each channel sits right at DELTA_MAX_LOG_DECAY.
        torch.testing.assert_close(log_decay.amax(-1), torch.full_like(d_max, DELTA_MAX_LOG_DECAY))


def test_zero_gap_event_decays_by_the_floor_only():
    """A zero-gap step is exp(A delta_min) h + input: compare two states one event apart."""
    cfg = ModelConfig(delta_min=0.05)
    model = DygMambaLinkModel(cfg).eval()
    s0 = _carried_state(cfg, 7.0)
    zero = NodeStates.initial(1, cfg)
    zero.t_last[:], zero.n_events[:] = 7.0, 1
    layer = model.ssm_layers()[0]
    with torch.no_grad():
        with_h = model.step(s0, _one_event(7.0)).h
        input_only = model.step(zero, _one_event(7.0)).h
        expected = torch.exp(layer.state_matrix() * 0.05) * s0.h[0, 0]
    torch.testing.assert_close((with_h - input_only)[0, 0], expected, rtol=1e-5, atol=1e-6)


def test_without_a_floor_a_zero_gap_keeps_the_state():
    """delta_min = 0 (a checkpoint saved before the field): the old recurrence exactly."""
    cfg = ModelConfig(delta_min=0.0)
    model = DygMambaLinkModel(cfg).eval()
    s0 = _carried_state(cfg, 7.0)
    zero = NodeStates.initial(1, cfg)
    zero.t_last[:], zero.n_events[:] = 7.0, 1
    with torch.no_grad():
        diff = model.step(s0, _one_event(7.0)).h - model.step(zero, _one_event(7.0)).h
    torch.testing.assert_close(diff, s0.h, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gap", [1e9, 1e25, 1e300])
def test_huge_gap_event_forgets_the_state_exactly(gap):
    cfg = ModelConfig(n_layers=2)
    model = DygMambaLinkModel(cfg).eval()
    s0 = _carried_state(cfg, 0.0)
    zero = NodeStates.initial(1, cfg)
    zero.t_last[:], zero.n_events[:] = 0.0, 1
    zero.conv[:] = s0.conv
    with torch.no_grad():
        a = model.step(s0, _one_event(gap)).h
        b = model.step(zero, _one_event(gap)).h
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_queries_decay_without_the_floor():
    """A query at the node's own time keeps its state (no floor): decay composition."""
    cfg = ModelConfig(delta_min=0.05)
    model = DygMambaLinkModel(cfg).eval()
    h = torch.randn(2, cfg.n_layers, cfg.d_inner, cfg.d_state)
    t = torch.tensor([5.0, 5.0], dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(model.decay(h, t, t), h)
        tiny = model.decay(h, t, t + 1e-9 * cfg.time_norm.scale)
    assert float((tiny - h).abs().max()) < 1e-6  # not the floor's exp(A * 0.05)
