"""Dynamic node classification: "is this node in state y now?" from its cached state.

A node's input at query time tau is what the link model already computes for links:
its SSM state decayed to tau and read out (``DygMambaLinkModel.node_readout``), plus
three activity numbers the state's header holds (time since its last event in the
model's decay units, log of its event count, whether it has any event), the pace of
its recent events (from the event times of the recent-neighbour list kept in the same
blob: the mean standardised log-gap between consecutive events before tau), where the
head was trained with them the features of the event being classified, and, where it
reads them, learned embeddings of the node's latest neighbours' hashed ids (which
items a student visited last: where in a course they stand). A small MLP
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

from .config import TimeNormalisation
from .link_model import DygMambaLinkModel
from .node_state import PAD_KEY, NeighbourLists, NodeStates
from .ssm import gap_units
from .time_encoding import standardised_log_span

ACTIVITY_DIM = 3  # log1p(age in decay units), log1p(event count), has-events flag
RECENT_PACE_DIM = 2  # mean standardised log-gap of the recent events, has-a-gap flag


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
    # False for heads saved before it existed, so they load and score as they did.
    use_recent_pace: bool = Field(
        False, description="mean log-gap between the recent events (from the neighbour list)"
    )
    event_feature_dim: int = Field(
        0, ge=0, description="features of the classified event in the input (0 = none)"
    )
    recent_neighbours: int = Field(
        0, ge=0, le=64, description="embeddings of the latest k neighbours' hashed ids (0 = none)"
    )
    neighbour_embedding_dim: int = Field(8, ge=1, le=256)
    neighbour_buckets: int = Field(1024, ge=1, le=1 << 20, description="hash buckets of the ids")
    hidden: int = Field(64, ge=1)
    members: int = Field(1, ge=1, description="MLPs whose logits are averaged")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="training only")

    @property
    def numeric_dim(self) -> int:
        """The standardised inputs: read-out, activity, recent pace, event features."""
        return (
            self.d_readout
            + (ACTIVITY_DIM if self.use_activity else 0)
            + (RECENT_PACE_DIM if self.use_recent_pace else 0)
            + self.event_feature_dim
        )

    @property
    def input_dim(self) -> int:
        """The numeric inputs, then one bucket index per recent neighbour (embedded)."""
        return self.numeric_dim + self.recent_neighbours

    @property
    def reads_neighbour_lists(self) -> bool:
        return self.use_recent_pace or self.recent_neighbours > 0


def recent_pace(times: torch.Tensor, norm: TimeNormalisation) -> torch.Tensor:
    """(N, 2): the mean standardised log-gap between consecutive recent events of each
    node, and whether there is such a gap (else both 0).

    ``times`` are the recent-neighbour list's event times (N, L) float64, oldest first,
    +inf where empty. The whole list counts: it is kept at the state's watermark, so it
    is what the state has seen; a query earlier than the node's last event reads both
    as they are, as the clamp of the decay does (DESIGN: such a query is clamped). In
    the evaluator a node is read before its event is ingested, so every entry is
    before the query time. Why this input: how fast a node has been acting lately (a
    vandal's burst of edits) is signal that the event count and the last gap alone do
    not carry (docs/RESULTS.md).
    """
    kept = torch.isfinite(times)
    pair = kept[:, 1:] & kept[:, :-1]
    gaps = torch.where(pair, times[:, 1:] - times[:, :-1], 0.0)
    z = standardised_log_span(gaps, norm) * pair
    n = pair.sum(1)
    mean = z.sum(1) / n.clamp(min=1).to(torch.float32)
    has = n > 0
    return torch.stack([torch.where(has, mean, 0.0), has.to(torch.float32)], dim=-1)


def recent_neighbour_buckets(keys: torch.Tensor, depth: int, buckets: int) -> torch.Tensor:
    """(N, depth) float32: the hash buckets of each node's latest ``depth`` neighbours,
    newest first, ``buckets`` (an extra row) where the list has fewer.

    ``keys`` are the recent-neighbour list's node keys (N, L), oldest first and
    right-aligned. The newest entries count whatever the query time, as for the recent
    pace (the list is kept at the state's watermark). The indices travel in the float
    input tensor (exact below 2**24), so every path calls the head with one tensor."""
    if depth > keys.shape[1]:  # a list shorter than depth: empty older ranks
        shape = (len(keys), depth - keys.shape[1])
        keys = torch.cat([keys.new_full(shape, PAD_KEY), keys], dim=1)
    newest = torch.flip(keys[:, -depth:], [1])
    bucket = torch.where(newest == PAD_KEY, buckets, torch.remainder(newest, buckets))
    return bucket.to(torch.float32)


@torch.no_grad()
def node_head_inputs(
    model: DygMambaLinkModel,
    config: NodeHeadConfig,
    states: NodeStates,
    tau: torch.Tensor,
    features: torch.Tensor | None = None,
    neighbours: NeighbourLists | None = None,
) -> torch.Tensor:
    """(N, input_dim) head inputs of N nodes at times tau (float64), from their states
    (and their recent-neighbour lists, for a head that reads the recent pace or the
    latest neighbours).

    A query earlier than a node's last event reads the state at its last event (the
    link model's decay clamps the gap to 0), as link scoring does.
    """
    if not model.config.use_state:
        raise ValueError("a node head needs a link model with use_state (it reads the states)")
    tau = tau.to(torch.float64)
    readout = model.node_readout_chunked(states.h, states.t_last, tau)
    return inputs_around_readout(
        config,
        model.config.time_norm,
        readout,
        states.t_last,
        states.n_events,
        tau,
        features,
        neighbours,
    )


def inputs_around_readout(
    config: NodeHeadConfig,
    norm: TimeNormalisation,
    readout: torch.Tensor,
    t_last: torch.Tensor,
    n_events: torch.Tensor,
    tau: torch.Tensor,
    features: torch.Tensor | None = None,
    neighbours: NeighbourLists | None = None,
) -> torch.Tensor:
    """The head input from a read-out already made: [read-out, activity, recent pace,
    event features, latest neighbours' buckets]. ``node_head_inputs`` (evaluator, service) calls it without
    gradients; fine-tuning calls it with the read-out of the link trainer's re-scan,
    which carries them, so there is one definition of the input for all three."""
    tau = tau.to(torch.float64)
    parts = [readout]
    if config.use_activity:
        has = torch.isfinite(t_last)
        age = torch.where(has, (tau - torch.where(has, t_last, tau)).clamp(min=0.0), 0.0)
        units = gap_units(age, norm.scale)
        parts += [
            torch.log1p(units.to(torch.float64)).to(torch.float32).unsqueeze(-1),
            torch.log1p(n_events.to(torch.float32)).unsqueeze(-1),
            has.to(torch.float32).unsqueeze(-1),
        ]
    if config.reads_neighbour_lists and neighbours is None:
        raise ValueError("this head reads the neighbour lists: pass the nodes' lists")
    if config.use_recent_pace:
        assert neighbours is not None
        parts.append(recent_pace(neighbours.times, norm))
    if config.event_feature_dim:
        if features is None or features.shape != (len(tau), config.event_feature_dim):
            raise ValueError(
                f"this head reads the classified event's {config.event_feature_dim} features"
            )
        parts.append(features.to(torch.float32))
    if config.recent_neighbours:
        assert neighbours is not None
        parts.append(
            recent_neighbour_buckets(
                neighbours.keys, config.recent_neighbours, config.neighbour_buckets
            )
        )
    return torch.cat(parts, dim=-1)


class NodeClassifierHead(nn.Module):
    """Standardise the numeric inputs, embed the recent neighbours' buckets (one table
    per rank, shared by the members), then ``members`` two-hidden-layer MLPs, each to
    one logit; the head's logit is their mean (an ensemble in one checkpoint: with a
    few hundred positives, one MLP's early-stopped epoch is noisy, and the mean of
    several is steadier)."""

    input_mean: torch.Tensor
    input_std: torch.Tensor

    def __init__(self, config: NodeHeadConfig) -> None:
        super().__init__()
        self.config = config
        d = config.numeric_dim
        self.register_buffer("input_mean", torch.zeros(d))
        self.register_buffer("input_std", torch.ones(d))
        if config.recent_neighbours:
            # Small start (as the link model's identity tables): with Adam every entry
            # moves about lr per step whatever its scale.
            tables = [
                nn.Embedding(config.neighbour_buckets + 1, config.neighbour_embedding_dim)
                for _ in range(config.recent_neighbours)
            ]
            for table in tables:
                nn.init.normal_(table.weight, std=0.1)
            self.neighbour_tables = nn.ModuleList(tables)
            d += config.recent_neighbours * config.neighbour_embedding_dim
        # One member keeps the attribute name of heads saved before ensembles existed.
        if config.members == 1:
            self.mlp = self._mlp(d)
        else:
            self.mlps = nn.ModuleList(self._mlp(d) for _ in range(config.members))

    def _mlp(self, d: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(d, self.config.hidden),
            nn.ReLU(),
            nn.Dropout(self.config.dropout),
            nn.Linear(self.config.hidden, self.config.hidden),
            nn.ReLU(),
            nn.Linear(self.config.hidden, 1),
        )

    def fit_standardisation(self, x: torch.Tensor) -> None:
        """Mean and std of the training inputs (a constant column gets std 1)."""
        x = x[:, : self.config.numeric_dim]
        self.input_mean.copy_(x.mean(dim=0))
        std = x.std(dim=0)
        self.input_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def member_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(N, members): each member's logit (training puts a loss on each)."""
        numeric = self.config.numeric_dim
        z = (x[:, :numeric] - self.input_mean) / self.input_std
        if self.config.recent_neighbours:
            buckets = x[:, numeric:].to(torch.long)
            z = torch.cat(
                [z, *(table(buckets[:, r]) for r, table in enumerate(self.neighbour_tables))],
                dim=-1,
            )
        if self.config.members == 1:
            return self.mlp(z)
        return torch.cat([m(z) for m in self.mlps], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.member_logits(x).mean(dim=-1)
