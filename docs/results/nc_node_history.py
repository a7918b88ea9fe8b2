"""Prototype (not the product): would a Wikipedia node head gain from more of the
editor's own history than its state, event count, last gap and recent pace give?

Banned editors are often new accounts that edit in bursts over many pages. Each input
below is computed causally from the source's earlier events (strictly before the
classified one, as the replay reads the state), appended to the default head's inputs
(k = 0, 5 members) and fitted with head seeds 0-2 on one link model's replay; validation
and test AUC against the same head without them:

* ``account_age``: log1p of the hours since the source's first event (0 for a new one).
* ``burst``: log1p of the source's events in the last hour and in the last day.
* ``spread``: the share of distinct pages among the source's last 32 events.

    python docs/results/nc_node_history.py runs/nc/wikipedia-link account_age burst spread all
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import replace

import numpy as np
import torch

from model.node_head import NodeClassifierHead
from training.data import read_edge_stream
from training.metrics import roc_auc
from training.node_classification import NodeTrainConfig, ReplayedInputs, fit_head, replay_inputs
from training.node_evaluate import head_logits

DATA = "../shared/data/wikipedia"
CFG = NodeTrainConfig(recent_neighbours=0)
SEEDS = (0, 1, 2)


def history_features(src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
    first: dict[int, float] = {}
    recent: dict[int, deque[float]] = {}
    pages: dict[int, deque[int]] = {}
    n = len(src)
    age, hour, day, spread = (np.zeros(n, np.float32) for _ in range(4))
    for i in range(n):
        u, ti = int(src[i]), float(t[i])
        if u in first:
            age[i] = np.log1p((ti - first[u]) / 3600.0)
            times = recent[u]
            while times and ti - times[0] > 86400.0:
                times.popleft()
            day[i] = np.log1p(len(times))
            hour[i] = np.log1p(sum(1 for x in times if ti - x <= 3600.0))
            spread[i] = len(set(pages[u])) / len(pages[u])
        else:
            first[u], recent[u], pages[u] = ti, deque(), deque(maxlen=32)
        recent[u].append(ti)
        pages[u].append(int(dst[i]))
    return {
        "account_age": age[:, None],
        "burst": np.stack([hour, day], axis=1),
        "spread": spread[:, None],
    }


def fit(inputs: ReplayedInputs, extra: np.ndarray | None, seed: int) -> tuple[float, float]:
    x = inputs.x if extra is None else np.concatenate([inputs.x, extra], axis=1)
    width = 0 if extra is None else extra.shape[1]
    # The extra columns ride where event features would: after the recent pace.
    config = inputs.head_config.model_copy(update={"event_feature_dim": width})
    torch.manual_seed(seed)
    head = NodeClassifierHead(config)
    cfg = CFG.model_copy(update={"seed": seed})
    fit_head(head, x, inputs.y, inputs.masks["train"], inputs.masks["val"], cfg, False)
    logits = head_logits(head, x)
    return tuple(  # type: ignore[return-value]
        float(roc_auc(inputs.y[inputs.masks[s]], logits[inputs.masks[s]])) for s in ("val", "test")
    )


def compare(inputs: ReplayedInputs, feats: dict[str, np.ndarray], names: list[str]) -> None:
    """The default head with each named input appended (and with none), head seeds
    ``SEEDS``: validation and test AUC, printed."""
    for name in ["none", *names]:
        extra = None if name == "none" else feats[name]
        runs = [fit(inputs, extra, seed) for seed in SEEDS]
        val, test = (np.array(r) * 100 for r in zip(*runs, strict=True))
        print(
            f"{name}: val {val.mean():.2f} ± {val.std():.2f}, test {test.mean():.2f} ± "
            f"{test.std():.2f} (per head {', '.join(f'{x:.2f}' for x in test)})",
            flush=True,
        )


def main(base: str, names: list[str]) -> None:
    inputs = replay_inputs(DATA, base, CFG)
    inputs = replace(inputs, x=inputs.x[:, : inputs.head_config.input_dim])
    s = read_edge_stream(DATA + "/edges.csv.gz")
    feats = history_features(s.src, s.dst, s.t)
    feats["all"] = np.concatenate(list(feats.values()), axis=1)
    compare(inputs, feats, names)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
