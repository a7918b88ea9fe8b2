"""What every model backend offers the evaluator and the service (``ServedModel``):
the torch model (``model.link_model.DygMambaLinkModel``) and the onnxruntime one
(``model.onnx.runtime.OnnxLinkModel``) implement it, each with its own fastest
way to advance states and score pairs; ``model.streaming`` calls it without asking
which backend it holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Self

import torch

from .config import ModelConfig
from .events import NodeEvent
from .node_state import NeighbourLists, NodeStates


class ServedModel(Protocol):
    config: ModelConfig

    def eval(self) -> Self: ...

    def advance(self, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]) -> NodeStates:
        """Apply each node's new events (in (t, seq) order) to its state, all at once."""
        ...

    def score_states(
        self,
        su: NodeStates,
        sv: NodeStates,
        tau: torch.Tensor,
        pair: torch.Tensor | None,
        pair_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of N pairs from their states (decayed to tau) and pair inputs."""
        ...

    def score_nodes(
        self,
        states: NodeStates,
        lists: NeighbourLists,
        keys: torch.Tensor,
        iu: torch.Tensor,
        iv: torch.Tensor,
        tau: torch.Tensor,
    ) -> torch.Tensor:
        """Logits of pairs given as rows ``iu``, ``iv`` of one set of node states."""
        ...
