"""The live evaluation agrees with the offline evaluator: a replay of the start of the
UCI test split through the real service (real Redis, over HTTP) at rate 1.0 with K = 1
gives, on the pairs the service sampled (its own negatives), the same scores as
``training.replay`` (score, then update, exact visibility) and the same AP within 1e-6.

The events before the test split go through a first service with live evaluation
off (scoring 50,000 events live would only make the test slow); a second one, on
the same store, evaluates every test event it ingests.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import numpy as np
import pytest

from loadtests.accuracy_replay import ServiceClient
from model.checkpoint import load_checkpoint
from service.settings import DEFAULT_CHECKPOINT
from tests.service.conftest import make_checkpoint
from tests.support.service_process import start_service
from training import evaluate
from training.batches import IndexedStream
from training.data import chronological_split, read_edge_stream
from training.live_record import LiveRecord, record_queries
from training.metrics import average_precision
from training.replay import replay

TEST_EVENTS = 1500  # a prefix of the test split's 8,976 events keeps this under a minute
BATCH = 200


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.findall(pattern, text, flags=re.M)
    return float(found[0]) if found else 0.0


def timestamp_batches(index: np.ndarray, t: np.ndarray, size: int) -> list[np.ndarray]:
    """Batches of about ``size`` events that never cut a timestamp group: a request
    that holds part of a group would make the rest of it not exactly visible."""
    cuts = np.flatnonzero(np.diff(t[index])) + 1
    batches, start = [], 0
    for cut in [*cuts.tolist(), len(index)]:
        if cut - start >= size or cut == len(index):
            batches.append(index[start:cut])
            start = cut
    return batches


@pytest.mark.parametrize("model", ["bundled", "transition counts", "latest read at the query"])
def test_live_ap_equals_offline_on_the_sampled_pairs(redis_server, data_dir, tmp_path, model):
    """``transition counts``: a model that keeps them (decayed, second order) and role
    counts, untrained: the evaluator's lists must take each event's counterpart's
    previous neighbours from the apply's nodes, as the applier does."""
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz")
    checkpoint = DEFAULT_CHECKPOINT
    if model != "bundled":
        checkpoint = tmp_path / "ck"
        at_query = model == "latest read at the query"
        make_checkpoint(
            checkpoint,
            seed=3,
            edge_feature_dim=stream.features.shape[1],
            transition_buckets=16,
            transition_decay=259_200.0,
            transition_order2=True,
            role_counts=True,
            latest_transition_count=at_query,
            latest_transition_at_query=at_query,
        )
    split = chronological_split(stream)
    before = np.flatnonzero(stream.t <= split.test_time)
    test_part = np.flatnonzero(stream.t > split.test_time)[:TEST_EVENTS]
    # the prefix ends at a group boundary (the offline replay scores whole groups)
    test_part = test_part[stream.t[test_part] < stream.t[test_part[-1]]]

    redis_server.flush()
    env = {"DYGSERVE_REDIS_URL": redis_server.url, "DYGSERVE_CHECKPOINT": str(checkpoint)}
    svc = start_service(tmp_path, {**env, "DYGSERVE_LIVE_EVAL_RATE": "0"})
    try:
        ServiceClient(svc.url, None).ingest(stream, before, 1000)
    finally:
        svc.stop()

    record = tmp_path / "live.jsonl"
    svc = start_service(
        tmp_path,
        {
            **env,
            "DYGSERVE_LIVE_EVAL_RATE": "1.0",
            "DYGSERVE_LIVE_EVAL_CPU_BUDGET": "1",
            "DYGSERVE_LIVE_EVAL_NEGATIVES": "1",
            "DYGSERVE_LIVE_EVAL_WINDOW": "100000",
            "DYGSERVE_LIVE_EVAL_SEED": "7",
            "DYGSERVE_LIVE_EVAL_RECORD": str(record),
        },
    )
    try:
        client = ServiceClient(svc.url, None)
        for rows in timestamp_batches(test_part, stream.t, BATCH):
            client.ingest(stream, rows, BATCH)
        text = ""
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            for _ in range(300):  # the evaluator runs behind the answers
                text = c.get("/metrics").text
                done = metric(text, "dygserve_live_eval_samples_total") + sum(
                    metric(text, "dygserve_live_eval_skipped_total", f'{{reason="{r}"}}')
                    for r in ("not_visible", "few_destinations", "counterpart_unknown")
                )
                if done >= len(test_part):
                    break
                time.sleep(0.1)
    finally:
        svc.stop()

    def skipped(reason: str) -> float:
        return metric(text, "dygserve_live_eval_skipped_total", f'{{reason="{reason}"}}')

    assert skipped("not_visible") == skipped("batch_error") == 0
    # Read at the query, a row's newest neighbour must be in hand too (advanced by the
    # batch, or a pooled destination); the others are skipped and counted.
    unknown = skipped("counterpart_unknown")
    assert unknown == 0 if model != "latest read at the query" else unknown < 0.2 * len(test_part)
    samples = [json.loads(line) for line in record.read_text().splitlines()]
    # only the first batch has no known destinations to draw from
    assert len(test_part) - BATCH - 50 <= len(samples) + unknown <= len(test_part)
    assert metric(text, "dygserve_live_eval_samples_total") == len(samples)
    assert all(len(s["negatives"]) == 1 for s in samples)
    assert sum(s["negatives"][0]["dst"] != s["dst"] for s in samples) == len(samples)

    # The same pairs through `dygserve evaluate --live-record` (the offline replay).
    rc = evaluate.main(
        [
            "--checkpoint",
            str(checkpoint),
            "--data",
            str(data_dir / "uci" / "edges.csv.gz"),
            "--live-record",
            str(record),
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    assert rc == 0
    offline = json.loads((tmp_path / "eval" / "metrics.json").read_text())["live_record"]
    assert offline["samples"] == len(samples)
    assert offline["max_abs_logit_difference"] <= 1e-4
    assert (0.5 if model == "bundled" else 0.0) < offline["ap_offline"] < 1.0
    live_ap = metric(text, "dygserve_live_ap")
    assert live_ap == pytest.approx(offline["ap_offline"], abs=1e-6)
    assert live_ap == pytest.approx(offline["ap_served"], abs=1e-12)
    assert metric(text, "dygserve_live_window_samples") == len(samples)

    # and by hand: the record's pairs, replayed offline, labelled 1 / 0
    data = IndexedStream.build(stream)
    queries, served = record_queries(data, LiveRecord.read(record))
    replay(load_checkpoint(checkpoint).model, data, queries)
    n = len(samples)
    labels = np.r_[np.ones(n), np.zeros(n)]
    order = np.r_[np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2)]  # positives, then negatives
    assert abs(average_precision(labels, queries.logit[order]) - live_ap) < 1e-6
    assert np.abs(queries.logit - served).max() <= 1e-4
