"""Scoring of a few pairs in numpy: the serving twin of ``streaming.score_nodes``.

A lone ``GET /v1/score`` runs the read-out, the pair features and the head on two
nodes. In torch that is about a hundred tiny ops, each paying torch's Python binding
and dispatcher; between requests other processes push that code out of the CPU's
caches, and one pair measured 1.1-1.5 ms of CPU in a serving-like loop against 0.5 ms
when called back to back. numpy's ufuncs on arrays of a few dozen elements cost a
fraction of that. For big calls torch's kernels win, so the service takes this path
only up to ``Settings.numpy_score_max_pairs`` pairs (``service.engine.Engine._score``).

Everything that defines the model stays in torch: the parameters are read from the
torch module once (``log_decay_rate`` is evaluated by the module itself), and the
functions below repeat ``pair_features``, ``latest_visible_neighbours``,
``DygMambaLinkModel.decay``/``node_readout``/``identity_match``/``head_logit`` op for
op in the same dtypes (float64 times, float32 values). Tested equal to the torch path
(tests/model/test_numpy_scorer.py) on random states for every model variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig, TimeNormalisation
from .link_model import DygMambaLinkModel, head_inputs
from .node_state import PAD_KEY
from .role_counts import role_count_features
from .ssm import _FLOOR_FACTOR, LOG_DECAY_FLOOR, MAX_GAP_UNITS
from .transition_counts import TRANSITION_DEPTH, DenseTransitions, transition_features


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


@dataclass(frozen=True)
class _Linear:
    weight_t: np.ndarray  # (in, out): transposed once so a call is one matmul
    bias: np.ndarray | None

    @classmethod
    def of(cls, layer: torch.nn.Linear) -> _Linear:
        return cls(_np(layer.weight).T.copy(), None if layer.bias is None else _np(layer.bias))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


def standardised_log_span(span: np.ndarray, norm: TimeNormalisation) -> np.ndarray:
    """``time_encoding.standardised_log_span`` for float64 arrays."""
    s = np.maximum(span, 0.0) / norm.scale
    return ((np.log1p(s) - norm.log_mean) / norm.log_std).astype(np.float32)


def pair_features(
    key_u: np.ndarray,
    key_v: np.ndarray,
    tau: np.ndarray,
    nbr_u: np.ndarray,
    nbr_t_u: np.ndarray,
    nbr_v: np.ndarray,
    nbr_t_v: np.ndarray,
    n_events_u: np.ndarray,
    n_events_v: np.ndarray,
    t_last_u: np.ndarray,
    t_last_v: np.ndarray,
    norm: TimeNormalisation,
    snapshot_counts: bool = False,
) -> np.ndarray:
    """``pair_features.pair_features`` on numpy arrays (same order of columns)."""
    tau_col = tau[:, None]
    ok_u = (nbr_u != PAD_KEY) & (nbr_t_u <= tau_col)
    ok_v = (nbr_v != PAD_KEY) & (nbr_t_v <= tau_col)
    v_in_u = (nbr_u == key_v[:, None]) & ok_u
    u_in_v = (nbr_v == key_u[:, None]) & ok_v
    len_u = nbr_u.shape[1]
    mu = np.where(ok_u, nbr_u, -2 - np.arange(len_u))
    mv = np.where(ok_v, nbr_v, -2 - len_u - np.arange(nbr_v.shape[1]))
    cv_at_u = (mu[:, :, None] == mv[:, None, :]).sum(2, dtype=np.int32).astype(np.float32)
    cu_at_u = (mu[:, :, None] == mu[:, None, :]).sum(2, dtype=np.int32).astype(np.float32)
    common = (np.minimum(cv_at_u, cu_at_u) / cu_at_u * ok_u).sum(1, dtype=np.float32)

    last_uv = np.maximum(
        np.where(v_in_u, nbr_t_u, -np.inf).max(1, initial=-np.inf),
        np.where(u_in_v, nbr_t_v, -np.inf).max(1, initial=-np.inf),
    )
    seen = np.isfinite(last_uv)

    def since(t_prev: np.ndarray, has: np.ndarray) -> np.ndarray:
        return np.where(
            has, standardised_log_span(tau - np.where(has, t_prev, tau), norm), np.float32(0.0)
        )

    feats = [
        np.log1p(v_in_u.sum(1, dtype=np.float32)),
        np.log1p(u_in_v.sum(1, dtype=np.float32)),
        np.log1p(common),
        since(last_uv, seen),
        seen.astype(np.float32),
        np.log1p(ok_u.sum(1, dtype=np.float32)),
        np.log1p(ok_v.sum(1, dtype=np.float32)),
        np.log1p(n_events_u.astype(np.float32)),
        np.log1p(n_events_v.astype(np.float32)),
        since(t_last_u, np.isfinite(t_last_u)),
        since(t_last_v, np.isfinite(t_last_v)),
    ]
    if snapshot_counts:
        feats += snapshot_features(nbr_t_u, ok_u, tau_col)
        feats += snapshot_features(nbr_t_v, ok_v, tau_col)
    return np.stack(feats, axis=1).astype(np.float32, copy=False)


def snapshot_features(nbr_t: np.ndarray, ok: np.ndarray, tau_col: np.ndarray) -> list[np.ndarray]:
    """``pair_features.snapshot_features`` on numpy arrays."""
    at_tau = (ok & (nbr_t == tau_col)).sum(1, dtype=np.float32)
    before = ok & (nbr_t < tau_col)
    prev_t = np.where(before, nbr_t, -np.inf).max(1, initial=-np.inf, keepdims=True)
    at_prev = (before & (nbr_t == prev_t)).sum(1, dtype=np.float32)
    return [np.log1p(at_tau), np.log1p(at_prev)]


def latest_visible_neighbours(
    nbr: np.ndarray, nbr_t: np.ndarray, tau: np.ndarray, depth: int
) -> np.ndarray:
    """``pair_features.latest_visible_neighbours`` on numpy arrays."""
    ok = (nbr != PAD_KEY) & (nbr_t <= tau[:, None])
    from_newest = np.cumsum(ok[:, ::-1], axis=1, dtype=np.int32)[:, ::-1]
    out = np.full((len(nbr), depth), PAD_KEY, dtype=np.int64)
    for k in range(depth):
        hit = ok & (from_newest == k + 1)
        found = hit.any(1)
        out[found, k] = nbr[found, hit[found].argmax(1)]
    return out


def _embedding(module: torch.nn.Module) -> np.ndarray:
    assert isinstance(module, torch.nn.Embedding)
    return _np(module.weight)


class NumpyScorer:
    """The read-out, pair features and head of one loaded ``DygMambaLinkModel``."""

    def __init__(self, model: DygMambaLinkModel) -> None:
        c: ModelConfig = model.config
        self.config = c
        with torch.no_grad():
            self.log_decay = [_np(layer.log_decay_rate()) for layer in model.ssm_layers()]
        if c.use_state:
            linear, norm = model.readout[0], model.readout[1]
            assert isinstance(linear, torch.nn.Linear) and isinstance(norm, torch.nn.LayerNorm)
            self.readout = _Linear.of(linear)
            self.ln_weight, self.ln_bias, self.ln_eps = _np(norm.weight), _np(norm.bias), norm.eps
        self.head = [_Linear.of(m) for m in model.head if isinstance(m, torch.nn.Linear)]
        if c.identity_match_dim:
            self.match_dst, self.match_src = (
                _np(model.match_dst.weight),
                _np(model.match_src.weight),
            )
            self.match_before_dst = [_embedding(t) for t in model.match_before_dst]
            self.match_before_src = [_embedding(t) for t in model.match_before_src]

    # ----- node read-out -----------------------------------------------------------
    def node_readout(self, h: np.ndarray, t_last: np.ndarray, tau: np.ndarray) -> np.ndarray:
        """``DygMambaLinkModel.node_readout``: h (N, n_layers, di, ds) decayed to tau, read out."""
        has = np.isfinite(t_last)
        gap = np.where(has, np.maximum(tau - np.where(has, t_last, tau), 0.0), 0.0)
        g = np.clip(gap / self.config.time_norm.scale, 0.0, MAX_GAP_UNITS).astype(np.float32)
        decayed = np.empty_like(h)
        for i, log_decay in enumerate(self.log_decay):
            factor = np.exp(
                np.maximum(log_decay * g[:, None, None], np.float32(LOG_DECAY_FLOOR))
            ) - np.float32(_FLOOR_FACTOR)
            np.multiply(factor, h[:, i], out=decayed[:, i])
        y = self.readout(decayed.reshape(len(h), -1))
        mean = y.mean(-1, keepdims=True)
        var = ((y - mean) ** 2).mean(-1, keepdims=True)
        return (y - mean) / np.sqrt(var + np.float32(self.ln_eps)) * self.ln_weight + self.ln_bias

    # ----- head ----------------------------------------------------------------------
    def identity_match(self, ids: np.ndarray) -> np.ndarray:
        b, k = self.config.node_hash_buckets, self.config.identity_match_depth

        def match(
            own_table: np.ndarray, own: np.ndarray, before: list[np.ndarray], previous: np.ndarray
        ) -> np.ndarray:
            e_prev = sum(
                table[np.remainder(np.maximum(previous[:, r], 0), b)]
                * (previous[:, r] >= 0)[:, None].astype(np.float32)
                for r, table in enumerate(before)
            )
            return own_table[np.remainder(own, b)] * e_prev

        return np.concatenate(
            [
                match(self.match_dst, ids[:, 1], self.match_before_dst, ids[:, 2 : 2 + k]),
                match(self.match_src, ids[:, 0], self.match_before_src, ids[:, 2 + k : 2 + 2 * k]),
            ],
            axis=-1,
        )

    def head_logit(
        self,
        z_u: np.ndarray | None,
        z_v: np.ndarray | None,
        pair: np.ndarray | None,
        ids: np.ndarray | None,
    ) -> np.ndarray:
        match = None
        if self.config.identity_match_dim:
            assert ids is not None, "this model matches node ids: pass pair_ids"
            match = self.identity_match(ids)
        x = np.concatenate(head_inputs(self.config, z_u, z_v, pair, match), axis=-1)
        for layer in self.head[:-1]:
            x = np.maximum(layer(x), np.float32(0.0))
        return self.head[-1](x)[:, 0]

    def transition_columns(
        self,
        counts: np.ndarray,
        nbr: np.ndarray,
        nbr_t: np.ndarray,
        iu: np.ndarray,
        iv: np.ndarray,
        tau: np.ndarray,
        latest: np.ndarray | None = None,
    ) -> np.ndarray:
        """``pair_features.transition_inputs`` on numpy rows (``latest``: each row's
        latest transition count, for a model that reads it)."""
        c = self.config
        records = DenseTransitions(counts, c.transition_buckets, c.transition_decay, latest)
        return transition_features(
            records.select(iu),
            records.select(iv),
            latest_visible_neighbours(nbr[iu], nbr_t[iu], tau, TRANSITION_DEPTH),
            latest_visible_neighbours(nbr[iv], nbr_t[iv], tau, TRANSITION_DEPTH),
            c.transition_buckets,
            c.transition_decay,
            tau,
            nbr_t[iu, -1],
            nbr_t[iv, -1],
            c.transition_order2,
            c.latest_transition_count,
        )

    # ----- the whole call ------------------------------------------------------------
    def score_nodes(
        self,
        h: np.ndarray,  # (N, n_layers, di, ds) float32, one row per distinct node
        t_last: np.ndarray,  # (N,) float64
        n_events: np.ndarray,  # (N,) int64
        nbr: np.ndarray,  # (N, L) int64 neighbour keys
        nbr_t: np.ndarray,  # (N, L) float64
        keys: np.ndarray,  # (N,) int64 node keys
        iu: np.ndarray,  # (P,) rows of the sources
        iv: np.ndarray,  # (P,) rows of the destinations
        tau: np.ndarray,  # (P,) float64 query times
        records: np.ndarray | None = None,  # (N, RECORD_WIDTH) float64 with role_counts
        transitions: np.ndarray | None = None,  # (N, record width) float32: transition counts
        latest: np.ndarray | None = None,  # (N,) latest transition counts, if read
    ) -> np.ndarray:
        """``streaming.score_nodes`` on numpy arrays: (P,) float32 logits."""
        c = self.config
        pair = ids = None
        if c.use_pair_features:
            pair = pair_features(
                keys[iu],
                keys[iv],
                tau,
                nbr[iu],
                nbr_t[iu],
                nbr[iv],
                nbr_t[iv],
                n_events[iu],
                n_events[iv],
                t_last[iu],
                t_last[iv],
                c.time_norm,
                c.snapshot_pair_features,
            )
            if c.role_counts:
                if records is None:
                    raise ValueError("this model reads role counts: pass their records")
                ends = [role_count_features(records[i], tau, c.role_count_unit) for i in (iu, iv)]
                pair = np.concatenate([pair, *ends], axis=1)
            if c.transition_buckets:
                if transitions is None:
                    raise ValueError("this model reads transition counts: pass them")
                pair = np.concatenate(
                    [pair, self.transition_columns(transitions, nbr, nbr_t, iu, iv, tau, latest)],
                    axis=1,
                )
        if c.identity_match_dim:
            d = c.identity_match_depth
            ids = np.concatenate(
                [
                    keys[iu][:, None],
                    keys[iv][:, None],
                    latest_visible_neighbours(nbr[iu], nbr_t[iu], tau, d),
                    latest_visible_neighbours(nbr[iv], nbr_t[iv], tau, d),
                ],
                axis=1,
            )
        z_u = z_v = None
        if c.use_state:
            if len(tau) and (tau == tau[0]).all():  # one query time: read each node out once
                z = self.node_readout(h, t_last, np.full(len(h), tau[0]))
                z_u, z_v = z[iu], z[iv]
            else:
                z_u = self.node_readout(h[iu], t_last[iu], tau)
                z_v = self.node_readout(h[iv], t_last[iv], tau)
        return self.head_logit(z_u, z_v, pair, ids)
