"""Encoders of a time span (the gap since a node's previous event, or to a query).

* ``LinearTimeEncoder``: an affine map of the standardised log-span, after
  "linear vs sinusoidal time encoders" (seed 004): one input, few parameters.
* ``SinusoidalTimeEncoder``: TGAT/DyGFormer's cos(omega * span + phase), with
  frequencies log-spaced from 10 to 1e-5 per unit of the fitted scale (the
  span is measured in that unit, so the range covers sub-typical to very long
  gaps on any dataset).
* ``CombinedTimeEncoder``: both, concatenated then projected.

All take a float64 or float32 span tensor of any shape ``(...)`` and return
``(..., d_time)`` in float32. Spans are cast to float32 only *after* they have
been computed in float64 by the caller (DESIGN: float64 end to end).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig, TimeNormalisation


def standardised_log_span(span: torch.Tensor, norm: TimeNormalisation) -> torch.Tensor:
    """``(log1p(span/scale) - mean) / std`` in float32; negative spans count as 0."""
    s = torch.clamp(span.to(torch.float64), min=0.0) / norm.scale
    return ((torch.log1p(s) - norm.log_mean) / norm.log_std).to(torch.float32)


class LinearTimeEncoder(nn.Module):
    def __init__(self, d_time: int, norm: TimeNormalisation) -> None:
        super().__init__()
        self.norm = norm
        self.proj = nn.Linear(1, d_time)

    def forward(self, span: torch.Tensor) -> torch.Tensor:
        return self.proj(standardised_log_span(span, self.norm).unsqueeze(-1))


class SinusoidalTimeEncoder(nn.Module):
    def __init__(self, d_time: int, norm: TimeNormalisation) -> None:
        super().__init__()
        self.norm = norm
        exponents = torch.arange(d_time, dtype=torch.float32) / max(d_time - 1, 1)
        self.omega = nn.Parameter(10.0 ** (1.0 - 6.0 * exponents))
        self.phase = nn.Parameter(torch.zeros(d_time))

    def forward(self, span: torch.Tensor) -> torch.Tensor:
        # Clamped like the decay's gap units: an absurd span must not become inf in float32.
        s = torch.clamp(span.to(torch.float64) / self.norm.scale, min=0.0, max=1e30).to(
            torch.float32
        )
        return torch.cos(s.unsqueeze(-1) * self.omega + self.phase)


class CombinedTimeEncoder(nn.Module):
    def __init__(self, d_time: int, norm: TimeNormalisation) -> None:
        super().__init__()
        self.linear = LinearTimeEncoder(d_time, norm)
        self.sinusoidal = SinusoidalTimeEncoder(d_time, norm)
        self.mix = nn.Linear(2 * d_time, d_time)

    def forward(self, span: torch.Tensor) -> torch.Tensor:
        return self.mix(torch.cat([self.linear(span), self.sinusoidal(span)], dim=-1))


def make_time_encoder(config: ModelConfig) -> nn.Module:
    kinds = {
        "linear": LinearTimeEncoder,
        "sinusoidal": SinusoidalTimeEncoder,
        "both": CombinedTimeEncoder,
    }
    return kinds[config.time_encoder](config.d_time, config.time_norm)


def fit_time_normalisation(gaps: torch.Tensor) -> TimeNormalisation:
    """Fit the normalisation on the positive inter-event gaps of the training split.

    The scale is the median positive gap (robust to the heavy tail), so one unit of
    decay corresponds to a "typical" wait between a node's events.
    """
    g = gaps.to(torch.float64)
    g = g[torch.isfinite(g) & (g > 0)]
    if g.numel() == 0:
        return TimeNormalisation()
    scale = float(torch.median(g))
    logs = torch.log1p(g / scale)
    std = float(logs.std()) if g.numel() > 1 else 1.0
    return TimeNormalisation(
        scale=scale,
        log_mean=float(logs.mean()),
        log_std=std if std > 1e-6 and math.isfinite(std) else 1.0,
    )
