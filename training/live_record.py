"""Score a live-evaluation record offline: ``dygserve evaluate --live-record FILE``.

The service's live evaluation (``service/live_eval.py``) can append every sample it
scores to a file (``DYGSERVE_LIVE_EVAL_RECORD``): the ingested event and the K
negatives it drew, with the logits it gave them. This scores the very same pairs with
the offline replay (score, then update, exact visibility; ``training.replay``) over the
stream the service ingested, and computes the same AP: positives against negatives
weighing 1/K each, so the two can be compared number for number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model.link_model import DygMambaLinkModel

from .batches import IndexedStream
from .metrics import average_precision
from .replay import Queries, replay


@dataclass
class LiveRecord:
    samples: list[dict[str, Any]]

    @classmethod
    def read(cls, path: str | Path) -> LiveRecord:
        return cls([json.loads(line) for line in Path(path).read_text().splitlines() if line])


def record_queries(data: IndexedStream, record: LiveRecord) -> tuple[Queries, np.ndarray]:
    """The record's pairs as queries (each sample's positive, then its negatives), and
    the logits the service gave them, in the same order. A query belongs to the first
    event of the stream at its time, so the replay scores it before that time's events."""
    index = {n: i for i, n in enumerate(data.node_ids)}
    src, dst, t, served = [], [], [], []
    for s in record.samples:
        for d, logit in [(s["dst"], s["logit"])] + [(n["dst"], n["logit"]) for n in s["negatives"]]:
            src.append(index[s["src"]])
            dst.append(index[d])
            t.append(float(s["t"]))
            served.append(float(logit))
    times = np.asarray(t, dtype=np.float64)
    event = np.searchsorted(data.t, times, side="left")
    if len(event) and (
        (event >= len(data.t)).any() or (data.t[np.minimum(event, len(data.t) - 1)] != times).any()
    ):
        raise ValueError("the record has samples at times with no event in the data")
    n = len(t)
    queries = Queries(
        src=np.asarray(src, dtype=np.int64),
        dst=np.asarray(dst, dtype=np.int64),
        t=times,
        event=event.astype(np.int64),
        kind=np.array(["live"] * n, dtype=object),
        setting=np.full(n, "", dtype=object),
        split=np.full(n, "live", dtype=object),
    )
    queries.logit = np.full(n, np.nan)
    return queries, np.asarray(served, dtype=np.float64)


def live_ap(record: LiveRecord, logits: np.ndarray) -> float:
    """AP of the record's positives against their negatives, each negative weighing 1/K
    (as the service's ``dygserve_live_ap``): computed by repeating each positive K times,
    which weighs the classes the same."""
    pos, neg, at = [], [], 0
    for s in record.samples:
        k = len(s["negatives"])
        pos += [logits[at]] * k
        neg += logits[at + 1 : at + 1 + k].tolist()
        at += 1 + k
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    return average_precision(y, np.r_[pos, neg])


def score_live_record(
    model: DygMambaLinkModel, data: IndexedStream, record: LiveRecord
) -> dict[str, Any]:
    queries, served = record_queries(data, record)
    replay(model, data, queries)
    diff = np.abs(queries.logit - served) if len(served) else np.zeros(0)
    return {
        "samples": len(record.samples),
        "ap_offline": live_ap(record, queries.logit),
        "ap_served": live_ap(record, served),
        "max_abs_logit_difference": float(diff.max()) if len(diff) else 0.0,
        "logits": queries.logit,
    }
