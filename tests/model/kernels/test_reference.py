"""The CPU twin of mamba-ssm's kernels against independent float64 loops written here,
and against each other (a scan is a fold of single steps), with the layouts and options
of the CUDA functions (right padding, D, z, delta_bias, softplus, grouped B/C, conv
initial and final states)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.kernels.reference import (
    causal_conv1d_ref,
    selective_scan_ref,
    selective_state_update_ref,
)


def _inputs(batch=3, dim=6, dstate=4, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "u": torch.randn(batch, dim, length, generator=g),
        "delta": torch.rand(batch, dim, length, generator=g) * 0.5,
        "A": -torch.rand(dim, dstate, generator=g) * 4 - 0.1,
        "B": torch.randn(batch, dstate, length, generator=g),
        "C": torch.randn(batch, dstate, length, generator=g),
        "D": torch.randn(dim, generator=g),
        "z": torch.randn(batch, dim, length, generator=g),
    }


def _scan_float64(u, delta, A, B, C):
    """h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t; y_t = C_t . h_t, one scalar at a time."""
    u, delta, A, B, C = (x.double() for x in (u, delta, A, B, C))
    batch, dim, length = u.shape
    h = torch.zeros(batch, dim, A.shape[1], dtype=torch.float64)
    y = torch.zeros(batch, dim, length, dtype=torch.float64)
    for b in range(batch):
        for d in range(dim):
            for t in range(length):
                for n in range(A.shape[1]):
                    h[b, d, n] = (
                        torch.exp(delta[b, d, t] * A[d, n]) * h[b, d, n]
                        + delta[b, d, t] * B[b, n, t] * u[b, d, t]
                    )
                y[b, d, t] = (h[b, d] * C[b, :, t]).sum()
    return y, h


def test_scan_matches_the_equations():
    x = _inputs()
    out, last = selective_scan_ref(
        x["u"], x["delta"], x["A"], x["B"], x["C"], return_last_state=True
    )
    y, h = _scan_float64(x["u"], x["delta"], x["A"], x["B"], x["C"])
    torch.testing.assert_close(out.double(), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last.double(), h, rtol=1e-5, atol=1e-5)
    assert out.dtype == torch.float32 and last.shape == (3, 6, 4)


def test_scan_options_d_z_bias_softplus():
    x = _inputs(seed=1)
    bias = torch.randn(6)
    out = selective_scan_ref(
        x["u"],
        x["delta"],
        x["A"],
        x["B"],
        x["C"],
        D=x["D"],
        z=x["z"],
        delta_bias=bias,
        delta_softplus=True,
    )
    dt = F.softplus(x["delta"] + bias[:, None])
    y, _ = _scan_float64(x["u"], dt, x["A"], x["B"], x["C"])
    expected = (y + x["u"].double() * x["D"].double()[:, None]) * F.silu(x["z"].double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_scan_grouped_and_constant_b_c():
    x = _inputs(batch=2, dim=6, seed=2)
    grouped_b = torch.randn(2, 3, 4, 9)  # 3 groups of 2 channels
    out_g = selective_scan_ref(x["u"], x["delta"], x["A"], grouped_b, x["C"])
    # The same as giving each channel its group's B: run channel pairs separately.
    for grp in range(3):
        ch = slice(2 * grp, 2 * grp + 2)
        part = selective_scan_ref(
            x["u"][:, ch], x["delta"][:, ch], x["A"][ch], grouped_b[:, grp], x["C"]
        )
        torch.testing.assert_close(out_g[:, ch], part)
    const_b = torch.randn(6, 4)
    out_c = selective_scan_ref(x["u"], x["delta"], x["A"], const_b, x["C"])
    per_step = const_b.T[None, :, :, None].expand(2, 4, 6, 9)  # (batch, dstate, dim, L)
    for d in range(6):
        part = selective_scan_ref(
            x["u"][:, d : d + 1],
            x["delta"][:, d : d + 1],
            x["A"][d : d + 1],
            per_step[:, :, d].contiguous(),
            x["C"],
        )
        torch.testing.assert_close(out_c[:, d : d + 1], part)


def test_right_padding_with_zero_step_and_input_keeps_the_last_state():
    x = _inputs(length=12, seed=3)
    lengths = torch.tensor([12, 7, 1])
    pad = torch.arange(12)[None, None, :] >= lengths[:, None, None]
    u = torch.where(pad, 0.0, x["u"])
    delta = torch.where(pad, 0.0, x["delta"])
    B = torch.where(pad[:, :1].expand(3, 4, 12), torch.randn(3, 4, 12) * 50, x["B"])
    _, last = selective_scan_ref(u, delta, x["A"], B, x["C"], return_last_state=True)
    for i, n in enumerate(lengths.tolist()):
        _, own = selective_scan_ref(
            x["u"][i : i + 1, :, :n],
            x["delta"][i : i + 1, :, :n],
            x["A"],
            x["B"][i : i + 1, :, :n],
            x["C"][i : i + 1, :, :n],
            return_last_state=True,
        )
        torch.testing.assert_close(last[i : i + 1], own)


def test_a_scan_is_a_fold_of_state_updates():
    x = _inputs(seed=4)
    out, last = selective_scan_ref(
        x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"], return_last_state=True
    )
    state = torch.zeros(3, 6, 4)
    for t in range(9):
        step = selective_state_update_ref(
            state,
            x["u"][..., t],
            x["delta"][..., t],
            x["A"],
            x["B"][..., t],
            x["C"][..., t],
            D=x["D"],
            z=x["z"][..., t],
        )
        torch.testing.assert_close(step, out[..., t], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, last, rtol=1e-5, atol=1e-6)


def test_state_update_is_in_place_on_a_view_and_takes_bias_softplus():
    table = torch.randn(5, 6, 4)
    before = table.clone()
    x = _inputs(batch=3, seed=5)
    bias = torch.randn(6)
    out = selective_state_update_ref(
        table[:3],
        x["u"][..., 0],
        x["delta"][..., 0],
        x["A"],
        x["B"][..., 0],
        x["C"][..., 0],
        dt_bias=bias,
        dt_softplus=True,
    )
    dt = F.softplus(x["delta"][..., 0] + bias)
    expected = torch.exp(dt[:, :, None] * x["A"]) * before[:3] + (
        dt[:, :, None] * x["B"][:, None, :, 0] * x["u"][:, :, None, 0]
    )
    torch.testing.assert_close(table[:3], expected)
    assert torch.equal(table[3:], before[3:])  # rows past the view untouched
    torch.testing.assert_close(out, (expected * x["C"][:, None, :, 0]).sum(-1))
    with pytest.raises(ValueError, match="without heads"):
        selective_state_update_ref(
            torch.zeros(2, 1, 6, 4),
            x["u"][:2, :, 0],
            x["delta"][:2, :, 0],
            x["A"],
            x["B"][:2, :, 0],
            x["C"][:2, :, 0],
        )


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_causal_conv_matches_a_padded_conv1d(width):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(2, 5, 11, generator=g)
    w = torch.randn(5, width, generator=g)
    b = torch.randn(5, generator=g)
    expected = F.conv1d(F.pad(x, (width - 1, 0)), w.unsqueeze(1), b, groups=5)
    torch.testing.assert_close(causal_conv1d_ref(x, w, bias=b), expected)
    torch.testing.assert_close(causal_conv1d_ref(x, w, bias=b, activation="silu"), F.silu(expected))
    # Two halves with the first half's final state as the second's initial state.
    first, tail = causal_conv1d_ref(x[..., :6], w, bias=b, return_final_states=True)
    second = causal_conv1d_ref(x[..., 6:], w, bias=b, initial_states=tail)
    torch.testing.assert_close(torch.cat([first, second], -1), expected)
    assert tail.shape == (2, 5, width - 1)
    with pytest.raises(NotImplementedError):
        causal_conv1d_ref(x, w, activation="relu")
