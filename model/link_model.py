"""The causal DyG-Mamba link model: event tokens, stacked SSM layers, read-out, head.

An event (u, v, t, e) gives each endpoint one token built from the *other*
endpoint's hashed-id embedding, the endpoint's role (source or destination), the
edge features and the encoded span since the endpoint's previous event. A token
never reads another node's state, so updates of different nodes are independent.

A query (u, v, tau) decays each node's state to tau with zero input, reads it out
with a linear map of the decayed states, and feeds both read-outs plus the pair
features (``pair_features``) to an MLP head. Scoring never writes state.

With ``identity_match_dim`` the head also gets, per direction, the elementwise
product of a learned embedding of one endpoint's hashed id and embeddings of the other
endpoint's latest neighbours: a low-rank "who follows whom" table (item after item on
MOOC) that the states cannot hold, because a node's state is built from its
neighbours' ids, never its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from torch import nn

from .config import ModelConfig
from .events import EventInputs, NodeEvent, pack_events
from .node_state import NeighbourLists, NodeStates
from .pair_features import pair_feature_dim, pair_inputs_of_rows
from .rank_plan import RankPlan
from .ssm import CACHE_BLOCK_ELEMENTS, LayerState, SelectiveSSMLayer, StepUpdate, gap_units
from .time_encoding import make_time_encoder


def head_inputs(config: ModelConfig, z_u, z_v, pair, match) -> list:
    """The head's inputs in their order, torch tensors or numpy arrays alike (the numpy
    twin in ``model/numpy_scorer.py`` concatenates the same list): both read-outs and
    their product, the pair features, the identity match, each where the config has it."""
    parts = []
    if config.use_state:
        parts += [z_u, z_v, z_u * z_v]
    if config.use_pair_features:
        parts.append(pair)
    if config.identity_match_dim:
        parts.append(match)
    return parts


class DygMambaLinkModel(nn.Module):
    # Submodules that exist only for some configs, typed for the checker (nn.Module's
    # __getattr__ would otherwise make every one "Tensor | Module").
    node_embedding: nn.Embedding | None
    readout: nn.Sequential
    head: nn.Sequential
    match_dst: nn.Embedding
    match_src: nn.Embedding
    match_before_dst: nn.ModuleList
    match_before_src: nn.ModuleList

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.time_encoder = make_time_encoder(c)
        self.node_embedding = (
            nn.Embedding(c.node_hash_buckets, c.d_node) if c.node_hash_buckets else None
        )
        token_in = c.d_time + c.edge_feature_dim + 2 + (c.d_node if c.node_hash_buckets else 0)
        self.token_proj = nn.Linear(token_in, c.d_model)
        self.layers = nn.ModuleList(
            SelectiveSSMLayer(c.d_model, c.d_inner, c.d_state, c.d_conv, c.d_time, c.delta_min)
            for _ in range(c.n_layers)
        )
        head_in = 0
        if c.use_state:
            self.readout = nn.Sequential(
                nn.Linear(c.n_layers * c.d_inner * c.d_state, c.d_out), nn.LayerNorm(c.d_out)
            )
            head_in += 3 * c.d_out
        if c.use_pair_features:
            head_in += pair_feature_dim(c)
        if c.identity_match_dim:
            # Separate tables per direction: on a bipartite graph (students x items) the
            # first direction only ever indexes items and the second only students, so
            # their hashed ids never share a row. One "before" table per neighbour rank.
            d, b, k = c.identity_match_dim, c.node_hash_buckets, c.identity_match_depth
            self.match_dst = nn.Embedding(b, d)
            self.match_src = nn.Embedding(b, d)
            self.match_before_dst = nn.ModuleList(nn.Embedding(b, d) for _ in range(k))
            self.match_before_src = nn.ModuleList(nn.Embedding(b, d) for _ in range(k))
            # Small start: with Adam every entry moves ~lr per step whatever its scale,
            # so from N(0, 1) the tables would stay mostly noise for thousands of steps.
            for table in (
                self.match_dst,
                self.match_src,
                *self.match_before_dst,
                *self.match_before_src,
            ):
                nn.init.normal_(table.weight, std=0.1)
            head_in += 2 * d
        self.head = nn.Sequential(
            nn.Linear(head_in, c.head_hidden),
            nn.ReLU(),
            nn.Linear(c.head_hidden, c.head_hidden),
            nn.ReLU(),
            nn.Linear(c.head_hidden, 1),
        )

    def ssm_layers(self) -> list[SelectiveSSMLayer]:
        """The SSM layers, typed (an ``nn.ModuleList`` yields plain Modules to a checker)."""
        return [cast(SelectiveSSMLayer, layer) for layer in self.layers]

    # ----- tokens --------------------------------------------------------------------
    def tokens(
        self, ev: EventInputs, gap: torch.Tensor, first: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token residual stream, gap in units and encoded gap for events of any shape."""
        phi = self.time_encoder(gap)
        parts = [
            phi,
            ev.features.to(torch.float32),
            ev.role.to(torch.float32).unsqueeze(-1),
            first.to(torch.float32).unsqueeze(-1),
        ]
        if self.node_embedding is not None:
            parts.append(
                self.node_embedding(torch.remainder(ev.other_key, self.config.node_hash_buckets))
            )
        r = self.token_proj(torch.cat(parts, dim=-1))
        return r, gap_units(gap, self.config.time_norm.scale), phi

    @staticmethod
    def _gap(t: torch.Tensor, t_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gap since the previous event (float64) and a "first event" flag; 0 when first."""
        first = ~torch.isfinite(t_prev)
        gap = torch.where(
            first, torch.zeros_like(t), t.to(torch.float64) - torch.where(first, t, t_prev)
        )
        return gap, first

    # ----- one event per node ----------------------------------------------------------
    def step(self, states: NodeStates, ev: EventInputs) -> NodeStates:
        """Apply one event to each of N nodes (ev fields shaped (N,))."""
        gap, first = self._gap(ev.t, states.t_last)
        r, g, phi = self.tokens(ev, gap, first)
        hs, convs = [], []
        for i, layer in enumerate(self.ssm_layers()):
            r, new = layer.step(LayerState(states.h[:, i], states.conv[:, i]), r, g, phi)
            hs.append(new.h)
            convs.append(new.conv)
        return NodeStates(
            h=torch.stack(hs, dim=1),
            conv=torch.stack(convs, dim=1),
            t_last=ev.t.to(torch.float64),
            last_seq=ev.seq.to(torch.int64),
            n_events=states.n_events + 1,
        )

    # ----- many events of many nodes, packed rank-major ---------------------------------
    def apply_ranked(
        self,
        states0: NodeStates,
        ev: EventInputs,
        plan: RankPlan,
        step_update: StepUpdate | None = None,
    ) -> NodeStates:
        """Apply each node's events, packed rank-major by ``plan`` (ev fields shaped (E,)).

        ``states0`` and the result are in the caller's node order; the plan's sorting
        stays inside. Equal to folding ``step`` over each node's events (tested).
        ``step_update``: run each rank's recurrence through mamba-ssm's
        ``selective_state_update`` (or its twin) instead (``model.kernels``).
        """
        if plan.num_events == 0:
            return states0.clone()
        dev = states0.h.device  # the plan is built on the host; its indices go where the states are
        ev = ev.to(dev)
        # A caller that lists its nodes longest first (the service decodes them so) saves
        # two copies of every state: the gather into plan order and the one back.
        keeps_order = plan.keeps_order
        s = states0 if keeps_order else states0.select(torch.from_numpy(plan.order).to(dev))
        t = ev.t.to(torch.float64)
        prev_pos, has_prev = (x.to(dev) for x in plan.previous_event())
        t_prev = torch.where(
            has_prev, t[prev_pos], s.t_last[torch.from_numpy(plan.node_of).to(dev)]
        )
        gap, first = self._gap(t, t_prev)
        r, g, phi = self.tokens(ev, gap, first)
        k1 = self.config.d_conv - 1
        windows, tails = plan.conv_windows(k1).to(dev), plan.final_tails(k1).to(dev)
        hs, convs = [], []
        for i, layer in enumerate(self.ssm_layers()):
            last_layer = i == len(self.layers) - 1
            out, new = layer.ranked(
                LayerState(s.h[:, i], s.conv[:, i]),
                r,
                g,
                phi,
                plan,
                windows,
                tails,
                need_outputs=not last_layer,
                step_update=step_update,
            )
            r = out if out is not None else r
            hs.append(new.h)
            convs.append(new.conv)
        lengths = torch.from_numpy(plan.lengths).to(dev)
        has = lengths > 0
        last = plan.last_event().to(dev)
        final = NodeStates(
            h=torch.stack(hs, dim=1),
            conv=torch.stack(convs, dim=1),
            t_last=torch.where(has, t[last], s.t_last),
            last_seq=torch.where(has, ev.seq.to(torch.int64)[last], s.last_seq),
            n_events=s.n_events + lengths,
        )
        return (
            final if keeps_order else final.select(torch.from_numpy(np.argsort(plan.order)).to(dev))
        )

    # ----- padded sequences ------------------------------------------------------------
    def scan(
        self,
        states0: NodeStates,
        ev: EventInputs,
        lengths: torch.Tensor,
        return_states: bool = False,
        chunk: int = 64,
    ) -> tuple[NodeStates, torch.Tensor | None]:
        """Apply up to T events per node (ev fields shaped (N, T), padded past ``lengths``).

        Returns the final states and, if asked, the SSM state after every position,
        (N, T, n_layers, d_inner, d_state), for exact-visibility scoring in training.
        """
        n, t_len = ev.t.shape
        t = ev.t.to(torch.float64)
        prev = torch.cat([states0.t_last.unsqueeze(1), t[:, :-1]], dim=1)
        gap, first = self._gap(t, prev)
        r, g, phi = self.tokens(ev, gap, first)
        hs, convs, per_pos = [], [], []
        for i, layer in enumerate(self.ssm_layers()):
            res = layer.scan(
                LayerState(states0.h[:, i], states0.conv[:, i]),
                r,
                g,
                phi,
                lengths,
                chunk,
                return_states,
            )
            r = res.outputs
            hs.append(res.final.h)
            convs.append(res.final.conv)
            if return_states:
                assert res.states is not None
                per_pos.append(res.states)
        last = (lengths - 1).clamp(min=0).unsqueeze(1)
        has = lengths > 0
        final = NodeStates(
            h=torch.stack(hs, dim=1),
            conv=torch.stack(convs, dim=1),
            t_last=torch.where(has, t.gather(1, last).squeeze(1), states0.t_last),
            last_seq=torch.where(has, ev.seq.gather(1, last).squeeze(1), states0.last_seq),
            n_events=states0.n_events + lengths,
        )
        return final, (torch.stack(per_pos, dim=2) if return_states else None)

    # ----- queries -----------------------------------------------------------------------
    def decay(self, h: torch.Tensor, t_last: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Zero-input evolution of stacked states h (N, n_layers, di, ds) from t_last to tau.

        A query earlier than t_last is clamped to t_last (gap 0): scoring never rewinds.
        """
        has = torch.isfinite(t_last)
        gap = torch.where(
            has, (tau.to(torch.float64) - torch.where(has, t_last, tau)).clamp(min=0.0), 0.0
        )
        g = gap_units(gap, self.config.time_norm.scale)
        return torch.stack(
            [layer.decay(h[:, i], g) for i, layer in enumerate(self.ssm_layers())], dim=1
        )

    def node_readout(
        self, h: torch.Tensor, t_last: torch.Tensor, tau: torch.Tensor
    ) -> torch.Tensor:
        return self.readout(self.decay(h, t_last, tau).flatten(1))

    def node_readout_chunked(
        self, h: torch.Tensor, t_last: torch.Tensor, tau: torch.Tensor
    ) -> torch.Tensor:
        """``node_readout`` in row chunks that fit in cache (``ssm.CACHE_BLOCK_ELEMENTS``);
        each row's value does not depend on the chunking. For the serving path only: the
        ONNX export traces ``node_readout``, where a branch on N would fix the batch size."""
        rows = max(1, CACHE_BLOCK_ELEMENTS // max(1, h[0].numel())) if len(h) else 1
        if len(h) <= rows:
            return self.node_readout(h, t_last, tau)
        return torch.cat(
            [
                self.readout(
                    self.decay(h[i : i + rows], t_last[i : i + rows], tau[i : i + rows]).flatten(1)
                )
                for i in range(0, len(h), rows)
            ]
        )

    def identity_match(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, 2 * identity_match_dim) from ``pair_identity_keys`` rows: v against u's
        latest neighbours, then u against v's. Each side is the product of the node's
        own embedding and the sum of its counterpart's neighbours' embeddings (one table
        per rank, newest first; an empty rank adds nothing)."""
        buckets, k = self.config.node_hash_buckets, self.config.identity_match_depth

        def match(
            own_table: nn.Embedding,
            own: torch.Tensor,
            before: nn.ModuleList,
            previous: torch.Tensor,
        ) -> torch.Tensor:
            e_prev = sum(
                table(torch.remainder(previous[:, r].clamp(min=0), buckets))
                * (previous[:, r] >= 0).unsqueeze(-1).to(torch.float32)
                for r, table in enumerate(before)
            )
            return own_table(torch.remainder(own, buckets)) * e_prev

        return torch.cat(
            [
                match(self.match_dst, ids[:, 1], self.match_before_dst, ids[:, 2 : 2 + k]),
                match(self.match_src, ids[:, 0], self.match_before_src, ids[:, 2 + k : 2 + 2 * k]),
            ],
            dim=-1,
        )

    def head_logit(
        self,
        z_u: torch.Tensor | None,
        z_v: torch.Tensor | None,
        pair: torch.Tensor | None,
        pair_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        match = None
        if self.config.identity_match_dim:
            if pair_ids is None:
                raise ValueError(
                    "this model matches node ids: pass pair_ids (pair_features.pair_identity_keys)"
                )
            match = self.identity_match(pair_ids)
        return self.head(
            torch.cat(head_inputs(self.config, z_u, z_v, pair, match), dim=-1)
        ).squeeze(-1)

    def score_states(
        self,
        su: NodeStates,
        sv: NodeStates,
        tau: torch.Tensor,
        pair: torch.Tensor | None,
        pair_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for N pairs from their (cached) states at query times tau."""
        z_u = self.node_readout(su.h, su.t_last, tau) if self.config.use_state else None
        z_v = self.node_readout(sv.h, sv.t_last, tau) if self.config.use_state else None
        return self.head_logit(z_u, z_v, pair, pair_ids)

    # ----- the served-model protocol (model.protocol.ServedModel) ---------------------
    def advance(self, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]) -> NodeStates:
        """All nodes' events at once, packed rank-major (one pass over all events for
        everything but the recurrence, then one slice-multiply-add per rank)."""
        plan = RankPlan.build([len(e) for e in per_node])
        return self.apply_ranked(
            states, pack_events(per_node, plan, self.config.edge_feature_dim), plan
        )

    def score_nodes(
        self,
        states: NodeStates,
        lists: NeighbourLists,
        keys: torch.Tensor,
        iu: torch.Tensor,
        iv: torch.Tensor,
        tau: torch.Tensor,
    ) -> torch.Tensor:
        """Logits of pairs given as rows ``iu``, ``iv`` of one set of node states.

        The service loads each distinct node once; copying its state out per pair cost
        more than the read-out. When all pairs share one query time (a rank request, a
        batch at "now"), each node is decayed and read out once and the small read-outs
        are gathered per pair. Equal to ``streaming.score`` on the gathered states (tested).
        """
        tau = tau.to(torch.float64)
        pair, ids = pair_inputs_of_rows(self.config, states, lists, keys, iu, iv, tau)
        if not self.config.use_state:
            return self.head_logit(None, None, pair, ids)
        if len(tau) and bool((tau == tau[0]).all()):
            z = self.node_readout_chunked(states.h, states.t_last, tau[:1].expand(len(states)))
            z_u, z_v = z[iu], z[iv]
        else:
            z_u = self.node_readout_chunked(states.h[iu], states.t_last[iu], tau)
            z_v = self.node_readout_chunked(states.h[iv], states.t_last[iv], tau)
        return self.head_logit(z_u, z_v, pair, ids)
