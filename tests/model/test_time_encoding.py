from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig, TimeNormalisation
from model.time_encoding import fit_time_normalisation, make_time_encoder


@pytest.mark.parametrize("kind", ["linear", "sinusoidal", "both"])
def test_shapes_and_dtypes(kind):
    enc = make_time_encoder(ModelConfig(time_encoder=kind, d_time=6))
    span = torch.tensor([[0.0, 1.0, 1e12]], dtype=torch.float64)
    out = enc(span)
    assert out.shape == (1, 3, 6) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_linear_encoder_standardises_log_span():
    norm = TimeNormalisation(scale=10.0, log_mean=1.0, log_std=2.0)
    enc = make_time_encoder(ModelConfig(time_encoder="linear", d_time=1, time_norm=norm))
    with torch.no_grad():
        enc.proj.weight.fill_(1.0)
        enc.proj.bias.zero_()
    out = enc(torch.tensor([90.0], dtype=torch.float64))
    expected = (torch.log1p(torch.tensor(9.0)) - 1.0) / 2.0
    torch.testing.assert_close(out.squeeze(), expected)


def test_fit_uses_positive_gaps_only():
    norm = fit_time_normalisation(
        torch.tensor([0.0, 0.0, 2.0, 4.0, 6.0, float("inf")], dtype=torch.float64)
    )
    assert norm.scale == 4.0
    assert norm.log_std > 0


@pytest.mark.parametrize("kind", ["linear", "sinusoidal", "both"])
def test_absurd_spans_stay_finite(kind):
    enc = make_time_encoder(ModelConfig(time_encoder=kind, d_time=4))
    out = enc(torch.tensor([1e300, 1.7e308], dtype=torch.float64))
    assert torch.isfinite(out).all()
