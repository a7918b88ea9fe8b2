"""The trainer's moving average of the weights: the recurrence it keeps, the weights a
block sees, and what survives a save and a load."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from training.weight_average import WeightAverage


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def test_the_average_follows_its_recurrence() -> None:
    model = _model()
    average = WeightAverage(model, decay=0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        average.update(model)
        expected = [
            0.9 * e + 0.1 * p.detach() for e, p in zip(expected, model.parameters(), strict=True)
        ]
        for got, want in zip(average.shadow, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    # the average lags the weights: it is not the last step's
    assert any(
        not torch.equal(s, p) for s, p in zip(average.shadow, model.parameters(), strict=True)
    )


def test_a_block_sees_the_average_and_the_model_gets_its_own_weights_back() -> None:
    model = _model()
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    own = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(2, 3)
    with average.applied(model):
        for p, s in zip(model.parameters(), average.shadow, strict=True):
            assert torch.equal(p, s)
        inside = model(x)
    for p, o in zip(model.parameters(), own, strict=True):
        assert torch.equal(p, o)
    assert not torch.equal(inside, model(x))
    # ... also when the block raises
    with pytest.raises(RuntimeError), average.applied(model):
        raise RuntimeError("validation failed")
    for p, o in zip(model.parameters(), own, strict=True):
        assert torch.equal(p, o)


def test_state_round_trips_and_refuses_another_model() -> None:
    model = _model()
    average = WeightAverage(model, decay=0.99)
    average.shadow = [s + 1.0 for s in average.shadow]
    other = WeightAverage(_model(), decay=0.99)
    other.load(average.state())
    for a, b in zip(average.shadow, other.shadow, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError):
        WeightAverage(nn.Linear(2, 2), decay=0.99).load(average.state())
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError):
            WeightAverage(model, decay=bad)
