"""Which computation advances node states, and the advance itself (``KernelAdvancer``).

Three paths, chosen once per loaded model (``kernel_advancer``):

* ``mamba-ssm``: CUDA, mamba-ssm importable, and a checkpoint with ``delta_min > 0``
  (its event steps are what the kernels compute, ``model.ssm``). Cold nodes (zero
  initial state: no blob yet, a new model version, an evicted state) go through one
  padded ``selective_scan_fn`` + ``causal_conv1d_fn`` per batch of similar history
  lengths (``model.kernels.cold_scan``); nodes with a carried state and a few new events
  (an ingest) take one ``selective_state_update`` per event rank, on the prefix of the
  node states that has a k-th event; a carried state with a long catch-up (a stale
  blob) takes torch's rank-major path on the CUDA tensors, since mamba's scan takes no
  initial state.
* ``torch-cuda``: CUDA without the kernels (not installed, not built for this GPU, or a
  checkpoint without the step floor): torch's rank-major path on CUDA tensors.
* ``torch-cpu``: torch's rank-major path on the CPU.

Every path is tested equal to the plain fold of ``step``: the rank-major one in
tests/model/test_streaming.py, the kernel layout with the CPU twin of the kernels in
tests/model/kernels/, and the CUDA kernels against the twin on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..events import NodeEvent, pack_events
from ..link_model import DygMambaLinkModel
from ..node_state import NodeStates
from ..rank_plan import RankPlan
from .batching import length_batches
from .cold_scan import cold_scan
from .ops import KernelOps, load_mamba_ops

KERNEL_PATHS = ("mamba-ssm", "torch-cuda", "torch-cpu")

# A carried state with up to this many new events is stepped one event rank at a time by
# ``selective_state_update`` (an ingest batch: most nodes have one to a few events);
# more is a catch-up (a stale blob) and goes rank-major. A starting point, to be tuned on
# a GPU machine (docs/BENCHMARKS.md, GPU section).
STEP_KERNEL_MAX_EVENTS = 16
# Padded events (rows x longest history) per cold-scan batch: about 10 float32 buffers of
# d_inner per padded event live at once, ~2.5 GB at d_inner 64.
COLD_SCAN_MAX_PADDED_EVENTS = 1 << 20


@dataclass
class KernelAdvancer:
    """``advance(states, per_node)`` on ``device`` by ``path`` (see the module doc)."""

    model: DygMambaLinkModel
    device: torch.device
    ops: KernelOps | None  # None: the rank-major path for every node
    path: str
    reason: str  # why this path and not the kernels ("" on the kernel path)
    step_max_events: int = STEP_KERNEL_MAX_EVENTS
    max_padded_events: int = COLD_SCAN_MAX_PADDED_EVENTS

    @torch.no_grad()
    def advance(self, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]) -> NodeStates:
        """Apply each node's events (in (t, seq) order) to its state; states on ``device``."""
        if len(states) == 0:
            return states
        if self.ops is None:
            return self.model.advance(states, per_node)
        lengths = np.fromiter((len(e) for e in per_node), dtype=np.int64, count=len(per_node))
        # Mamba's scan starts from the zero state: only nodes with no applied event and
        # an all-zero state (``NodeStates.initial``: a cold node) can take it.
        zero_start = (
            (
                (states.n_events == 0)
                & ~torch.isfinite(states.t_last)
                & (states.h.flatten(1) == 0).all(1)
                & (states.conv.flatten(1) == 0).all(1)
            )
            .cpu()
            .numpy()
        )
        cold = zero_start & (lengths > 0)
        carried = ~zero_start & (lengths > 0)
        out = states.clone()
        cold_rows = np.flatnonzero(cold)
        for group in length_batches(lengths[cold_rows], self.max_padded_events):
            rows = cold_rows[group]
            new = cold_scan(self.model, self.ops, [per_node[i] for i in rows.tolist()], self.device)
            _assign(out, rows, new)
        short = carried & (lengths <= self.step_max_events)
        for mask, step_update in (
            (short, self.ops.selective_state_update),
            (carried & ~short, None),
        ):
            rows = np.flatnonzero(mask)
            if len(rows):
                sub = [per_node[i] for i in rows.tolist()]
                plan = RankPlan.build([len(e) for e in sub])
                idx = torch.from_numpy(rows).to(states.h.device)
                new = self.model.apply_ranked(
                    states.select(idx),
                    pack_events(sub, plan, self.model.config.edge_feature_dim),
                    plan,
                    step_update=step_update,
                )
                _assign(out, rows, new)
        return out


def _assign(target: NodeStates, rows: np.ndarray, source: NodeStates) -> None:
    idx = torch.from_numpy(rows).to(target.h.device)
    target.h[idx], target.conv[idx] = source.h, source.conv
    target.t_last[idx], target.last_seq[idx], target.n_events[idx] = (
        source.t_last,
        source.last_seq,
        source.n_events,
    )


def kernel_advancer(model: DygMambaLinkModel, device: torch.device) -> KernelAdvancer:
    """The advance path for ``model`` on ``device``: the kernels where they can run."""
    if device.type != "cuda":
        return KernelAdvancer(model, device, None, "torch-cpu", "no CUDA device")
    ops, why_not = load_mamba_ops()
    if ops is None:
        return KernelAdvancer(model, device, None, "torch-cuda", why_not)
    if model.config.delta_min <= 0:
        return KernelAdvancer(
            model,
            device,
            None,
            "torch-cuda",
            "the checkpoint's event steps have no floor (delta_min = 0, saved before the"
            " field existed): the kernels would divide by zero-length steps",
        )
    return KernelAdvancer(model, device, ops, "mamba-ssm", "")
