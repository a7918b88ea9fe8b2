"""An exponential moving average of the model's parameters over training steps.

Validation scores, and the checkpoint keeps, the averaged weights; the optimiser goes on
from its own. Why: on the streams that peak within their first epochs (Wikipedia keeps
epoch 0 and then over-fits, MOOC epoch 1) the weights the checkpoint keeps are one
step's, and one step's noise; an average of the last few hundred steps is the usual
remedy (Polyak averaging). Measured in docs/results/current-defaults.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class WeightAverage:
    """shadow <- decay * shadow + (1 - decay) * parameter, after every optimiser step."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError("the average's decay must be in (0, 1)")
        self.decay = decay
        self.shadow = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(self.shadow, params, 1.0 - self.decay)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own after it."""
        params = list(model.parameters())
        own = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, s in zip(params, self.shadow, strict=True):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, o in zip(params, own, strict=True):
                    p.copy_(o)

    def state(self) -> dict[str, torch.Tensor]:
        return {str(i): s.contiguous() for i, s in enumerate(self.shadow)}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        if len(state) != len(self.shadow):
            raise ValueError("the saved average has another number of parameters")
        self.shadow = [state[str(i)].clone() for i in range(len(self.shadow))]
