"""``training.live_record``: the offline AP of a live record weighs each negative 1/K,
as the service's rolling ``dygserve_live_ap`` does, and the record's pairs become
queries at the events of their times."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.rolling_quality import RollingQuality
from training.batches import IndexedStream
from training.data import read_edge_stream
from training.live_record import LiveRecord, live_ap, record_queries


def test_offline_ap_weighs_negatives_as_the_live_gauge_does():
    rng = np.random.default_rng(0)
    k = 3
    samples, window = [], RollingQuality(1000)
    logits = []
    for i in range(200):
        pos, neg = float(rng.normal(1.0)), rng.normal(0.0, 1.0, k)
        neg[0] = pos if i % 9 == 0 else neg[0]  # some ties
        samples.append({"logit": pos, "negatives": [{"dst": "x", "logit": float(x)} for x in neg]})
        window.add(pos, neg)
        logits += [pos, *neg.tolist()]
    ap = live_ap(LiveRecord(samples), np.array(logits))
    assert ap == pytest.approx(window.quality().ap, abs=1e-12)


def test_record_pairs_become_queries_at_their_events(data_dir, tmp_path):
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=500)
    data = IndexedStream.build(stream)
    rows = [100, 250]
    path = tmp_path / "live.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "src": stream.src[r],
                    "dst": stream.dst[r],
                    "t": float(stream.t[r]),
                    "logit": 1.0,
                    "negatives": [{"dst": stream.dst[r + 1], "logit": -1.0}],
                }
            )
            + "\n"
            for r in rows
        )
    )
    queries, served = record_queries(data, LiveRecord.read(path))
    assert served.tolist() == [1.0, -1.0, 1.0, -1.0]
    assert (data.t[queries.event] == queries.t).all()
    assert (queries.event <= np.repeat(rows, 2)).all()  # the first event at that time
    assert data.node_ids[queries.src[0]] == stream.src[100]
    assert data.node_ids[queries.dst[1]] == stream.dst[101]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**json.loads(path.read_text().splitlines()[0]), "t": -5.0}) + "\n")
    with pytest.raises(ValueError, match="no event"):
        record_queries(data, LiveRecord.read(bad))
