"""Pair and node-activity features for the link head, from recent-neighbour lists.

Each node keeps its last L neighbours with their times (oldest first, padded with
key -1). For a query (u, v, tau) the features use only neighbours with time <= tau,
as the node states hold every applied event up to tau. What has been applied is the
caller's choice of visibility: the exact evaluator scores a timestamp's queries before
it applies that timestamp's events (so nothing at tau is in the lists), batch
visibility and a live service have applied the earlier events of the same timestamp,
and those count (on snapshot streams, the snapshot so far). Entries after tau (a
query clamped behind a node's last event) never count:

* how often v appears in u's list and u in v's list (repeat-edge signal),
* the common-neighbour mass sum_w min(cnt_u[w], cnt_v[w]) (DyGFormer co-occurrence),
* the recency of the last u-v interaction (standardised log-span, and a "never" flag),
* each node's list fill and total applied events (activity), and the standardised
  log-span since each node's last event;
* with ``snapshot_pair_features``, each node's visible entries at tau and at its
  latest earlier time: on a snapshot stream under batch visibility, its events of the
  snapshot so far and of the snapshot before;
* with ``role_counts``, each node's in- and out-events over its whole history, from the
  record kept beside its list (``model/role_counts.py``), which the list alone cannot count.

All counts enter as log1p. The same function runs in the trainer and the service.

``pair_identity_keys`` gives the head the ids it matches when the config has
``identity_match_dim``: each endpoint's own key and the other endpoint's latest
``identity_match_depth`` visible neighbours. On MOOC (students x course items) "v is the item that usually
follows u's last item" alone ranks validation positives over random items at 0.94
AP, and nothing in the counts above or in v's state (built from v's *neighbours'*
ids) can say which item v is.
"""

from __future__ import annotations

import torch

from .config import ModelConfig, TimeNormalisation
from .node_state import PAD_KEY, NeighbourLists, NodeStates
from .role_counts import ROLE_COUNT_FEATURES, role_count_features
from .time_encoding import standardised_log_span
from .transition_counts import TRANSITION_DEPTH, transition_feature_dim, transition_features

PAIR_FEATURE_DIM = 11
SNAPSHOT_FEATURE_DIM = 4  # ModelConfig.snapshot_pair_features: 2 per endpoint


def pair_feature_dim(config: ModelConfig) -> int:
    """Columns of the pair features the config computes."""
    snapshot = SNAPSHOT_FEATURE_DIM if config.snapshot_pair_features else 0
    counts = 2 * ROLE_COUNT_FEATURES if config.role_counts else 0
    transitions = transition_feature_dim(
        config.transition_buckets,
        config.transition_decay,
        config.transition_order2,
        config.latest_transition_count,
    )
    return PAIR_FEATURE_DIM + snapshot + counts + transitions


def pair_features(
    key_u: torch.Tensor,  # (N,) int64
    key_v: torch.Tensor,  # (N,) int64
    tau: torch.Tensor,  # (N,) float64 query times
    nbr_u: torch.Tensor,  # (N, L) int64 neighbour keys of u, PAD_KEY where empty
    nbr_t_u: torch.Tensor,  # (N, L) float64
    nbr_v: torch.Tensor,
    nbr_t_v: torch.Tensor,
    n_events_u: torch.Tensor,  # (N,) int64 applied events (all history, not only the list)
    n_events_v: torch.Tensor,
    t_last_u: torch.Tensor,  # (N,) float64, -inf when none
    t_last_v: torch.Tensor,
    norm: TimeNormalisation,
    snapshot_counts: bool = False,
) -> torch.Tensor:
    tau_col = tau.to(torch.float64).unsqueeze(1)
    ok_u = (nbr_u != PAD_KEY) & (nbr_t_u <= tau_col)
    ok_v = (nbr_v != PAD_KEY) & (nbr_t_v <= tau_col)
    okf_u, okf_v = ok_u.to(torch.float32), ok_v.to(torch.float32)

    v_in_u = (nbr_u == key_v.unsqueeze(1)) & ok_u
    u_in_v = (nbr_v == key_u.unsqueeze(1)) & ok_v
    cnt_v_in_u = v_in_u.sum(1).to(torch.float32)
    cnt_u_in_v = u_in_v.sum(1).to(torch.float32)

    # Common-neighbour mass: sum over keys w of min(cu[w], cv[w]), the size of the two
    # lists' multiset intersection (numpy_scorer's twin counts it as the sum over u-slots
    # of min(1, cv[w] / cu[w])). Slots that are empty or not yet visible get distinct
    # negative keys (real keys are >= 0), so they match nothing. With both rows sorted,
    # the k-th copy of w in u (k from 0) has a partner in v when k < cv[w]: O(N L log L)
    # instead of (N, L, L) comparisons, 30x less at L = 128.
    len_u = nbr_u.shape[1]
    hidden_u = -2 - torch.arange(len_u, device=nbr_u.device)
    hidden_v = -2 - len_u - torch.arange(nbr_v.shape[1], device=nbr_v.device)
    su = torch.where(ok_u, nbr_u, hidden_u).sort(dim=1).values
    sv = torch.where(ok_v, nbr_v, hidden_v).sort(dim=1).values
    copy_index = torch.arange(len_u, device=su.device) - torch.searchsorted(su, su)
    in_v = torch.searchsorted(sv, su, right=True) - torch.searchsorted(sv, su)
    common = (copy_index < in_v).sum(1, dtype=torch.int32).to(torch.float32)

    # Recency of the last u-v interaction seen from either side.
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    last_uv = torch.maximum(
        torch.where(v_in_u, nbr_t_u, neg_inf).amax(1), torch.where(u_in_v, nbr_t_v, neg_inf).amax(1)
    )
    seen = torch.isfinite(last_uv)
    recency = torch.where(
        seen, standardised_log_span(tau - torch.where(seen, last_uv, tau), norm), 0.0
    )

    def since_last(t_last: torch.Tensor) -> torch.Tensor:
        has = torch.isfinite(t_last)
        return torch.where(
            has, standardised_log_span(tau - torch.where(has, t_last, tau), norm), 0.0
        )

    feats = [
        torch.log1p(cnt_v_in_u),
        torch.log1p(cnt_u_in_v),
        torch.log1p(common),
        recency,
        seen.to(torch.float32),
        torch.log1p(okf_u.sum(1)),
        torch.log1p(okf_v.sum(1)),
        torch.log1p(n_events_u.to(torch.float32)),
        torch.log1p(n_events_v.to(torch.float32)),
        since_last(t_last_u),
        since_last(t_last_v),
    ]
    if snapshot_counts:
        feats += snapshot_features(nbr_t_u, ok_u, tau_col) + snapshot_features(
            nbr_t_v, ok_v, tau_col
        )
    return torch.stack(feats, dim=1)


def snapshot_features(
    nbr_t: torch.Tensor, ok: torch.Tensor, tau_col: torch.Tensor
) -> list[torch.Tensor]:
    """A node's visible list entries at the query time (on a snapshot stream under batch
    visibility: its events of the snapshot so far) and at its latest earlier time (the
    snapshot before), log1p'd. They count what a node did this snapshot and the last
    one, which the decayed state blurs (Can. Parl.: a bill sponsor's many in-edges)."""
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    at_tau = (ok & (nbr_t == tau_col)).sum(1).to(torch.float32)
    before = ok & (nbr_t < tau_col)
    prev_t = torch.where(before, nbr_t, neg_inf).amax(1, keepdim=True)
    at_prev = (before & (nbr_t == prev_t)).sum(1).to(torch.float32)
    return [torch.log1p(at_tau), torch.log1p(at_prev)]


def latest_visible_neighbours(
    nbr: torch.Tensor, nbr_t: torch.Tensor, tau: torch.Tensor, depth: int
) -> torch.Tensor:
    """(N, depth) keys of each node's latest ``depth`` neighbours with time <= tau, newest
    first, PAD_KEY where there are fewer."""
    ok = (nbr != PAD_KEY) & (nbr_t <= tau.to(torch.float64).unsqueeze(1))
    # How many visible slots sit at or after each slot: 1 marks the newest visible one.
    from_newest = torch.flip(torch.cumsum(torch.flip(ok.to(torch.int32), [1]), 1), [1])
    out = []
    for k in range(1, depth + 1):
        hit = ok & (from_newest == k)
        key = nbr.gather(1, hit.to(torch.int8).argmax(1, keepdim=True)).squeeze(1)
        out.append(torch.where(hit.any(1), key, PAD_KEY))
    return torch.stack(out, dim=1)


def pair_id_columns(depth: int) -> int:
    """Width of ``pair_identity_keys`` rows."""
    return 2 + 2 * depth


def pair_identity_keys(
    key_u: torch.Tensor,
    key_v: torch.Tensor,
    tau: torch.Tensor,
    nbr_u: torch.Tensor,
    nbr_t_u: torch.Tensor,
    nbr_v: torch.Tensor,
    nbr_t_v: torch.Tensor,
    depth: int = 1,
) -> torch.Tensor:
    """(N, pair_id_columns(depth)) int64: key_u, key_v, then the latest ``depth`` visible
    neighbours of u (newest first), then those of v."""
    return torch.cat(
        [
            key_u.unsqueeze(1),
            key_v.unsqueeze(1),
            latest_visible_neighbours(nbr_u, nbr_t_u, tau, depth),
            latest_visible_neighbours(nbr_v, nbr_t_v, tau, depth),
        ],
        dim=1,
    )


def pair_inputs(
    config: ModelConfig,
    key_u: torch.Tensor,
    key_v: torch.Tensor,
    tau: torch.Tensor,
    lists_u: NeighbourLists,
    lists_v: NeighbourLists,
    n_events_u: torch.Tensor,
    n_events_v: torch.Tensor,
    t_last_u: torch.Tensor,
    t_last_v: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The head's pair inputs of pairs (u_i, v_i, tau_i), each where the config has it:
    the pair features and the identity-match keys (None where it has not)."""
    pair = ids = None
    if config.use_pair_features:
        pair = pair_features(
            key_u,
            key_v,
            tau,
            lists_u.keys,
            lists_u.times,
            lists_v.keys,
            lists_v.times,
            n_events_u,
            n_events_v,
            t_last_u,
            t_last_v,
            config.time_norm,
            config.snapshot_pair_features,
        )
        if config.role_counts:
            if lists_u.records is None or lists_v.records is None:
                raise ValueError("this model reads role counts: the lists must carry them")
            tau_np = tau.detach().cpu().numpy()
            ends = [
                torch.from_numpy(
                    role_count_features(r.cpu().numpy(), tau_np, config.role_count_unit)
                ).to(pair.device)
                for r in (lists_u.records, lists_v.records)
            ]
            pair = torch.cat([pair, *ends], dim=1)
        if config.transition_buckets:
            pair = torch.cat([pair, transition_inputs(config, tau, lists_u, lists_v)], dim=1)
    if config.identity_match_dim:
        ids = pair_identity_keys(
            key_u,
            key_v,
            tau,
            lists_u.keys,
            lists_u.times,
            lists_v.keys,
            lists_v.times,
            config.identity_match_depth,
        )
    return pair, ids


def transition_inputs(
    config: ModelConfig, tau: torch.Tensor, lists_u: NeighbourLists, lists_v: NeighbourLists
) -> torch.Tensor:
    """The transition-count columns of pairs (``model/transition_counts.py``): v's
    record at u's latest visible neighbours and u's at v's."""
    if lists_u.transitions is None or lists_v.transitions is None:
        raise ValueError("this model reads transition counts: the lists must carry them")
    latest_u = latest_visible_neighbours(lists_u.keys, lists_u.times, tau, TRANSITION_DEPTH)
    latest_v = latest_visible_neighbours(lists_v.keys, lists_v.times, tau, TRANSITION_DEPTH)
    feats = transition_features(
        lists_u.transitions,
        lists_v.transitions,
        latest_u.cpu().numpy(),
        latest_v.cpu().numpy(),
        config.transition_buckets,
        config.transition_decay,
        tau.detach().cpu().numpy(),
        lists_u.times[:, -1].cpu().numpy(),
        lists_v.times[:, -1].cpu().numpy(),
        config.transition_order2,
        config.latest_transition_count,
    )
    return torch.from_numpy(feats).to(lists_u.keys.device)


def pair_inputs_of_rows(
    config: ModelConfig,
    states: NodeStates,
    lists: NeighbourLists,
    keys: torch.Tensor,
    iu: torch.Tensor,
    iv: torch.Tensor,
    tau: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``pair_inputs`` of pairs given as rows ``iu``, ``iv`` of one set of node states
    and lists (each distinct node loaded once, as the service and its evaluators hold them)."""
    return pair_inputs(
        config,
        keys[iu],
        keys[iv],
        tau,
        lists.select(iu),
        lists.select(iv),
        states.n_events[iu],
        states.n_events[iv],
        states.t_last[iu],
        states.t_last[iv],
    )
