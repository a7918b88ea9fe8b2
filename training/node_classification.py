"""The node-classification trainer: a head on a frozen link model's node states.

``dygserve train --task node-classification --data PATH --base LINK_CHECKPOINT --out DIR``

1. One causal replay of the whole stream with the frozen link model
   (``node_replay.collect_source_inputs``) gives each event's source's head input,
   read from the states before the event: exactly what the evaluator and the service
   read. The link model does not move, so this is done once, not per epoch.
2. The head (``model.node_head.NodeClassifierHead``: read-out, activity, recent pace,
   event features where asked; 5 MLPs averaged) learns the ``label`` column (the
   source's state at that interaction, DyGLib/JODIE) on the events of the
   chronological training split (t <= the 70% time quantile), with BCE weighted by
   negatives/positives (Wikipedia: 217 positives in 157,474 events), Adam, and early
   stopping on validation AUC-ROC (the best epoch is kept). Unless ``--recent-neighbours``
   fixes it, a head is fitted with and without the embedding of the node's latest
   neighbour's id (``RECENT_NEIGHBOUR_CHOICES``), and the one that reads it is kept
   only if it is better on validation beyond the noise of the validation split
   (``DEPTH_CHOICE_Z`` standard errors of the paired AUC difference).
3. The output folder is a full checkpoint: the link checkpoint's files, unchanged
   (same model version, so the service's cached states serve both tasks), plus the
   head (``model.node_head_checkpoint``: safetensors + JSON, its own head version),
   and ``node_metrics.json`` (validation/test AUC and AP, the history, the budget).

With ``--fine-tune`` the link model learns too (``training.node_finetune``): the
output then holds its own fine-tuned link model (its own model version) and a head
fitted on that model's frozen states, as above.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from model.checkpoint import (
    CHECKSUMS_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    WEIGHTS_FILE,
    load_checkpoint,
)
from model.node_head import NodeClassifierHead, NodeHeadConfig
from model.node_head_checkpoint import NODE_METRICS_FILE, save_node_head

from .batches import IndexedStream
from .data import chronological_split, read_edge_stream
from .jsonable import jsonable
from .metrics import paired_auc_difference, roc_auc
from .node_evaluate import head_logits, labels_of, split_masks, split_metrics
from .node_finetune import FineTuneConfig, fine_tune_link_model
from .node_replay import collect_source_inputs
from .node_task import asks_node_task as asks_node_task  # re-exported: tests, callers

# The recent-neighbour depths the trainer tries when none is given, smallest first.
RECENT_NEIGHBOUR_CHOICES = (0, 1)
# A deeper head replaces the one kept so far only when its validation AUC is higher by
# at least this many standard errors of the paired difference (DeLong, on the same
# validation events). Wikipedia's validation split holds 17 positives: its depth
# choices were differences of 0.1-0.2 AUC against errors of 1-2 points, and flipped
# between head seeds; MOOC's 510 give errors of 0.4-0.5 (docs/RESULTS.md).
DEPTH_CHOICE_Z = 1.0


class NodeTrainConfig(BaseModel):
    """How the head is trained (saved in ``node_metrics.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(200, ge=1, description="passes over the training events' inputs")
    patience: int = Field(20, ge=1, description="epochs without a better validation AUC")
    batch_size: int = Field(1024, ge=1)
    lr: float = Field(1e-3, gt=0)
    # Dropout and weight decay chosen on Wikipedia's validation AUC (docs/RESULTS.md).
    weight_decay: float = Field(1e-3, ge=0)
    hidden: int = Field(64, ge=1)
    # 5 MLPs averaged: Wikipedia validation AUC 88.28 -> 88.35 and a third of the
    # seed-to-seed spread of test AUC (docs/RESULTS.md); costs 5x a tiny head.
    members: int = Field(5, ge=1, description="MLPs averaged in the head (one init each)")
    dropout: float = Field(0.3, ge=0.0, lt=1.0)
    use_activity: bool = True
    # The mean log-gap of the node's recent events: Wikipedia's banned editors act in
    # bursts (validation and test AUC both up, docs/RESULTS.md).
    recent_pace: bool = True
    event_features: bool = Field(
        False, description="also read the classified event's features (the service then needs them)"
    )
    # None: the trainer fits a head for each of RECENT_NEIGHBOUR_CHOICES and keeps a
    # deeper one only where validation says it is better beyond its noise
    # (DEPTH_CHOICE_Z; MOOC: 1, Wikipedia: 0; docs/RESULTS.md). An int fixes it.
    recent_neighbours: int | None = Field(
        None,
        ge=0,
        le=64,
        description="embed the latest k neighbours' hashed ids (0 = none; None = chosen on validation)",
    )
    imbalance: Literal["balanced", "sqrt", "none"] = Field(
        "balanced",
        description="positive weight in the BCE: negatives/positives, its square root, or 1",
    )
    seed: int = 0
    fine_tune: FineTuneConfig | None = Field(
        None, description="also train the link model (training/node_finetune.py); None = frozen"
    )

    @property
    def recent_neighbour_choices(self) -> tuple[int, ...]:
        if self.recent_neighbours is None:
            return RECENT_NEIGHBOUR_CHOICES
        return (self.recent_neighbours,)


def fit_head(
    head: NodeClassifierHead,
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    val: np.ndarray,
    cfg: NodeTrainConfig,
    log: bool = True,
) -> list[dict[str, float]]:
    """Train ``head`` on the training rows, keep the epoch with the best validation AUC."""
    gen = torch.Generator().manual_seed(cfg.seed)
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(y[train]).to(torch.float32)
    head.fit_standardisation(xt)
    n_pos = float(yt.sum())
    # Imbalance: "balanced" makes the positives weigh as much as all the negatives.
    ratio = (len(yt) - n_pos) / max(n_pos, 1.0)
    pos_weight = torch.tensor(
        {"balanced": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[cfg.imbalance]
    )
    opt = torch.optim.Adam(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    best_auc, best_state, since_best = -math.inf, None, 0
    history: list[dict[str, float]] = []
    for epoch in range(cfg.epochs):
        head.train()
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            # Each member learns on its own (the mean of their losses, not the loss of
            # their mean logit): independent members make a steadier average.
            z = head.member_logits(xt[idx])
            loss = F.binary_cross_entropy_with_logits(
                z, yt[idx].unsqueeze(-1).expand_as(z), pos_weight=pos_weight
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        val_auc = roc_auc(y[val], head_logits(head, x[val]))
        history.append({"epoch": epoch, "loss": total / max(len(xt), 1), "val_auc": val_auc})
        if log and (epoch % 10 == 0 or epoch == cfg.epochs - 1):
            print(f"epoch {epoch:3d} loss {history[-1]['loss']:.4f} val AUC {100 * val_auc:.2f}")
        # A split without both classes has no AUC: then the last epoch is kept.
        score = val_auc if math.isfinite(val_auc) else -math.inf
        if score > best_auc or best_state is None:
            best_auc, since_best = score, 0
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
        else:
            since_best += 1
            if since_best >= cfg.patience:
                break
    assert best_state is not None
    head.load_state_dict(best_state)
    head.eval()
    return history


def copy_link_checkpoint(base: Path, out: Path) -> None:
    """The link model's files, byte for byte: the output serves the same model version
    (nothing to do when the link model was written there, by fine-tuning)."""
    out.mkdir(parents=True, exist_ok=True)
    if base.resolve() == out.resolve():
        return
    for name in (CONFIG_FILE, WEIGHTS_FILE, CHECKSUMS_FILE, METRICS_FILE):
        if (base / name).exists():
            shutil.copyfile(base / name, out / name)


@dataclass
class ReplayedInputs:
    """Everything the head is fitted on: one causal replay's inputs and the labels."""

    base: Path
    link_version: str
    data_path: str
    events: int
    head_config: NodeHeadConfig
    x: np.ndarray  # (E, input_dim) each event's source's input, read before the event
    y: np.ndarray  # (E,) 0/1 labels
    masks: dict[str, np.ndarray]
    replay_seconds: float


def replay_inputs(
    data_path: str | Path,
    base: str | Path,
    cfg: NodeTrainConfig,
    max_events: int | None = None,
    progress: bool = False,
) -> ReplayedInputs:
    base = Path(base)
    ckpt = load_checkpoint(base)
    stream = read_edge_stream(data_path, limit=max_events)
    y = labels_of(stream)
    data = IndexedStream.build(stream)
    if data.feature_dim != ckpt.config.edge_feature_dim:
        raise ValueError(
            f"the data has {data.feature_dim} edge features, the link model expects {ckpt.config.edge_feature_dim}"
        )
    head_config = NodeHeadConfig(
        link_model_version=ckpt.version,
        d_readout=ckpt.config.d_out,
        use_activity=cfg.use_activity,
        use_recent_pace=cfg.recent_pace,
        event_feature_dim=data.feature_dim if cfg.event_features else 0,
        # The deepest choice: a narrower head reads the first columns (``narrowed``).
        recent_neighbours=max(cfg.recent_neighbour_choices),
        hidden=cfg.hidden,
        members=cfg.members,
        dropout=cfg.dropout,
    )
    t0 = time.perf_counter()
    x = collect_source_inputs(ckpt.model, head_config, data, progress=progress)
    return ReplayedInputs(
        base=base,
        link_version=ckpt.version,
        data_path=str(data_path),
        events=len(stream),
        head_config=head_config,
        x=x,
        y=y,
        masks=split_masks(stream, chronological_split(stream)),
        replay_seconds=time.perf_counter() - t0,
    )


def narrowed(inputs: ReplayedInputs, recent_neighbours: int) -> ReplayedInputs:
    """The same inputs for a head that reads only the latest ``recent_neighbours``
    neighbours (their bucket columns come last, newest first)."""
    config = inputs.head_config.model_copy(update={"recent_neighbours": recent_neighbours})
    if config == inputs.head_config:
        return inputs
    return replace(
        inputs, head_config=config, x=np.ascontiguousarray(inputs.x[:, : config.input_dim])
    )


@dataclass
class FittedHead:
    head: NodeClassifierHead
    history: list[dict[str, float]]
    inputs: ReplayedInputs  # narrowed to what the head reads
    # Best validation AUC of each recent-neighbour depth tried (one entry when fixed).
    choice_val_auc: dict[int, float]
    # Each deeper depth tried: its validation AUC gain over the depth kept before it
    # and the gain's standard error (``paired_auc_difference``).
    choice_gain: dict[int, tuple[float, float]]


def beats_beyond_noise(
    y: np.ndarray, kept: np.ndarray, challenger: np.ndarray
) -> tuple[bool, tuple[float, float]]:
    """Whether ``challenger``'s scores beat ``kept``'s in AUC on labels ``y`` by at least
    ``DEPTH_CHOICE_Z`` standard errors of the paired difference; and (gain, error).
    No verdict (a class missing) keeps what is kept."""
    gain, error = paired_auc_difference(y, kept, challenger)
    return bool(gain > DEPTH_CHOICE_Z * error), (gain, error)


def fitted_head(inputs: ReplayedInputs, cfg: NodeTrainConfig, progress: bool = False) -> FittedHead:
    """One head per recent-neighbour depth in ``cfg``'s choices, each with the same seed,
    smallest first; a deeper head replaces the one kept so far only when its validation
    AUC is higher by ``DEPTH_CHOICE_Z`` standard errors of the paired difference.

    The head's shape (width, members, dropout) is ``cfg``'s, whatever the replay was made
    with: the inputs do not depend on it, so one replay serves heads of any shape. The
    inputs' columns do, so a ``cfg`` that asks for other columns is refused."""
    made = inputs.head_config
    if (cfg.use_activity, cfg.recent_pace) != (made.use_activity, made.use_recent_pace) or max(
        cfg.recent_neighbour_choices
    ) > made.recent_neighbours:
        raise ValueError("these inputs were replayed for other head inputs: replay them again")
    shape = {"hidden": cfg.hidden, "members": cfg.members, "dropout": cfg.dropout}
    inputs = replace(inputs, head_config=made.model_copy(update=shape))
    val = inputs.masks["val"]
    best: FittedHead | None = None
    best_logits = np.zeros(0)
    scores: dict[int, float] = {}
    gains: dict[int, tuple[float, float]] = {}
    for k in sorted(cfg.recent_neighbour_choices):
        torch.manual_seed(cfg.seed)
        candidate = narrowed(inputs, k)
        head = NodeClassifierHead(candidate.head_config)
        history = fit_head(
            head,
            candidate.x,
            candidate.y,
            candidate.masks["train"],
            val,
            cfg,
            progress,
        )
        finite = [h["val_auc"] for h in history if math.isfinite(h["val_auc"])]
        scores[k] = max(finite, default=-math.inf)
        logits = head_logits(head, candidate.x[val])
        if best is not None:
            better, gains[k] = beats_beyond_noise(candidate.y[val], best_logits, logits)
            if not better:
                continue
        best, best_logits = FittedHead(head, history, candidate, scores, gains), logits
    assert best is not None
    return best


def fit_and_save(
    inputs: ReplayedInputs, out: str | Path, cfg: NodeTrainConfig, progress: bool = False
) -> dict[str, Any]:
    """Fit one head (seed ``cfg.seed``) on replayed inputs; write the checkpoint to ``out``."""
    out = Path(out)
    t1 = time.perf_counter()
    fitted = fitted_head(inputs, cfg, progress)
    fit_s = time.perf_counter() - t1
    head, history, inputs = fitted.head, fitted.history, fitted.inputs
    metrics: dict[str, Any] = split_metrics(inputs.y, head_logits(head, inputs.x), inputs.masks)
    copy_link_checkpoint(inputs.base, out)
    version = save_node_head(out, head)
    finite = [h["val_auc"] if math.isfinite(h["val_auc"]) else -math.inf for h in history]
    metrics.update(
        task="node-classification",
        model_version=inputs.link_version,
        head_version=version,
        base=str(inputs.base.resolve()),
        data=inputs.data_path,
        events=inputs.events,
        train_config=cfg.model_dump(),
        recent_neighbours=inputs.head_config.recent_neighbours,
        recent_neighbours_val_auc={str(k): v for k, v in fitted.choice_val_auc.items()},
        recent_neighbours_val_gain={
            str(k): {"gain": g, "std_error": e} for k, (g, e) in fitted.choice_gain.items()
        },
        history=history,
        # The kept epoch: the best validation AUC (the last one when there is none).
        best_epoch=int(np.argmax(finite)) if max(finite) > -math.inf else len(history) - 1,
        replay_seconds=inputs.replay_seconds,
        fit_seconds=fit_s,
    )
    (out / NODE_METRICS_FILE).write_text(
        json.dumps(jsonable(metrics), indent=2, sort_keys=True) + "\n"
    )
    return metrics


def train_node_classifier(
    data_path: str | Path,
    base: str | Path,
    out: str | Path,
    cfg: NodeTrainConfig,
    max_events: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """One replay, one head: the ``dygserve train --task node-classification`` command."""
    if Path(out).resolve() == Path(base).resolve():
        raise ValueError("the output folder must not be the base checkpoint")
    inputs = replay_inputs(data_path, base, cfg, max_events, progress)
    if cfg.fine_tune is None:
        return fit_and_save(inputs, out, cfg, progress)
    # Fine-tuning: a head on the frozen base first, then both together, then the
    # output's own head on the fine-tuned model's frozen states (node_finetune).
    start = fitted_head(inputs, cfg, progress)
    start_head = start.head
    # The frozen head's figures, for comparison (fine-tuning then trains this head on).
    frozen = split_metrics(
        start.inputs.y, head_logits(start_head, start.inputs.x), start.inputs.masks
    )
    tuned = fine_tune_link_model(
        base, data_path, out, start_head, cfg.fine_tune, cfg.seed, max_events, progress
    )
    metrics = fit_and_save(
        replay_inputs(data_path, out, cfg, max_events, progress), out, cfg, progress
    )
    metrics["fine_tune"] = tuned
    metrics["base_model_version"] = inputs.link_version
    metrics["base_frozen"] = frozen
    (Path(out) / NODE_METRICS_FILE).write_text(
        json.dumps(jsonable(metrics), indent=2, sort_keys=True) + "\n"
    )
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="dygserve train --task node-classification",
        description=(__doc__ or "").split("\n\n")[0],
    )
    ap.add_argument("--task", choices=("node-classification",), default="node-classification")
    ap.add_argument("--data", required=True, help="dataset folder or edges.csv.gz with labels")
    ap.add_argument("--base", required=True, help="the link checkpoint whose states it reads")
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument("--max-events", type=int, default=None, help="only the first N events")
    ap.add_argument("--epochs", type=int, default=NodeTrainConfig().epochs)
    ap.add_argument("--patience", type=int, default=NodeTrainConfig().patience)
    ap.add_argument("--lr", type=float, default=NodeTrainConfig().lr)
    ap.add_argument("--hidden", type=int, default=NodeTrainConfig().hidden)
    ap.add_argument("--members", type=int, default=NodeTrainConfig().members)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--event-features",
        action="store_true",
        help="also read the classified event's features (classify requests must then carry them)",
    )
    ap.add_argument(
        "--no-recent-pace",
        action="store_true",
        help="leave out the recent pace input (the mean log-gap of the node's recent events)",
    )
    ap.add_argument(
        "--recent-neighbours",
        type=int,
        default=NodeTrainConfig().recent_neighbours,
        metavar="K",
        help="embed the node's latest K neighbours' hashed ids (0 = none; default: "
        f"the smallest of {RECENT_NEIGHBOUR_CHOICES} that no deeper one beats on validation "
        f"AUC by {DEPTH_CHOICE_Z:g} standard error(s))",
    )
    ap.add_argument(
        "--fine-tune",
        action="store_true",
        help="also train the link model (link loss kept, smaller learning rate): the output"
        " holds its own link model, with its own version, for both tasks",
    )
    ap.add_argument(
        "--fine-tune-epochs", type=int, default=FineTuneConfig().epochs, help="joint passes"
    )
    ap.add_argument("--encoder-lr", type=float, default=FineTuneConfig().encoder_lr)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    base, out = Path(args.base).resolve(), Path(args.out).resolve()
    if out == base:
        ap.error("--out must be a new folder, not the base checkpoint")
    torch.set_num_threads(args.threads)
    cfg = NodeTrainConfig(
        epochs=args.epochs,
        patience=args.patience,
        lr=args.lr,
        hidden=args.hidden,
        members=args.members,
        seed=args.seed,
        event_features=args.event_features,
        recent_pace=not args.no_recent_pace,
        recent_neighbours=args.recent_neighbours,
        fine_tune=FineTuneConfig(epochs=args.fine_tune_epochs, encoder_lr=args.encoder_lr)
        if args.fine_tune
        else None,
    )
    metrics = train_node_classifier(
        args.data, args.base, args.out, cfg, args.max_events, not args.no_progress
    )
    for name in ("val", "test"):
        m = metrics[name]
        print(f"{name:5s} AUC {100 * m['auc']:.2f}  AP {100 * m['ap']:.2f}")
    if "fine_tune" in metrics:
        ft = metrics["fine_tune"]
        print(
            f"fine-tuned {ft['fine_tuned_from']} -> {ft['model_version']}: link val AP"
            f" {100 * ft['link_val_ap_before']:.2f} -> {100 * ft['link_val_ap_after']:.2f}"
        )
    print(f"model version {metrics['model_version']}, head {metrics['head_version']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
