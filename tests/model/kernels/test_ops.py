"""The guard around mamba-ssm's ``selective_state_update`` (it raises when D or dt_bias
is None), checked on the CPU through the twin, which takes the same arguments."""

from __future__ import annotations

import torch

from model.kernels.ops import _zeros_for_missing_d_and_dt_bias
from model.kernels.reference import selective_state_update_ref


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(7, 64, 16, generator=g)
    x, dt = torch.randn(7, 64, generator=g), torch.rand(7, 64, generator=g)
    a = -torch.exp(torch.randn(64, 16, generator=g))
    b, c = torch.randn(7, 16, generator=g), torch.randn(7, 16, generator=g)
    return [state, x, dt, a, b, c]


def test_the_guard_hands_the_kernel_tensors_for_d_and_dt_bias():
    seen: dict[str, object] = {}

    def kernel(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus):
        seen.update(D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
        return x

    _zeros_for_missing_d_and_dt_bias(kernel)(*_inputs())
    assert isinstance(seen["D"], torch.Tensor) and seen["D"].shape == (64,)
    assert isinstance(seen["dt_bias"], torch.Tensor) and seen["dt_bias"].shape == (64,)
    assert seen["z"] is None and seen["dt_softplus"] is False


def test_zeros_for_d_and_dt_bias_leave_the_step_unchanged():
    plain, guarded = _inputs(), _inputs()
    want = selective_state_update_ref(*plain)
    got = _zeros_for_missing_d_and_dt_bias(selective_state_update_ref)(*guarded)
    assert torch.equal(got, want)
    assert torch.equal(guarded[0], plain[0])  # the state, updated in place alike
    d = torch.randn(64)
    with_d = _zeros_for_missing_d_and_dt_bias(selective_state_update_ref)(*_inputs(), D=d)
    assert not torch.equal(with_d, want)  # a D that is given is passed on
