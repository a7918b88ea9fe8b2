"""Fine-tuning the link model for node classification (``--fine-tune``).

By default the node head reads a frozen link model's states. With ``--fine-tune`` the
encoder learns too, in three stages:

1. a head is fitted on the base model's frozen states (``node_classification``), so
   the joint stage starts from a head that already points the right way (a random
   head would first push noise into the encoder);
2. the link model and that head train together for ``epochs`` passes over the
   training split, with the link trainer's own batches (``train.EpochRunner``: the
   same windowed re-scans and negatives), on the link loss plus ``node_loss_weight``
   times the head's class-weighted BCE on each batch's sources. The link loss is kept
   so that link quality holds; the encoder gets a smaller learning rate than the head.
   The head's input is built by ``model.node_head.inputs_around_readout`` from the
   re-scan's read-out (with gradients), the one definition the evaluator and the
   service use too;
3. the fine-tuned link model is saved as the output's own link checkpoint (its own
   model version: the states it needs are not the base's), and a fresh head is fitted
   on its frozen states exactly as without fine-tuning (early stopping on validation
   AUC), so evaluator, service and trainer read the same inputs.

The output folder is then one checkpoint for both tasks, served by ``serve``/``reload``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from model.checkpoint import load_checkpoint, save_checkpoint
from model.node_head import NodeClassifierHead, inputs_around_readout

from .batches import IndexedStream, NodeEventIndex
from .data import chronological_split, read_edge_stream
from .evaluate import validation_ap
from .jsonable import jsonable
from .node_evaluate import labels_of
from .train import EpochRunner


class FineTuneConfig(BaseModel):
    """How the link model is fine-tuned through the head (saved in node_metrics.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(1, ge=1, description="joint passes over the training split")
    encoder_lr: float = Field(1e-4, gt=0, description="the link model's (10x below its training)")
    head_lr: float = Field(1e-3, gt=0)
    node_loss_weight: float = Field(1.0, ge=0, description="node BCE next to the link BCE")
    batch_size: int = Field(200, ge=1, description="the link trainer's default")
    window: int = Field(16, ge=1, description="the link trainer's gradient window")
    grad_clip: float = Field(1.0, gt=0)


def fine_tune_link_model(
    base: str | Path,
    data_path: str | Path,
    out: str | Path,
    head: NodeClassifierHead,
    cfg: FineTuneConfig,
    seed: int = 0,
    max_events: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train the base link model (and ``head``, already fitted on its frozen states)
    jointly; save the link model to ``out``; return what happened (for node_metrics)."""
    ckpt = load_checkpoint(base)
    model = ckpt.model
    stream = read_edge_stream(data_path, limit=max_events)
    y = torch.from_numpy(labels_of(stream)).to(torch.float32)
    data = IndexedStream.build(stream)
    split = chronological_split(stream)
    train_events = np.flatnonzero(split.train)
    index = NodeEventIndex.build(data, train_events)
    metrics = ckpt.metrics or {}
    visibility = str(metrics.get("visibility", "exact"))
    historical = float(metrics.get("historical_negatives") or 0.0)
    historical_extra = bool(metrics.get("historical_negatives_extra", False))
    n_pos = float(y[train_events].sum())
    pos_weight = torch.tensor((len(train_events) - n_pos) / max(n_pos, 1.0))
    opt = torch.optim.Adam(
        [
            {"params": model.parameters(), "lr": cfg.encoder_lr},
            {"params": head.parameters(), "lr": cfg.head_lr},
        ]
    )
    norm = model.config.time_norm
    length = model.config.neighbour_list_len
    feats = torch.from_numpy(data.features)
    t0 = time.perf_counter()
    link_val_before = validation_ap(model.eval(), data, split, visibility)["ap"]
    history: list[dict[str, float]] = []
    for epoch in range(cfg.epochs):
        model.train()
        head.train()
        rng = np.random.default_rng([seed, 1000 + epoch])
        runner = EpochRunner(
            model, data, train_events, index, cfg.window, visibility, historical, historical_extra
        )
        link_losses, node_losses = [], []
        starts = range(0, len(train_events), cfg.batch_size)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(starts, desc=f"fine-tune {epoch}", unit="batch", mininterval=2.0)
        for b0 in starts:
            b1 = min(b0 + cfg.batch_size, len(train_events))
            link_loss, _, _ = runner.batch_loss(b0, b1, rng)
            ev, readout, seen = runner.last_sources
            assert readout is not None  # a node head needs use_state (checked on load)
            src = data.src[ev]
            x = inputs_around_readout(
                head.config,
                norm,
                readout,
                torch.from_numpy(index.last_time(src, seen)),
                torch.from_numpy(seen),
                torch.from_numpy(data.t[ev]),
                feats[ev] if head.config.event_feature_dim else None,
                index.neighbour_lists(src, seen, length),
            )
            z = head.member_logits(x)
            node_loss = F.binary_cross_entropy_with_logits(
                z, y[ev].unsqueeze(-1).expand_as(z), pos_weight=pos_weight
            )
            loss = link_loss + cfg.node_loss_weight * node_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*model.parameters(), *head.parameters()], cfg.grad_clip)
            opt.step()
            link_losses.append(float(link_loss.detach()))
            node_losses.append(float(node_loss.detach()))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        history.append(
            {
                "epoch": epoch,
                "link_loss": float(np.mean(link_losses)),
                "node_loss": float(np.mean(node_losses)),
            }
        )
    model.eval()
    link_val_after = validation_ap(model, data, split, visibility)["ap"]
    doc = {
        # The base's training record stays (its history, budget); its figures do not.
        **{k: v for k, v in metrics.items() if k not in ("val", "test")},
        "fine_tuned_for": "node-classification",
        "fine_tuned_from": ckpt.version,
        "fine_tune": cfg.model_dump(),
        "fine_tune_history": history,
        "val": {"ap": link_val_after, "negatives": "random", "setting": "transductive"},
        "val_ap_before_fine_tune": link_val_before,
        "test": None,
    }
    version = save_checkpoint(out, model, jsonable(doc))
    return {
        "fine_tuned_from": ckpt.version,
        "model_version": version,
        "config": cfg.model_dump(),
        "history": history,
        "link_val_ap_before": link_val_before,
        "link_val_ap_after": link_val_after,
        "seconds": time.perf_counter() - t0,
        "finite": all(math.isfinite(h["node_loss"]) for h in history),
    }
