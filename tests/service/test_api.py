"""The v1 contract against the real app over HTTP (uvicorn in its own process)."""

from __future__ import annotations

import math
import re

import httpx
import torch


def events(*rows, **extra):
    return {
        "events": [
            dict({"src": s, "dst": d, "t": t, "features": [0.5, -1.0]}, **extra) for s, d, t in rows
        ]
    }


def test_ingest_score_rank_and_summary(client):
    r = client.post(
        "/v1/events", json=events(("u1", "v1", 10.0), (7, "u1", 11.0), ("u1", "v2", 12.0))
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 3, "duplicates": 0, "rejected": [], "applied": True}

    node = client.get("/v1/nodes/u1").json()
    assert node["cached"] and node["events_applied"] == 3 and node["t_last"] == 12.0
    assert client.get("/v1/nodes/7").json()["events_applied"] == 1  # 7 and "7" are one id

    one = client.get("/v1/score", params={"src": "u1", "dst": "v1", "t": 13.0}).json()
    assert 0.0 < one["probability"] < 1.0
    assert math.isclose(one["probability"], 1 / (1 + math.exp(-one["logit"])), rel_tol=1e-9)
    assert one["src_state_age"] == 1.0 and one["dst_state_age"] == 3.0
    assert not one["src_inductive"] and not one["clamped"]

    batch = client.post(
        "/v1/score",
        json={
            "pairs": [{"src": "u1", "dst": "v1", "t": 13.0}, {"src": "new", "dst": "v1", "t": 13.0}]
        },
    ).json()
    assert abs(batch["scores"][0]["logit"] - one["logit"]) < 1e-5
    assert batch["model_version"] == one["model_version"]

    unknown = client.get("/v1/score", params={"src": "never-seen", "dst": "v1", "t": 13.0}).json()
    assert unknown["src_inductive"] and unknown["src_state_age"] is None

    ranked = client.post(
        "/v1/rank", json={"src": "u1", "t": 13.0, "candidates": ["v1", "v2", "7", "zz"]}
    ).json()
    logits = [x["logit"] for x in ranked["ranking"]]
    assert logits == sorted(logits, reverse=True) and len(logits) == 4


def test_scoring_never_writes(client):
    client.post("/v1/events", json=events(("w1", "w2", 5.0)))
    before = client.get("/v1/nodes/w1").json()
    for t in (6.0, 100.0, 1e9):
        client.get("/v1/score", params={"src": "w1", "dst": "w2", "t": t})
    assert client.get("/v1/nodes/w1").json() == before


def test_retries_are_applied_once(client):
    body = events(("r1", "r2", 1.0), ("r1", "r3", 2.0), event_id=None)
    for i, e in enumerate(body["events"]):
        e["event_id"] = f"retry-{i}"
    assert client.post("/v1/events", json=body).json()["accepted"] == 2
    again = client.post("/v1/events", json=body).json()
    assert again["accepted"] == 0 and again["duplicates"] == 2
    assert client.get("/v1/nodes/r1").json()["events_applied"] == 2


def test_late_events_are_rejected_with_a_reason(client):
    client.post("/v1/events", json=events(("l1", "l2", 50.0)))
    r = client.post("/v1/events", json=events(("l1", "l3", 40.0), ("l4", "l5", 41.0))).json()
    assert r["accepted"] == 1
    assert r["rejected"][0]["index"] == 0 and "late" in r["rejected"][0]["reason"]
    assert client.get("/v1/nodes/l1").json()["events_applied"] == 1
    assert client.get("/v1/nodes/l3").json()["history_length"] == 0  # none of it applied


def test_query_before_last_event_is_clamped(client):
    client.post("/v1/events", json=events(("c1", "c2", 100.0)))
    r = client.get("/v1/score", params={"src": "c1", "dst": "c2", "t": 50.0}).json()
    assert r["clamped"] is True


def test_omitted_time_means_latest_event_time(client):
    # the latest event time of this service (no other test ingests later times)
    latest = 1_000_000.5
    assert client.post("/v1/events", json=events(("o1", "o2", latest))).json()["accepted"] == 1
    given = client.get("/v1/score", params={"src": "o1", "dst": "o2", "t": latest}).json()
    omitted = client.get("/v1/score", params={"src": "o1", "dst": "o2"}).json()
    assert omitted["t"] == latest
    assert omitted["logit"] == given["logit"] and omitted["probability"] == given["probability"]
    batch = client.post("/v1/score", json={"pairs": [{"src": "o1", "dst": "o2"}]}).json()
    assert batch["scores"][0]["t"] == latest and batch["scores"][0]["logit"] == given["logit"]


def test_model_health_and_metrics(service, client):
    info = client.get("/v1/model").json()
    assert len(info["model_version"]) == 16 and info["config"]["edge_feature_dim"] == 2
    assert info["device"] == (
        "cuda" if torch.cuda.is_available() else "cpu"
    )  # DYGSERVE_DEVICE=auto
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json()["ready"] is True
    text = client.get("/metrics").text
    for name in (
        "dygserve_events_ingested_total",
        "dygserve_ingest_latency_seconds_bucket",
        "dygserve_model_info",
        "dygserve_store_latency_seconds_count",
        "dygserve_in_flight_requests",
        "dygserve_http_requests_total",
    ):
        assert name in text, name
    assert f'dygserve_model_info{{version="{info["model_version"]}"}} 1.0' in text
    # The state-advance path, in /v1/model and as a metric (on this machine: torch on the
    # CPU; a GPU machine shows mamba-ssm or torch-cuda, with the reason).
    kernels = info["kernels"]
    if not torch.cuda.is_available():
        assert kernels["path"] == "torch-cpu" and kernels["reason"] == "no CUDA device"
    assert kernels["scoring_providers"] is None  # the torch backend
    assert f'dygserve_kernel_path{{path="{kernels["path"]}"}} 1.0' in text
    others = {"mamba-ssm", "torch-cuda", "torch-cpu"} - {kernels["path"]}
    assert all(f'dygserve_kernel_path{{path="{p}"}} 0.0' in text for p in others)


def test_openapi_documents_the_contract(client):
    spec = client.get("/openapi.json").json()
    for path in (
        "/v1/events",
        "/v1/score",
        "/v1/rank",
        "/v1/nodes/{node}",
        "/v1/model",
        "/v1/admin/reload",
    ):
        assert path in spec["paths"], path


def test_auth_on_write_and_admin_routes(service):
    with httpx.Client(base_url=service.url) as anon:
        assert anon.post("/v1/events", json=events(("a", "b", 1.0))).status_code == 401
        assert (
            anon.post(
                "/v1/events", json=events(("a", "b", 1.0)), headers={"X-API-Key": "wrong"}
            ).status_code
            == 403
        )
        assert anon.post("/v1/admin/reload", json={"checkpoint": "b"}).status_code == 401
        assert anon.get("/v1/nodes/a").json()["history_length"] == 0  # nothing written
        # reads need no key
        assert anon.get("/v1/score", params={"src": "a", "dst": "b", "t": 2.0}).status_code == 200


def test_hot_reload(service, client, models_dir):
    before = client.get("/v1/model").json()["model_version"]
    # refused: outside the models directory, and a tampered checkpoint
    assert client.post("/v1/admin/reload", json={"checkpoint": "../../etc"}).status_code == 403
    bad = models_dir / "tampered"
    bad.mkdir(exist_ok=True)
    for f in ("config.json", "checksums.json"):
        (bad / f).write_bytes((models_dir / "b" / f).read_bytes())
    (bad / "weights.safetensors").write_bytes(
        (models_dir / "b" / "weights.safetensors").read_bytes()[:-10]
    )
    r = client.post("/v1/admin/reload", json={"checkpoint": "tampered"})
    assert r.status_code == 422 and "still serving" in r.json()["detail"]
    assert client.get("/v1/model").json()["model_version"] == before

    client.post("/v1/events", json=events(("h1", "h2", 1.0), ("h1", "h3", 2.0)))
    old_score = client.get("/v1/score", params={"src": "h1", "dst": "h2", "t": 3.0}).json()
    r = client.post("/v1/admin/reload", json={"checkpoint": "b"})
    assert r.status_code == 200
    after = r.json()["model_version"]
    assert after != before
    # The new version's states rebuild lazily from the history: h1 is cold, not restarted.
    new_score = client.get("/v1/score", params={"src": "h1", "dst": "h2", "t": 3.0}).json()
    assert new_score["model_version"] == after and not new_score["src_inductive"]
    assert new_score["logit"] != old_score["logit"]
    assert client.get("/v1/nodes/h1").json()["events_applied"] == 2
    assert (
        client.post("/v1/admin/reload", json={"checkpoint": "a"}).json()["model_version"] == before
    )


def _counter(client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", client.get("/metrics").text, re.M)
    assert match, name
    return float(match.group(1))


def test_wait_false_logs_now_and_applies_soon(client):
    import time

    applied_before = _counter(client, "dygserve_events_applied_total")
    r = client.post(
        "/v1/events",
        params={"wait": "false"},
        json=events(("nw1", "nw2", 1.0), ("nw1", "nw3", 2.0)),
    )
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 2 and body["applied"] is False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and client.get("/v1/nodes/nw1").json()["events_applied"] < 2:
        time.sleep(0.05)
    assert client.get("/v1/nodes/nw1").json()["events_applied"] == 2
    while (
        time.monotonic() < deadline
        and _counter(client, "dygserve_events_applied_total") < applied_before + 2
    ):
        time.sleep(0.05)  # the counter moves once the apply has returned
    assert _counter(client, "dygserve_events_applied_total") == applied_before + 2


def test_applied_counter_follows_the_ingested_one_with_wait(client):
    ingested, applied = (
        _counter(client, "dygserve_events_ingested_total"),
        _counter(client, "dygserve_events_applied_total"),
    )
    body = client.post(
        "/v1/events", json=events(("ap1", "ap2", 1.0), ("ap2", "ap3", 2.0), ("ap1", "ap2", 0.5))
    ).json()
    assert body["accepted"] == 2 and len(body["rejected"]) == 1  # the late one is neither
    assert _counter(client, "dygserve_events_ingested_total") == ingested + 2
    assert _counter(client, "dygserve_events_applied_total") == applied + 2


def test_node_summary_shows_role_counts_where_the_model_keeps_them(tmp_path):
    """A model with role counts (the trainer's rule on snapshot streams) reports each
    node's events as destination and as source; one without reports null."""
    from model.checkpoint import save_checkpoint
    from model.config import ModelConfig
    from model.link_model import DygMambaLinkModel
    from tests.support.service_process import start_service

    torch.manual_seed(0)
    config = ModelConfig(d_model=8, d_state=4, snapshot_pair_features=True, role_counts=True)
    save_checkpoint(tmp_path / "ck", DygMambaLinkModel(config))
    svc = start_service(tmp_path, {"DYGSERVE_CHECKPOINT": str(tmp_path / "ck")})
    try:
        with svc.client() as c:
            rows = [("a", "b", 1.0), ("c", "b", 1.0), ("b", "a", 2.0), ("a", "a", 3.0)]
            body = {"events": [{"src": s, "dst": d, "t": t} for s, d, t in rows]}
            assert c.post("/v1/events", json=body).status_code == 200
            b, a = c.get("/v1/nodes/b").json(), c.get("/v1/nodes/a").json()
            assert (b["in_events"], b["out_events"], b["last_in_t"]) == (2, 1, 1.0)
            # a self-loop counts once in each role
            assert (a["in_events"], a["out_events"], a["last_in_t"]) == (2, 2, 3.0)
            assert a["events_applied"] == 4
            assert c.get("/v1/nodes/zz").json()["in_events"] is None  # never seen
    finally:
        svc.stop()


def test_node_summary_has_no_role_counts_without_the_record(client):
    client.post("/v1/events", json=events(("rc1", "rc2", 5.0)))
    node = client.get("/v1/nodes/rc2").json()
    assert node["cached"] and node["in_events"] is None and node["out_events"] is None
