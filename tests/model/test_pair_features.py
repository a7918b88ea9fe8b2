"""``pair_features`` (vectorised, used by trainer and service) against a plain Python
twin written from its docstring, on random lists with repeats, padding, entries at or
after the query time, and a pair of nodes that list each other. Likewise the last
visible neighbours that the identity match reads."""

from __future__ import annotations

import math
from collections import Counter

import torch

from model.config import TimeNormalisation
from model.node_state import PAD_KEY
from model.pair_features import (
    PAIR_FEATURE_DIM,
    SNAPSHOT_FEATURE_DIM,
    latest_visible_neighbours,
    pair_features,
)

NORM = TimeNormalisation(scale=3.0, log_mean=0.4, log_std=1.7)


def span(x: float) -> float:
    return (math.log1p(max(x, 0.0) / NORM.scale) - NORM.log_mean) / NORM.log_std


def reference(ku, kv, tau, nu, tu, nv, tv, n_u, n_v, last_u, last_v) -> list[float]:
    seen_u = [k for k, t in zip(nu, tu, strict=True) if k != PAD_KEY and t <= tau]
    seen_v = [k for k, t in zip(nv, tv, strict=True) if k != PAD_KEY and t <= tau]
    cu, cv = Counter(seen_u), Counter(seen_v)
    common = sum(min(cu[w], cv[w]) for w in cu)
    uv_times = [t for k, t in zip(nu, tu, strict=True) if k == kv and k != PAD_KEY and t <= tau]
    uv_times += [t for k, t in zip(nv, tv, strict=True) if k == ku and k != PAD_KEY and t <= tau]
    return [
        math.log1p(cu[kv]),
        math.log1p(cv[ku]),
        math.log1p(common),
        span(tau - max(uv_times)) if uv_times else 0.0,
        1.0 if uv_times else 0.0,
        math.log1p(len(seen_u)),
        math.log1p(len(seen_v)),
        math.log1p(n_u),
        math.log1p(n_v),
        span(tau - last_u) if math.isfinite(last_u) else 0.0,
        span(tau - last_v) if math.isfinite(last_v) else 0.0,
    ]


def test_pair_features_match_the_plain_twin():
    gen = torch.Generator().manual_seed(3)
    n, length = 64, 12
    keys = torch.randint(0, 6, (n, 2), generator=gen)  # few distinct keys: many repeats and matches
    nbr = torch.randint(0, 6, (n, 2, length), generator=gen)
    times = torch.rand(n, 2, length, generator=gen, dtype=torch.float64) * 20
    nbr[torch.rand(n, 2, length, generator=gen) < 0.2] = PAD_KEY
    nbr[0, 0] = keys[0, 1]  # u lists v in every slot
    tau = torch.rand(n, generator=gen, dtype=torch.float64) * 25
    n_events = torch.randint(0, 50, (n, 2), generator=gen)
    last = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 20
    last[::5, 0] = float("-inf")  # never seen
    got = pair_features(
        keys[:, 0],
        keys[:, 1],
        tau,
        nbr[:, 0],
        times[:, 0],
        nbr[:, 1],
        times[:, 1],
        n_events[:, 0],
        n_events[:, 1],
        last[:, 0],
        last[:, 1],
        NORM,
    )
    assert got.shape == (n, PAIR_FEATURE_DIM) and got.dtype == torch.float32
    want = torch.tensor(
        [
            reference(
                int(keys[i, 0]),
                int(keys[i, 1]),
                float(tau[i]),
                nbr[i, 0].tolist(),
                times[i, 0].tolist(),
                nbr[i, 1].tolist(),
                times[i, 1].tolist(),
                int(n_events[i, 0]),
                int(n_events[i, 1]),
                float(last[i, 0]),
                float(last[i, 1]),
            )
            for i in range(n)
        ]
    )
    torch.testing.assert_close(got, want.to(torch.float32), rtol=1e-5, atol=1e-5)
    assert (
        (got[:, 2] > 0).any() and (got[:, 4] == 1).any() and (got[:, 4] == 0).any()
    )  # cases exercised


def test_latest_visible_neighbours_match_the_plain_twin():
    gen = torch.Generator().manual_seed(5)
    n, length, depth = 200, 7, 3
    nbr = torch.randint(0, 1000, (n, length), generator=gen)
    times = torch.sort(
        torch.rand(n, length, generator=gen, dtype=torch.float64) * 20, dim=1
    ).values  # oldest first
    nbr[torch.rand(n, length, generator=gen) < 0.3] = PAD_KEY
    tau = torch.rand(n, generator=gen, dtype=torch.float64) * 22
    tau[0] = times[0, 3]  # an entry exactly at tau was applied before the query: visible
    got = latest_visible_neighbours(nbr, times, tau, depth)
    want = []
    for i in range(n):
        seen = [
            k
            for k, t in zip(nbr[i].tolist(), times[i].tolist(), strict=True)
            if k != PAD_KEY and t <= tau[i]
        ]
        newest_first = seen[::-1][:depth]
        want.append(newest_first + [PAD_KEY] * (depth - len(newest_first)))
    assert got.tolist() == want
    assert any(row[0] == PAD_KEY for row in want) and any(
        PAD_KEY not in row for row in want
    )  # both cases exercised
    assert any(row[0] != PAD_KEY and row[-1] == PAD_KEY for row in want)  # fewer visible than depth


def test_snapshot_counts_match_the_plain_twin():
    """The four snapshot columns (``snapshot_pair_features``): per endpoint, visible
    entries at tau and at the latest earlier time, on integer times with many ties."""
    gen = torch.Generator().manual_seed(7)
    n, length = 80, 10
    keys = torch.randint(0, 6, (n, 2), generator=gen)
    nbr = torch.randint(0, 6, (n, 2, length), generator=gen)
    times = torch.randint(0, 5, (n, 2, length), generator=gen).to(torch.float64)
    nbr[torch.rand(n, 2, length, generator=gen) < 0.2] = PAD_KEY
    tau = torch.randint(0, 6, (n,), generator=gen).to(torch.float64)
    zeros, never = torch.zeros(n, dtype=torch.int64), torch.full((n,), float("-inf"))
    sides = [(nbr[:, j], times[:, j]) for j in (0, 1)]
    base = pair_features(
        keys[:, 0], keys[:, 1], tau, *sides[0], *sides[1], zeros, zeros, never, never, NORM
    )
    got = pair_features(
        keys[:, 0], keys[:, 1], tau, *sides[0], *sides[1], zeros, zeros, never, never, NORM, True
    )
    assert got.shape == (n, PAIR_FEATURE_DIM + SNAPSHOT_FEATURE_DIM)
    torch.testing.assert_close(got[:, :PAIR_FEATURE_DIM], base)  # the first 11 unchanged

    def counts(keys_row: list[int], times_row: list[float], t: float) -> list[float]:
        visible = [x for k, x in zip(keys_row, times_row, strict=True) if k != PAD_KEY and x <= t]
        earlier = [x for x in visible if x < t]
        prev = max(earlier) if earlier else None
        return [math.log1p(visible.count(t)), math.log1p(earlier.count(prev) if earlier else 0)]

    want = torch.tensor(
        [
            counts(nbr[i, 0].tolist(), times[i, 0].tolist(), float(tau[i]))
            + counts(nbr[i, 1].tolist(), times[i, 1].tolist(), float(tau[i]))
            for i in range(n)
        ]
    )
    torch.testing.assert_close(got[:, PAIR_FEATURE_DIM:], want.to(torch.float32))
    assert (got[:, PAIR_FEATURE_DIM] > 0).any() and (got[:, PAIR_FEATURE_DIM + 1] > 0).any()
