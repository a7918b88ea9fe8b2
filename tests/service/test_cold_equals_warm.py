"""Invariant 4: dropping cached states and rebuilding them from the stored history
gives the warm states back (the history cap covers every node here)."""

from __future__ import annotations

import pytest

from tests.support.service_process import start_service
from training.data import read_edge_stream


def ingest(client, stream, lo, hi, batch=500):
    for a in range(lo, hi, batch):
        rows = range(a, min(hi, a + batch))
        body = {
            "events": [
                {
                    "src": stream.src[i],
                    "dst": stream.dst[i],
                    "t": float(stream.t[i]),
                    "features": [0.1, 0.2],
                    "event_id": str(i),
                }
                for i in rows
            ]
        }
        r = client.post("/v1/events", json=body)
        assert r.status_code == 200 and not r.json()["rejected"], r.text


def scores(client, pairs):
    r = client.post(
        "/v1/score", json={"pairs": [{"src": s, "dst": d, "t": t} for s, d, t in pairs]}
    )
    assert r.status_code == 200
    return [x["logit"] for x in r.json()["scores"]]


@pytest.fixture()
def redis_service(redis_server, models_dir, tmp_path):
    redis_server.flush()
    svc = start_service(
        tmp_path,
        {"DYGSERVE_CHECKPOINT": str(models_dir / "a"), "DYGSERVE_REDIS_URL": redis_server.url},
    )
    yield svc
    svc.stop()


def test_deleting_states_mid_stream_changes_no_score(redis_server, redis_service, data_dir):
    stream = read_edge_stream(data_dir / "uci", limit=4000)
    with redis_service.client() as client:
        ingest(client, stream, 0, 2000)
        t = float(stream.t[2000])
        pairs = [(stream.src[i], stream.dst[i], t) for i in range(1000, 2000, 5)]
        warm = scores(client, pairs)

        with redis_server.client() as r:
            keys = [k for k in r.scan_iter(match="dygserve:{n:*}:s:*")]
            assert len(keys) > 100
            r.delete(*keys)
        cold = scores(client, pairs)  # rebuilt by one batch scan from the histories
        assert max(abs(a - b) for a, b in zip(warm, cold, strict=True)) <= 1e-4

        # Keep streaming into nodes whose states were dropped again: they are rebuilt
        # before being advanced, never restarted from zero.
        with redis_server.client() as r:
            r.delete(*[k for k in r.scan_iter(match="dygserve:{n:*}:s:*")])
        ingest(client, stream, 2000, 4000)
        t2 = float(stream.t[-1]) + 1
        pairs2 = [(stream.src[i], stream.dst[i], t2) for i in range(0, 4000, 10)]
        after_drop = scores(client, pairs2)
        summary = client.get(f"/v1/nodes/{stream.src[0]}").json()
        assert summary["events_applied"] == summary["history_length"]

    # The same stream with no state ever dropped, on a fresh store.
    redis_server.flush()
    with redis_service.client() as client:
        ingest(client, stream, 0, 4000)
        never_dropped = scores(client, pairs2)
    assert max(abs(a - b) for a, b in zip(after_drop, never_dropped, strict=True)) <= 1e-4
