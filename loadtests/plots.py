"""PNG plots of a load run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_latency_histogram(
    latencies_s: Mapping[str, Sequence[float]], path: str | Path, title: str = "Request latency"
) -> Path:
    """One histogram per route (log-spaced bins in ms), with p50/p95/p99 marked."""
    path = Path(path)
    routes = [r for r, v in latencies_s.items() if len(v)]
    fig, axes = plt.subplots(
        max(1, len(routes)), 1, figsize=(8, 2.6 * max(1, len(routes))), squeeze=False
    )
    if not routes:
        axes[0, 0].text(0.5, 0.5, "no answered requests", ha="center", va="center")
        axes[0, 0].set_axis_off()
    for ax, route in zip(axes[:, 0], routes, strict=False):
        ms = np.asarray(latencies_s[route], dtype=np.float64) * 1e3
        lo, hi = max(float(ms.min()), 1e-3), max(float(ms.max()), 1e-3)
        bins = np.geomspace(lo, hi * 1.0001, 50) if hi > lo * 1.01 else 20
        ax.hist(ms, bins=bins, color="#4477aa", alpha=0.85)
        if hi > lo * 1.01:
            ax.set_xscale("log")
        for q, style in ((50, "-"), (95, "--"), (99, ":")):
            v = float(np.percentile(ms, q))
            ax.axvline(v, color="#cc3311", linestyle=style, linewidth=1, label=f"p{q} {v:.2f} ms")
        ax.set_title(f"{route} (n={ms.size})", fontsize=9)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("requests")
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput(
    timeline: Mapping[str, Sequence[float]], path: str | Path, title: str = "Throughput"
) -> Path:
    """Events/s and score pairs/s (top), score requests/s and errors/s (bottom), per second
    bucket (a partial last bucket is divided by its own width)."""
    path = Path(path)
    t = np.asarray(timeline.get("t", []), dtype=np.float64)
    width = np.asarray(timeline.get("width", np.ones_like(t)), dtype=np.float64)
    mid = t + width / 2

    def rate(key: str) -> np.ndarray:
        return np.asarray(timeline[key], dtype=np.float64) / width

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for key, color, style, lw in (
        ("events", "#4477aa", "-", 2.5),
        ("accepted", "#228833", "--", 1.2),
        ("pairs", "#ee6677", "-", 1.2),
    ):
        if key in timeline:
            ax1.plot(
                mid,
                rate(key),
                label=f"{key}/s",
                color=color,
                linestyle=style,
                linewidth=lw,
                marker=".",
            )
    ax1.set_ylabel("items / s")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    for key, color in (("score_requests", "#aa3377"), ("errors", "#cc3311")):
        if key in timeline:
            ax2.plot(mid, rate(key), label=f"{key}/s", color=color, linewidth=1.2, marker=".")
    ax2.set_xlabel("time since start (s)")
    ax2.set_ylabel("requests / s")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_memory(
    samples: Sequence[Mapping[str, float | None]], path: str | Path, title: str = "Memory"
) -> Path:
    """Service RSS (top) and Redis used_memory (bottom), in MiB, over time. ``samples`` are
    soak samples with keys ``t``, ``service_rss_bytes`` and ``redis_used_memory_bytes``
    (either may be None). Separate axes, so that growth of the smaller one stays visible."""
    path = Path(path)
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    t = np.array([s["t"] for s in samples], dtype=np.float64)
    for ax, key, label, color in (
        (axes[0], "service_rss_bytes", "service RSS (process and children)", "#4477aa"),
        (axes[1], "redis_used_memory_bytes", "Redis used_memory", "#ee6677"),
    ):
        vals = [s.get(key) for s in samples]
        if any(v is not None for v in vals):
            y = np.array([np.nan if v is None else float(v) / 2**20 for v in vals])
            ax.plot(t, y, marker=".", label=label, color=color, linewidth=1.2)
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(
                0.5, 0.5, f"no {label} samples", ha="center", va="center", transform=ax.transAxes
            )
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
    axes[1].set_xlabel("time since start (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
