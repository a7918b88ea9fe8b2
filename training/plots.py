"""PNG plots of an evaluation: training curves and positive vs negative score histograms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_training_curves(history: list[dict[str, Any]], path: str | Path) -> None:
    epochs = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(epochs, [h["train_loss"] for h in history], marker="o")
    axes[0].set_title("training loss (BCE)")
    axes[1].plot(epochs, [h.get("train_ap") for h in history], marker="o", label="train (in-epoch)")
    axes[1].plot(
        epochs, [h.get("val_ap") for h in history], marker="o", label="validation (streaming)"
    )
    axes[1].set_title("AP")
    axes[1].legend()
    axes[2].bar(epochs, [h.get("epoch_time_s", 0) for h in history], label="train")
    axes[2].bar(
        epochs,
        [h.get("eval_time_s", 0) for h in history],
        bottom=[h.get("epoch_time_s", 0) for h in history],
        label="validation replay",
    )
    axes[2].set_title("seconds per epoch")
    axes[2].legend()
    for ax in axes:
        ax.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_score_histograms(queries: Any, path: str | Path) -> None:
    """One panel per (split, negative kind): logits of positives vs those negatives."""
    kinds = [k for k in ("random", "historical", "inductive", "mrr") if (queries.kind == k).any()]
    splits = sorted(set(queries.split.tolist()))
    if not kinds or not splits:
        return
    fig, axes = plt.subplots(
        len(splits), len(kinds), figsize=(4 * len(kinds), 3.2 * len(splits)), squeeze=False
    )
    for i, s in enumerate(splits):
        pos = queries.logit[(queries.split == s) & (queries.kind == "pos")]
        for j, k in enumerate(kinds):
            neg = queries.logit[
                (queries.split == s) & (queries.kind == k) & (queries.setting != "inductive")
            ]
            ax = axes[i][j]
            lo = float(np.nanmin(np.r_[pos, neg])) if len(pos) + len(neg) else -1.0
            hi = float(np.nanmax(np.r_[pos, neg])) if len(pos) + len(neg) else 1.0
            bins = np.linspace(lo, hi if hi > lo else lo + 1, 60)
            ax.hist(pos, bins=bins, alpha=0.6, density=True, label="positive")
            ax.hist(neg, bins=bins, alpha=0.6, density=True, label=f"negative ({k})")
            ax.set_title(f"{s}: positives vs {k}")
            ax.set_xlabel("logit")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
