"""Invariant 3 for node classification: the offline evaluator's test-split probabilities
(each event's source read from the states before the event, then the event ingested)
equal the service's over HTTP with a real Redis (max |difference| <= 1e-4), with a
tiny link model and a head trained here on a prefix of MOOC (4 edge features, read
by the head too, so the request's features path is covered, and the embeddings of each
source's latest 3 neighbours, read from the cached lists); then the same with the
link model fine-tuned through the head (``--fine-tune``): the checkpoint serves its
own link model, for links and classification, under its own version."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from model.checkpoint import load_checkpoint
from tests.support.service_process import start_service
from training import evaluate
from training import train as train_cli
from training.data import EdgeStream, chronological_split, read_edge_stream
from training.metrics import roc_auc
from training.train import train

N_EVENTS = 5000


def ingest(client, stream: EdgeStream, rows: np.ndarray, batch: int = 1000) -> None:
    for a in range(0, len(rows), batch):
        body = {
            "events": [
                {
                    "src": stream.src[i],
                    "dst": stream.dst[i],
                    "t": float(stream.t[i]),
                    "features": stream.features[i].tolist(),
                    "event_id": f"mooc:{i}",
                }
                for i in rows[a : a + batch]
            ]
        }
        r = client.post("/v1/events", json=body)
        assert r.status_code == 200 and not r.json()["rejected"], r.text


def served_test_logits(
    client, stream: EdgeStream, test_time: float
) -> tuple[dict[int, float], list[int]]:
    """Ingest up to the test split, then per timestamp group: classify the group's
    sources at its time (with the event's features), then ingest it. Groups are merged
    while no source of a group was touched by an earlier one of the run (a query reads
    only its node's state, so that is the same as one group at a time).

    A source with no earlier event is unknown to the service (404, checked here); the
    evaluator scores it from the initial state. Returns the served logits and those events.
    """
    before = np.flatnonzero(stream.t <= test_time)
    ingest(client, stream, before)
    seen = set(stream.src[before]) | set(stream.dst[before])
    after = np.flatnonzero(stream.t > test_time)
    groups = np.split(after, np.flatnonzero(np.diff(stream.t[after])) + 1)
    out: dict[int, float] = {}
    first_seen: list[int] = []
    run: list[np.ndarray] = []
    touched: set[str] = set()

    def flush() -> None:
        if not run:
            return
        group_rows = np.concatenate(run)
        for i in group_rows.tolist():
            if stream.src[i] not in seen:
                first_seen.append(i)
                query = {
                    "node": stream.src[i],
                    "t": float(stream.t[i]),
                    "features": stream.features[i].tolist(),
                }
                r = client.post("/v1/classify", json={"nodes": [query]})
                assert r.status_code == 404 and "unknown node" in r.json()["detail"], r.text
        rows = np.array([i for i in group_rows.tolist() if stream.src[i] in seen], dtype=np.int64)
        body = {
            "nodes": [
                {
                    "node": stream.src[i],
                    "t": float(stream.t[i]),
                    "features": stream.features[i].tolist(),
                }
                for i in rows
            ]
        }
        r = client.post("/v1/classify", json=body)
        assert r.status_code == 200, r.text
        for i, s in zip(rows.tolist(), r.json()["scores"], strict=True):
            out[i] = s["logit"]
        ingest(client, stream, group_rows)
        seen.update(stream.src[group_rows])
        seen.update(stream.dst[group_rows])
        run.clear()
        touched.clear()

    for g in groups:
        if any(stream.src[i] in touched for i in g):
            flush()
        run.append(g)
        touched.update(stream.src[g])
        touched.update(stream.dst[g])
    flush()
    return out, first_seen


@pytest.fixture(scope="module")
def tiny_link(data_dir, tmp_path_factory):
    link = tmp_path_factory.mktemp("parity") / "link"
    train(
        data_dir / "mooc" / "edges.csv.gz",
        link,
        {"d_model": 8, "d_state": 4, "d_time": 4, "head_hidden": 16},
        epochs=1,
        max_events=N_EVENTS,
        progress=False,
        window=4,
        test_eval=False,
    )
    return link


@pytest.mark.parametrize("fine_tune", [False, True], ids=["frozen", "fine-tuned"])
def test_served_node_probabilities_equal_the_evaluator(
    redis_server, data_dir, tmp_path, tiny_link, fine_tune
):
    data = data_dir / "mooc" / "edges.csv.gz"
    nc, scores_file = tmp_path / "nc", tmp_path / "scores.csv"
    common = ["--data", str(data), "--max-events", str(N_EVENTS), "--no-progress"]
    assert (
        train_cli.main(
            ["--task", "node-classification", "--base", str(tiny_link), "--out", str(nc)]
            + ["--epochs", "5", "--event-features", "--recent-neighbours", "3", *common]
            + (["--fine-tune"] if fine_tune else [])
        )
        == 0
    )
    version = load_checkpoint(nc).version
    assert (version != load_checkpoint(tiny_link).version) == fine_tune
    # `evaluate` picks the node-classification evaluator for a checkpoint with a head.
    assert (
        evaluate.main(
            ["--checkpoint", str(nc), "--out", str(tmp_path / "eval")]
            + ["--write-scores", str(scores_file), *common]
        )
        == 0
    )
    with open(scores_file, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["split"] == "test"]
    offline = {int(r["event"]): float(r["logit"]) for r in rows}
    labels = {int(r["event"]): int(r["label"]) for r in rows}
    stream = read_edge_stream(data, limit=N_EVENTS)
    split = chronological_split(stream)
    assert sorted(offline) == np.flatnonzero(split.test).tolist()
    assert sum(labels.values()) > 0  # both classes: the AUC below means something

    redis_server.flush()
    svc = start_service(
        tmp_path, {"DYGSERVE_CHECKPOINT": str(nc), "DYGSERVE_REDIS_URL": redis_server.url}
    )
    try:
        with svc.client() as client:
            served, first_seen = served_test_logits(client, stream, split.test_time)
            info = client.get("/v1/model").json()
            assert info["model_version"] == version
            assert info["node_head"]["fine_tuned"] == fine_tune
            assert info["node_head"]["metrics"]["test"]["n_events"] == len(offline)
            # One model for both tasks: links score on the same (fine-tuned) states.
            pair = {"src": stream.src[-1], "dst": stream.dst[-1], "t": float(stream.t[-1])}
            r = client.post("/v1/score", json={"pairs": [pair]})
            assert r.status_code == 200 and r.json()["model_version"] == version, r.text
    finally:
        svc.stop()

    events = sorted(served)
    assert len(events) + len(first_seen) == len(offline) and len(events) > 500
    a = np.array([served[e] for e in events])
    b = np.array([offline[e] for e in events])
    assert np.isfinite(a).all()
    diff = np.abs(a - b)
    assert diff.max() <= 1e-4, (
        f"max |served - offline| = {diff.max():.2e} at event {events[int(diff.argmax())]}"
    )
    y = np.array([labels[e] for e in events])
    assert abs(roc_auc(y, a) - roc_auc(y, b)) < 1e-6
