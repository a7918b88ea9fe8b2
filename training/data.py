"""Edge-stream datasets in the ``../shared/data`` format and DyGLib's chronological split.

A file is a (gzip) CSV with a header: ``src,dst,ts`` then optional columns. ``label``
is a node-state label, never an edge feature; every other extra column is an edge
feature (``f0..f3`` for MOOC, ``rating`` for bitcoin-otc, ``day`` for malawi).
Node ids are kept as canonical strings (the wire format); times as float64.
"""

from __future__ import annotations

import csv
import gzip
import io
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NON_FEATURE_COLUMNS = ("src", "dst", "ts", "label")


@dataclass
class EdgeStream:
    src: np.ndarray  # (E,) object array of str ids
    dst: np.ndarray  # (E,) object array of str ids
    t: np.ndarray  # (E,) float64, non-decreasing
    features: np.ndarray  # (E, F) float32
    labels: np.ndarray | None  # (E,) int8 or None
    feature_names: tuple[str, ...]
    name: str = ""

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def slice(self, index: np.ndarray | slice) -> EdgeStream:
        return EdgeStream(
            self.src[index],
            self.dst[index],
            self.t[index],
            self.features[index],
            None if self.labels is None else self.labels[index],
            self.feature_names,
            self.name,
        )

    @property
    def nodes(self) -> np.ndarray:
        return np.unique(np.concatenate([self.src, self.dst]))


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_edge_stream(
    path: str | Path, limit: int | None = None, with_features: bool = True
) -> EdgeStream:
    """Read a dataset file; ``limit`` keeps only the first rows (for tests and demos)."""
    path = Path(path)
    if path.is_dir():
        path = path / "edges.csv.gz"
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader)]
        if header[:3] != ["src", "dst", "ts"]:
            raise ValueError(f"{path}: expected columns src,dst,ts first, got {header[:3]}")
        feat_cols = (
            [i for i, h in enumerate(header) if h not in NON_FEATURE_COLUMNS]
            if with_features
            else []
        )
        label_col = header.index("label") if "label" in header else None
        rows = []
        for i, row in enumerate(reader):
            if limit is not None and i >= limit:
                break
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    table = np.array(rows, dtype=object)
    t = table[:, 2].astype(np.float64)
    if not np.all(np.isfinite(t)):
        raise ValueError(f"{path}: non-finite timestamps")
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        table, t = table[order], t[order]
    features = (
        table[:, feat_cols].astype(np.float64).astype(np.float32)
        if feat_cols
        else np.zeros((len(rows), 0), dtype=np.float32)
    )
    labels = (
        table[:, label_col].astype(np.float64).astype(np.int8) if label_col is not None else None
    )
    return EdgeStream(
        src=np.array([str(s).strip() for s in table[:, 0]], dtype=object),
        dst=np.array([str(s).strip() for s in table[:, 1]], dtype=object),
        t=t,
        features=features,
        labels=labels,
        feature_names=tuple(header[i] for i in feat_cols),
        name=path.parent.name,
    )


@dataclass
class ChronologicalSplit:
    """Index masks over the stream, as DyGLib's ``get_link_prediction_data``."""

    val_time: float
    test_time: float
    train: np.ndarray  # bool: t <= val_time and no new (held-out) node
    val: np.ndarray  # bool: val_time < t <= test_time
    test: np.ndarray  # bool: t > test_time
    new_nodes: frozenset[str]  # nodes held out of training (inductive setting)
    train_nodes: frozenset[str]

    def inductive(self, stream: EdgeStream, mask: np.ndarray) -> np.ndarray:
        """Events of ``mask`` with at least one endpoint never seen in training."""
        seen = self.train_nodes
        unseen = np.array(
            [
                (s not in seen) or (d not in seen)
                for s, d in zip(stream.src, stream.dst, strict=True)
            ]
        )
        return mask & unseen


def chronological_split(
    stream: EdgeStream,
    val_ratio: float = 0.15,
    test_ratio: float = 0.15,
    new_node_fraction: float = 0.1,
    seed: int = 2020,
) -> ChronologicalSplit:
    val_time, test_time = np.quantile(stream.t, [1.0 - val_ratio - test_ratio, 1.0 - test_ratio])
    after_val = stream.t > val_time
    later_nodes = sorted(set(stream.src[after_val]) | set(stream.dst[after_val]))
    rng = random.Random(seed)
    n_new = int(new_node_fraction * len(stream.nodes))
    new_nodes = frozenset(rng.sample(later_nodes, min(n_new, len(later_nodes))))
    touches_new = np.array(
        [(s in new_nodes) or (d in new_nodes) for s, d in zip(stream.src, stream.dst, strict=True)]
    )
    train = (stream.t <= val_time) & ~touches_new
    train_nodes = frozenset(stream.src[train]) | frozenset(stream.dst[train])
    return ChronologicalSplit(
        val_time=float(val_time),
        test_time=float(test_time),
        train=train,
        val=(stream.t > val_time) & (stream.t <= test_time),
        test=stream.t > test_time,
        new_nodes=new_nodes,
        train_nodes=train_nodes,
    )
