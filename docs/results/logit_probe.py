"""What the probes that stack a feature on a trained model's logit share.

``replayed_queries`` scores the evaluator's own queries with a checkpoint's streaming
replay (its trained visibility); ``StackedProbe`` fits a logistic regression on [the
logit, extra columns] on the validation queries with random negatives and reports
global test AP with random and historical negatives, as ``pair_count_probe.py`` and
``three_hop_probe.py`` print them. Imported by its neighbours in docs/results.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from model.checkpoint import load_checkpoint
from training.batches import IndexedStream
from training.data import ChronologicalSplit
from training.evaluate import load_data, trained_visibility
from training.metrics import average_precision
from training.replay import Queries, build_queries, replay

TEST_NEGATIVES = ("random", "historical")


def checkpoint_parser(doc: str) -> argparse.ArgumentParser:
    """A probe's command line: a checkpoint, its stream, and the probe's own options."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="dataset folder or edges.csv.gz")
    return ap


def replayed_queries(
    checkpoint: str | Path,
    data_path: str | Path,
    splits: Sequence[str] = ("val", "test"),
    strategies: Sequence[str] = TEST_NEGATIVES,
) -> tuple[IndexedStream, ChronologicalSplit, Queries]:
    """The transductive queries of ``splits`` with ``strategies``' negatives, each
    with the checkpoint's logit (``Queries.logit``), scored one thread."""
    torch.set_num_threads(1)
    ckpt = load_checkpoint(checkpoint)
    data, split = load_data(data_path)
    q = build_queries(data, split, splits, ("transductive",), strategies, 0)
    replay(ckpt.model, data, q, trained_visibility(ckpt.metrics))
    return data, split, q


class StackedProbe:
    """Fitted on validation queries with random negatives; scored on the test ones."""

    def __init__(self, q: Queries) -> None:
        self.q = q
        self.y = (q.kind == "pos").astype(int)
        self.val = self._rows("val", "random")
        self.tests = {kind: self._rows("test", kind) for kind in TEST_NEGATIVES}

    def _rows(self, split_name: str, negatives: str) -> np.ndarray:
        q = self.q
        return ((q.kind == "pos") | (q.kind == negatives)) & (q.split == split_name)

    def aps(self, score: np.ndarray) -> str:
        """Global test AP of ``score``, random / historical negatives."""
        return " / ".join(
            f"{100 * average_precision(self.y[rows], score[rows]):.2f}"
            for rows in self.tests.values()
        )

    def stacked(self, extra: np.ndarray) -> str:
        """``aps`` of a logistic regression on [the logit, ``extra`` (Q, K)]."""
        x = np.c_[self.q.logit[:, None], extra]
        scale = StandardScaler().fit(x[self.val])
        fit = LogisticRegression(max_iter=2000).fit(scale.transform(x[self.val]), self.y[self.val])
        return self.aps(fit.decision_function(scale.transform(x)))
