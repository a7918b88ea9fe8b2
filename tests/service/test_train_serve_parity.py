"""Invariant 3: the offline evaluator (score, then update) and a replay of the same
stream through the running service over HTTP, with the bundled checkpoint and a real
Redis, give the same scores (max abs difference <= 1e-4) and so the same AP."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from loadtests.accuracy_replay import ServiceClient, read_queries, replay
from service.settings import DEFAULT_CHECKPOINT
from tests.support.service_process import start_service
from training import evaluate
from training.data import chronological_split, read_edge_stream


def offline_scores(ckpt, data, tmp_path) -> tuple[np.ndarray, list, list[str]]:
    """The evaluator's test-split logits (random negatives, transductive), its queries,
    and the arguments it ran with (for a variant run)."""
    scores_file = tmp_path / "offline.csv"
    args = ["--checkpoint", str(ckpt), "--data", str(data), "--splits", "test"]
    args += ["--strategies", "random", "--settings", "transductive", "--mrr-k", "0"]
    rc = evaluate.main([*args, "--write-scores", str(scores_file), "--out", str(tmp_path / "e")])
    assert rc == 0
    with open(scores_file, newline="") as fh:
        offline = np.array([float(r["logit"]) for r in csv.DictReader(fh)])
    return offline, read_queries(scores_file), args


def served_scores(redis_server, ckpt, data, tmp_path, queries, visibility: str) -> np.ndarray:
    """The same queries answered by the service over HTTP on a fresh Redis, the stream
    replayed into it as the evaluator's visibility has it."""
    redis_server.flush()
    svc = start_service(
        tmp_path, {"DYGSERVE_REDIS_URL": redis_server.url, "DYGSERVE_CHECKPOINT": str(ckpt)}
    )
    try:
        stream = read_edge_stream(data)
        split = chronological_split(stream)
        client = ServiceClient(svc.url, None)
        return np.array(replay(client, stream, split.test_time, queries, visibility=visibility))
    finally:
        svc.stop()


def test_replay_over_http_equals_offline_evaluator(redis_server, data_dir, tmp_path):
    data = data_dir / "uci" / "edges.csv.gz"
    scores_file = tmp_path / "offline.csv"
    rc = evaluate.main(
        [
            "--checkpoint",
            str(DEFAULT_CHECKPOINT),
            "--data",
            str(data),
            "--splits",
            "test",
            "--strategies",
            "random",
            "--settings",
            "transductive",
            "--mrr-k",
            "0",
            "--write-scores",
            str(scores_file),
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    assert rc == 0
    with open(scores_file, newline="") as fh:
        offline = np.array([float(r["logit"]) for r in csv.DictReader(fh)])
    queries = read_queries(scores_file)
    assert len(queries) > 17_000  # the whole test part: 8,976 positives and as many negatives

    redis_server.flush()
    svc = start_service(tmp_path, {"DYGSERVE_REDIS_URL": redis_server.url})
    try:
        stream = read_edge_stream(data)
        split = chronological_split(stream)
        served = np.array(replay(ServiceClient(svc.url, None), stream, split.test_time, queries))
    finally:
        svc.stop()

    assert np.isfinite(served).all()
    diff = np.abs(served - offline)
    assert diff.max() <= 1e-4, (
        f"max |served - offline| = {diff.max():.2e} at query {int(diff.argmax())}"
    )
    labels = np.array([q.label for q in queries])
    assert (
        abs(average_precision_score(labels, served) - average_precision_score(labels, offline))
        < 1e-6
    )


def test_batch_visibility_replay_over_http_equals_offline_evaluator(
    redis_server, data_dir, tmp_path
):
    """The same invariant on a snapshot stream with the trainer's own choice there:
    a checkpoint trained with batch visibility, evaluated (by default) with it, and the
    service replayed in the same groups of 200 events, so queries see the earlier
    groups of their own timestamp (states, neighbour lists and role counts alike)."""
    from training.train import train

    # Every 12th US Legis. event: twelve congresses of about 420 events each.
    with gzip.open(data_dir / "uslegis" / "edges.csv.gz", "rt") as f:
        header, *rows = f.read().splitlines()
    data = tmp_path / "snap.csv.gz"
    with gzip.open(data, "wt") as f:
        f.write("\n".join([header, *rows[::12]]) + "\n")
    ckpt = tmp_path / "ckpt"
    train(data, ckpt, {"d_model": 8, "d_state": 4}, epochs=1, progress=False, test_eval=False)
    # The trainer's snapshot rules are on, the role-count records among them (kept
    # beside each list in Redis and read back for every query).
    model_config = json.loads((ckpt / "config.json").read_text())["model"]
    assert model_config["snapshot_pair_features"] and model_config["role_counts"]
    offline, queries, args = offline_scores(ckpt, data, tmp_path)
    assert json.loads((tmp_path / "e" / "metrics.json").read_text())["visibility"] == "batch"
    served = served_scores(redis_server, ckpt, data, tmp_path, queries, "batch")

    diff = np.abs(served - offline)
    assert np.isfinite(served).all() and diff.max() <= 1e-4, f"max diff {diff.max():.2e}"
    # Not vacuous: with exact visibility the same queries score differently.
    exact_file = tmp_path / "exact.csv"
    rc = evaluate.main(
        [*args, "--visibility", "exact", "--write-scores", str(exact_file)]
        + ["--out", str(tmp_path / "x")]
    )
    assert rc == 0
    with open(exact_file, newline="") as fh:
        exact = np.array([float(r["logit"]) for r in csv.DictReader(fh)])
    assert np.abs(exact - offline).max() > 1e-3


@pytest.mark.parametrize(
    ("order2", "at_query"),
    [(False, False), (True, False), (True, True)],
    ids=["first order", "second order", "latest read at the query"],
)
def test_transition_counts_replay_over_http_equals_offline_evaluator(
    redis_server, data_dir, tmp_path, order2, at_query
):
    """The same invariant for a model with transition counts: each applied event adds
    to its endpoints' records where the other endpoint was just before (and, second
    order, the entry before that), which the service reads from the log's histories in
    Redis and the evaluator from its own walk of the stream (model/transition_counts.py).
    ``latest read at the query``: each node's newest neighbour's record is read too
    (named in the node's blob; a second read) for its latest transition count.
    The first 6,000 MOOC events: students moving from course item to course item."""
    from state_store.factory import make_store
    from training.train import train

    with gzip.open(data_dir / "mooc" / "edges.csv.gz", "rt") as f:
        lines = f.read().splitlines()[:6_001]
    data = tmp_path / "mooc-head.csv.gz"
    with gzip.open(data, "wt") as f:
        f.write("\n".join(lines) + "\n")
    ckpt = tmp_path / "ckpt"
    # raw and decayed counts (the MOOC slice spans about a day, in seconds)
    config = {"d_model": 8, "d_state": 4, "transition_buckets": 32, "transition_decay": 3_600.0}
    config["transition_order2"] = order2
    if at_query:
        config.update(latest_transition_count=True, latest_transition_at_query=True)
    version = train(data, ckpt, config, epochs=1, progress=False, test_eval=False)
    offline, queries, _ = offline_scores(ckpt, data, tmp_path)
    served = served_scores(redis_server, ckpt, data, tmp_path, queries, "exact")
    stream = read_edge_stream(data)

    diff = np.abs(served - offline)
    assert np.isfinite(served).all() and diff.max() <= 1e-4, f"max diff {diff.max():.2e}"
    # Not vacuous: the items' records in Redis hold the counts.
    store = make_store(redis_server.url)
    try:
        items = sorted({str(d) for d in stream.dst})
        blobs = [b for b in store.read_states(version, items) if b is not None]
    finally:
        store.close()
    from model.checkpoint import load_checkpoint
    from model.node_state import StateCodec

    loaded = load_checkpoint(ckpt)
    _, lists = StateCodec(loaded.config, version).decode_with_neighbours(blobs)
    assert lists.transitions is not None
    assert lists.transitions.totals().sum() > 0.8 * len(stream)  # type: ignore[union-attr]
    if order2:  # ...and the second-order ones, most events having two entries before
        second = lists.transitions.second()  # type: ignore[union-attr]
        assert second.totals().sum() > 0.7 * len(stream)
    if at_query:  # ...and each names its newest neighbour, a student of the stream
        students = {str(x) for x in stream.src}
        newest = StateCodec(loaded.config, version).newest_ids(blobs)
        assert sum(x in students for x in newest) == len(blobs)
