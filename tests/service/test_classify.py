"""``GET /v1/nodes/{id}/classify`` and ``POST /v1/classify`` on the real service with a
real Redis: answers from the cached states (cold nodes rebuilt to the same numbers),
404 without a node head or for an unknown node, bad input refused with nothing changed,
the head following ``reload`` and shown by ``GET /v1/model``, and the typed client's
classify calls (blocking and async) over HTTP."""

from __future__ import annotations

import asyncio
import math
import re
import shutil

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.node_head import NodeClassifierHead, NodeHeadConfig
from model.node_head_checkpoint import HEAD_CONFIG_FILE, save_node_head
from service.client import (
    AsyncDygserveClient,
    BatchLimits,
    ClientConfig,
    DygserveClient,
    NotFound,
)
from service.schemas import NodeQueryIn
from tests.support.service_process import start_service

from .conftest import make_checkpoint

EVENTS = [
    {"src": "u1", "dst": "i1", "t": 1.0},
    {"src": "u2", "dst": "i1", "t": 2.0},
    {"src": "u1", "dst": "i2", "t": 4.0},
    {"src": "u3", "dst": "i2", "t": 4.0},
    {"src": "u1", "dst": "i1", "t": 9.5},
]


def add_head(folder, seed: int = 0) -> str:
    """A node head (random weights, non-trivial standardisation) on the link checkpoint,
    reading the recent pace (so the neighbour lists go through the service too), with
    two members."""
    ckpt = load_checkpoint(folder)
    torch.manual_seed(seed)
    head = NodeClassifierHead(
        NodeHeadConfig(
            link_model_version=ckpt.version,
            d_readout=ckpt.config.d_out,
            use_recent_pace=True,
            members=2,
        )
    )
    head.fit_standardisation(torch.randn(64, head.config.input_dim))
    return save_node_head(folder, head)


@pytest.fixture(scope="module")
def classify_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify-models")
    make_checkpoint(root / "plain", seed=3, edge_feature_dim=0)
    shutil.copytree(root / "plain", root / "nc")
    add_head(root / "nc")
    return root


@pytest.fixture(scope="module")
def nc_service(redis_server, classify_models, tmp_path_factory):
    redis_server.flush()
    svc = start_service(
        tmp_path_factory.mktemp("nc-svc"),
        {
            "DYGSERVE_CHECKPOINT": str(classify_models / "nc"),
            "DYGSERVE_REDIS_URL": redis_server.url,
            "DYGSERVE_MAX_CLASSIFY_NODES": "8",
        },
    )
    with svc.client() as c:
        r = c.post("/v1/events", json={"events": EVENTS})
        assert r.status_code == 200 and r.json()["accepted"] == len(EVENTS), r.text
    yield svc
    svc.stop()


@pytest.fixture()
def client(nc_service):
    with nc_service.client() as c:
        yield c


def classify(client, queries):
    r = client.post("/v1/classify", json={"nodes": queries})
    assert r.status_code == 200, r.text
    return r.json()


def test_get_and_post_answer_the_same_probability(client, classify_models):
    link_version = load_checkpoint(classify_models / "nc").version
    one = client.get("/v1/nodes/u1/classify", params={"t": 12.0})
    assert one.status_code == 200, one.text
    detail = one.json()
    assert detail["model_version"] == link_version
    assert len(detail["head_version"]) == 16
    assert detail["state_age"] == pytest.approx(12.0 - 9.5)
    assert not detail["clamped"]
    assert 0.0 < detail["probability"] < 1.0
    assert detail["probability"] == pytest.approx(1 / (1 + math.exp(-detail["logit"])))
    batch = classify(client, [{"node": "u2", "t": 12.0}, {"node": "u1", "t": 12.0}])
    assert batch["head_version"] == detail["head_version"]
    assert batch["scores"][1]["logit"] == pytest.approx(detail["logit"], abs=1e-6)
    assert [s["node"] for s in batch["scores"]] == ["u2", "u1"]


def test_the_state_decays_with_the_query_time(client):
    near, far = classify(client, [{"node": "u1", "t": 9.6}, {"node": "u1", "t": 5e6}])["scores"]
    assert near["state_age"] < far["state_age"]
    assert near["logit"] != far["logit"]


def test_default_time_is_the_latest_event_and_early_times_clamp(client):
    latest = client.get("/v1/nodes/u2/classify").json()
    assert latest["t"] == 9.5
    early = client.get("/v1/nodes/u1/classify", params={"t": 1.0}).json()
    assert early["clamped"] and early["state_age"] == 0.0
    at_last = client.get("/v1/nodes/u1/classify", params={"t": 9.5}).json()
    assert early["logit"] == pytest.approx(at_last["logit"], abs=1e-6)


def test_cold_nodes_are_rebuilt_to_the_same_probability(client, redis_server):
    queries = [{"node": n, "t": 20.0} for n in ("u1", "u2", "u3", "i1", "i2")]
    warm = [s["logit"] for s in classify(client, queries)["scores"]]
    with redis_server.client() as r:
        keys = list(r.scan_iter(match="dygserve:{n:*}:s:*"))
        assert keys
        r.delete(*keys)
    cold = [s["logit"] for s in classify(client, queries)["scores"]]
    assert cold == pytest.approx(warm, abs=1e-5)


BAD = {
    "unknown node": ("post", {"nodes": [{"node": "u1", "t": 3.0}, {"node": "ghost"}]}, 404),
    "unknown node (GET)": ("get", ("ghost", {"t": 3.0}), 404),
    "nan t (GET)": ("get", ("u1", {"t": "nan"}), 422),
    "infinite t (GET)": ("get", ("u1", {"t": "inf"}), 422),
    "nan t": ("raw", b'{"nodes": [{"node": "u1", "t": NaN}]}', 422),
    "oversized batch": ("post", {"nodes": [{"node": "u1", "t": 3.0}] * 9}, 413),
    "features the head does not read": (
        "post",
        {"nodes": [{"node": "u1", "t": 3.0, "features": [1.0]}]},
        422,
    ),
    "unknown field": ("post", {"nodes": [{"node": "u1", "x": 1}]}, 422),
    "missing node": ("post", {"nodes": [{"t": 3.0}]}, 422),
    "id over 256 bytes (GET)": ("get", ("x" * 300, {}), 422),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_refused_and_changes_nothing(client, name):
    kind, payload, status = BAD[name]
    before = [client.get(f"/v1/nodes/{n}").json() for n in ("u1", "ghost")]
    if kind == "get":
        node, params = payload
        r = client.get(f"/v1/nodes/{node}/classify", params=params)
    elif kind == "raw":
        r = client.post(
            "/v1/classify", content=payload, headers={"content-type": "application/json"}
        )
    else:
        r = client.post("/v1/classify", json=payload)
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    assert "detail" in r.json()
    if status == 404:
        assert "ghost" in r.json()["detail"]
    after = [client.get(f"/v1/nodes/{n}").json() for n in ("u1", "ghost")]
    # Nothing new was logged or applied; the unknown node stays unknown.
    assert [(a["history_length"], a["last_seq"]) for a in after] == [
        (b["history_length"], b["last_seq"]) for b in before
    ]
    assert after[1]["history_length"] == 0


def test_a_checkpoint_without_a_head_answers_404_and_reload_brings_it_back(client):
    r = client.post("/v1/admin/reload", json={"checkpoint": "plain"})
    assert r.status_code == 200, r.text
    try:
        assert r.json()["node_head"] is None  # /v1/model says so too
        no_head = client.get("/v1/nodes/u1/classify", params={"t": 12.0})
        assert no_head.status_code == 404
        assert "no node-classification head" in no_head.json()["detail"]
        assert client.post("/v1/classify", json={"nodes": [{"node": "u1"}]}).status_code == 404
        # Links still score on the same states.
        assert client.get("/v1/score", params={"src": "u1", "dst": "i1"}).status_code == 200
    finally:
        back = client.post("/v1/admin/reload", json={"checkpoint": "nc"})
        assert back.status_code == 200, back.text
    assert client.get("/v1/nodes/u1/classify", params={"t": 12.0}).status_code == 200


def test_a_tampered_head_is_refused_by_serve(classify_models, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(classify_models / "nc", bad)
    doc = (bad / HEAD_CONFIG_FILE).read_text().replace('"hidden": 64', '"hidden": 65')
    (bad / HEAD_CONFIG_FILE).write_text(doc)
    with pytest.raises(RuntimeError, match="node head"):
        start_service(tmp_path, {"DYGSERVE_CHECKPOINT": str(bad)}, timeout=30)


def counted(client, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", client.get("/metrics").text, re.M)
    assert found, name
    return float(found.group(1))


def test_metrics_count_classifications(client):
    nodes = 'dygserve_nodes_classified_total{route="post_classify"}'
    calls = 'dygserve_classify_latency_seconds_count{route="post_classify"}'
    before = counted(client, nodes), counted(client, calls)
    classify(client, [{"node": "u1", "t": 30.0}, {"node": "u3", "t": 30.0}])
    assert (counted(client, nodes), counted(client, calls)) == (before[0] + 2, before[1] + 1)


def test_openapi_documents_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, method in (("/v1/nodes/{node}/classify", "get"), ("/v1/classify", "post")):
        op = paths[path][method]
        assert {"200", "404", "422"} <= set(op["responses"])
        assert op["tags"] == ["classify"]


def test_model_info_describes_the_head(client, classify_models):
    info = client.get("/v1/model").json()
    head = info["node_head"]
    assert head is not None
    assert head["head_version"] == client.get("/v1/nodes/u1/classify").json()["head_version"]
    assert head["link_model_version"] == info["model_version"]
    assert head["label"] == "label" and head["task"] == "node-classification"
    assert head["inputs"]["recent_pace"] == 2 and head["inputs"]["event_features"] == 0
    assert head["fine_tuned"] is False and head["metrics"] == {}  # no node_metrics.json here
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "node_head" in schemas["ModelInfo"]["properties"]
    assert "head_version" in schemas["NodeHeadInfo"]["properties"]


def client_config(svc, max_nodes: int) -> ClientConfig:
    return ClientConfig(
        url=svc.url, trust_env=False, limits=BatchLimits(max_classify_nodes=max_nodes)
    )


QUERIES = [("u1", 12.0), ("u2", 12.0), ("u3", 40.0), ("i1", 12.0), ("u1", 3.0)]


def test_the_client_classifies_one_node_and_batches(nc_service, client):
    expected = classify(client, [{"node": n, "t": t} for n, t in QUERIES])
    # Under the service's limit of 8 per request the client cuts 5 queries in 3 requests.
    attempts = []
    with DygserveClient(client_config(nc_service, 2), on_attempt=attempts.append) as c:
        one = c.classify("u1", t=12.0)
        assert one.logit == pytest.approx(expected["scores"][0]["logit"], abs=1e-6)
        assert one.head_version == expected["head_version"]
        mixed = [QUERIES[0], {"node": "u2", "t": 12.0}, NodeQueryIn(node="u3", t=40.0)]
        got = c.classify_nodes([*mixed, *QUERIES[3:]])
        assert [s.node for s in got.scores] == [n for n, _ in QUERIES]
        assert [s.logit for s in got.scores] == pytest.approx(
            [s["logit"] for s in expected["scores"]], abs=1e-6
        )
        assert got.scores[-1].clamped and got.head_version == expected["head_version"]
        posts = [a.items for a in attempts if a.path == "/v1/classify"]
        assert posts == [2, 2, 1]
        with pytest.raises(NotFound, match="ghost"):
            c.classify("ghost")


def test_the_async_client_classifies_too(nc_service, client):
    expected = classify(client, [{"node": n, "t": t} for n, t in QUERIES])

    async def run():
        async with AsyncDygserveClient(client_config(nc_service, 3)) as c:
            one = await c.classify("u3", t=40.0)
            many = await c.classify_nodes(QUERIES)
            with pytest.raises(NotFound):
                await c.classify_nodes([("u1", 1.0), ("ghost", 1.0)])
            return one, many

    one, many = asyncio.run(run())
    assert one.logit == pytest.approx(expected["scores"][2]["logit"], abs=1e-6)
    assert [s.logit for s in many.scores] == pytest.approx(
        [s["logit"] for s in expected["scores"]], abs=1e-6
    )
    assert many.model_version == expected["model_version"]
