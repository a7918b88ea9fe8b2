"""Prototype (not the product): soft positives for a banned editor's edits before the ban.

Wikipedia's 217 positives are each a banned editor's last edit; the edits just before
it look alike to the head but are labelled 0. This fits the default node head (k = 0,
5 members, head seeds 0-2) on one link model's replayed inputs with the training
targets raised on the K training edits before each training positive: decay**r for
the r-th one back, within W seconds ("-" for no limit), and the positive weight spread
over the soft targets. Validation and test AUC use the real labels. Results:
docs/RESULTS.md, "Node classification: soft positives before the ban".

    python docs/results/nc_soft_positives.py runs/wiki-link-s0 1:0.5:- 1:1:- 3:0.7:3600
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

from model.node_head import NodeClassifierHead
from training.data import read_edge_stream
from training.metrics import roc_auc
from training.node_classification import NodeTrainConfig, ReplayedInputs, replay_inputs
from training.node_evaluate import head_logits

DATA = "../shared/data/wikipedia"
CFG = NodeTrainConfig(recent_neighbours=0)


def soft_targets(inputs: ReplayedInputs, src: np.ndarray, t: np.ndarray, spec: str) -> np.ndarray:
    """The training targets for ``spec`` = "K:decay:W" ("0:0:-" = the real labels)."""
    k, decay, window = spec.split(":")
    y, train = inputs.y, inputs.masks["train"]
    target = y.astype(np.float32)
    events_of: dict[int, list[int]] = {}
    for i, s in enumerate(src.tolist()):
        events_of.setdefault(s, []).append(i)
    for i in np.flatnonzero((y == 1) & train):
        mine = events_of[int(src[i])]
        at = mine.index(i)
        for r in range(1, int(k) + 1):
            if at - r < 0:
                break
            j = mine[at - r]
            if window != "-" and t[i] - t[j] > float(window):
                break
            if y[j] == 0 and train[j]:
                target[j] = max(target[j], float(decay) ** r)
    return target


def fit(inputs: ReplayedInputs, target: np.ndarray, seed: int) -> tuple[float, float]:
    """``training.node_classification.fit_head`` with soft targets: (val AUC, test AUC)."""
    torch.manual_seed(seed)
    head = NodeClassifierHead(inputs.head_config)
    gen = torch.Generator().manual_seed(seed)
    x, y, masks = inputs.x, inputs.y, inputs.masks
    xt, yt = torch.from_numpy(x[masks["train"]]), torch.from_numpy(target[masks["train"]])
    head.fit_standardisation(xt)
    ratio = (len(yt) - float(yt.sum())) / float(yt.sum())
    opt = torch.optim.Adam(head.parameters(), lr=CFG.lr, weight_decay=CFG.weight_decay)
    best, best_state, since = -1.0, None, 0
    for _ in range(CFG.epochs):
        head.train()
        order = torch.randperm(len(xt), generator=gen)
        for a in range(0, len(order), CFG.batch_size):
            idx = order[a : a + CFG.batch_size]
            z = head.member_logits(xt[idx])
            tt = yt[idx].unsqueeze(-1).expand_as(z)
            loss = F.binary_cross_entropy_with_logits(z, tt, weight=1 + (ratio - 1) * tt)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = roc_auc(y[masks["val"]], head_logits(head, x[masks["val"]]))
        if val > best:
            best, since = val, 0
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
        else:
            since += 1
            if since >= CFG.patience:
                break
    assert best_state is not None
    head.load_state_dict(best_state)
    logits = head_logits(head, x)
    return roc_auc(y[masks["val"]], logits[masks["val"]]), roc_auc(
        y[masks["test"]], logits[masks["test"]]
    )


def main(base: str, specs: list[str]) -> None:
    torch.set_num_threads(1)
    inputs = replay_inputs(DATA, base, CFG)
    stream = read_edge_stream(DATA)
    src = np.unique(stream.src, return_inverse=True)[1]
    for spec in ["0:0:-", *specs]:
        target = soft_targets(inputs, src, stream.t, spec)
        auc = 100 * np.array([fit(inputs, target, seed) for seed in (0, 1, 2)])
        extra = target[inputs.masks["train"]].sum() - inputs.y[inputs.masks["train"]].sum()
        print(
            f"{spec:12s} soft positives {extra:6.1f}  val {auc[:, 0].mean():.2f} ± "
            f"{auc[:, 0].std():.2f}  test {auc[:, 1].mean():.2f} ± {auc[:, 1].std():.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
