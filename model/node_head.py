"""Dynamic node classification: "is this node in state y now?" from its cached state.

A node's input at query time tau is what the link model already computes for links:
its SSM state decayed to tau and read out (``DygMambaLinkModel.node_readout``), plus
three activity numbers the state's header holds (time since its last event in the
model's decay units, log of its event count, whether it has any event) and, where the
head was trained with them, the features of the event being classified. A small MLP
(``NodeClassifierHead``) maps that to one logit. The head never writes state, and a
query reads only the node's own state, so the offline evaluator and the service
compute the same number from the same state (``node_head_inputs`` is that one
function for both).

The inputs are standardised inside the head (mean and std fitted on the training
split, saved as buffers), so the checkpoint is self-contained.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from .link_model import DygMambaLinkModel
from .node_state import NodeStates
from .ssm import gap_units

ACTIVITY_DIM = 3  # log1p(age in decay units), log1p(event count), has-events flag


class NodeHeadConfig(BaseModel):
    """Shapes and inputs of a node-classification head over one link model's states."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    link_model_version: str = Field(
        description="the link model (states) the head was trained on; it reads only those"
    )
    task: str = Field("node-classification", description="what the label means, for humans")
    label: str = Field("label", description="the dataset column the head learned")
    d_readout: int = Field(ge=1, description="width of the link model's node read-out")
    use_activity: bool = Field(True, description="age, event count and has-events inputs")
    event_feature_dim: int = Field(
        0, ge=0, description="features of the classified event in the input (0 = none)"
    )
    hidden: int = Field(64, ge=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="training only")

    @property
    def input_dim(self) -> int:
        return self.d_readout + (ACTIVITY_DIM if self.use_activity else 0) + self.event_feature_dim


@torch.no_grad()
def node_head_inputs(
    model: DygMambaLinkModel,
    config: NodeHeadConfig,
    states: NodeStates,
    tau: torch.Tensor,
    features: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, input_dim) head inputs of N nodes at times tau (float64), from their states.

    A query earlier than a node's last event reads the state at its last event (the
    link model's decay clamps the gap to 0), as link scoring does.
    """
    if not model.config.use_state:
        raise ValueError("a node head needs a link model with use_state (it reads the states)")
    tau = tau.to(torch.float64)
    parts = [model.node_readout_chunked(states.h, states.t_last, tau)]
    if config.use_activity:
        has = torch.isfinite(states.t_last)
        age = torch.where(has, (tau - torch.where(has, states.t_last, tau)).clamp(min=0.0), 0.0)
        units = gap_units(age, model.config.time_norm.scale)
        parts += [
            torch.log1p(units.to(torch.float64)).to(torch.float32).unsqueeze(-1),
            torch.log1p(states.n_events.to(torch.float32)).unsqueeze(-1),
            has.to(torch.float32).unsqueeze(-1),
        ]
    if config.event_feature_dim:
        if features is None or features.shape != (len(tau), config.event_feature_dim):
            raise ValueError(
                f"this head reads the classified event's {config.event_feature_dim} features"
            )
        parts.append(features.to(torch.float32))
    return torch.cat(parts, dim=-1)


class NodeClassifierHead(nn.Module):
    """Standardise the inputs, then a two-hidden-layer MLP to one logit."""

    input_mean: torch.Tensor
    input_std: torch.Tensor

    def __init__(self, config: NodeHeadConfig) -> None:
        super().__init__()
        self.config = config
        d = config.input_dim
        self.register_buffer("input_mean", torch.zeros(d))
        self.register_buffer("input_std", torch.ones(d))
        self.mlp = nn.Sequential(
            nn.Linear(d, config.hidden),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, 1),
        )

    def fit_standardisation(self, x: torch.Tensor) -> None:
        """Mean and std of the training inputs (a constant column gets std 1)."""
        self.input_mean.copy_(x.mean(dim=0))
        std = x.std(dim=0)
        self.input_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp((x - self.input_mean) / self.input_std).squeeze(-1)
