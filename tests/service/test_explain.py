"""``GET /v1/score?...&explain=k`` on real data (the start of UCI, the bundled checkpoint,
a real Redis): the events listed are the endpoint's own, ordered by |contribution|,
their terms rebuild the state, and removing the top event from an endpoint's history
moves the logit more than removing the bottom one (the state rebuilt without it, the
pair features held fixed as the explanation holds them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loadtests.accuracy_replay import ServiceClient
from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.events import NodeEvent, pad_events
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.pair_features import pair_inputs
from service.engine import Engine, ModelRuntime
from service.explain import explain_pair
from service.settings import DEFAULT_CHECKPOINT
from state_store.factory import make_store
from tests.support.service_process import start_service
from training.batches import IndexedStream
from training.data import read_edge_stream
from training.replay import StreamReplay

PREFIX = 3000
MIN_HISTORY = 8
QUERIES = 8


def row_of(event_id: str) -> int:
    return int(event_id.rsplit(":", 1)[1])


def test_explain_ranks_events_by_what_removing_them_does(redis_server, data_dir, tmp_path):
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=PREFIX + 300)
    data = IndexedStream.build(stream)
    model = load_checkpoint(DEFAULT_CHECKPOINT).model.eval()
    cfg = model.config
    rep = StreamReplay(model, data)
    rep.ingest(np.arange(PREFIX))
    nodes, per_node = rep.per_node_events(np.arange(PREFIX))
    history = dict(zip(nodes.tolist(), per_node, strict=True))
    index = {n: i for i, n in enumerate(data.node_ids)}

    # queries: later events of the stream whose endpoints both have some history
    t_now = float(stream.t[PREFIX - 1])
    queries = []
    for i in range(PREFIX, len(stream)):
        u, v = index[stream.src[i]], index[stream.dst[i]]
        if (
            stream.t[i] > t_now
            and u != v
            and MIN_HISTORY <= len(history.get(u, [])) <= 100
            and MIN_HISTORY <= len(history.get(v, [])) <= 100
        ):
            queries.append((u, v, float(stream.t[i])))
        if len(queries) == QUERIES:
            break
    assert len(queries) == QUERIES

    redis_server.flush()
    svc = start_service(
        tmp_path, {"DYGSERVE_REDIS_URL": redis_server.url, "DYGSERVE_LIVE_EVAL_RATE": "0"}
    )
    try:
        ServiceClient(svc.url, None).ingest(stream, np.arange(PREFIX), 1000)
        with svc.client() as c:
            answers = [
                c.get(
                    "/v1/score",
                    params={
                        "src": data.node_ids[u],
                        "dst": data.node_ids[v],
                        "t": t,
                        "explain": 100,
                    },
                ).json()
                for u, v, t in queries
            ]
            plain = c.get(
                "/v1/score", params={"src": data.node_ids[queries[0][0]], "dst": "x", "t": t_now}
            ).json()
            too_many = c.get("/v1/score", params={"src": "a", "dst": "b", "explain": 101})
            spec = c.get("/openapi.json").json()
    finally:
        svc.stop()
    assert plain["explanation"] is None
    assert too_many.status_code == 422
    # the OpenAPI document says what the parameter and a contribution mean
    params = {p["name"]: p for p in spec["paths"]["/v1/score"]["get"]["parameters"]}
    assert "contribute most to the logit" in params["explain"]["description"]
    event = spec["components"]["schemas"]["ExplainedEvent"]["properties"]
    assert "gradient x input" in event["contribution"]["description"]

    def logit(u: int, v: int, t: float, replace: dict[int, NodeStates] | None = None) -> float:
        """The logit as served, or with some nodes' states replaced (the pair features
        as served: they come from the neighbour lists, which the explanation holds fixed)."""
        replace = replace or {}
        tau = torch.tensor([t], dtype=torch.float64)
        iu, iv = torch.tensor([u]), torch.tensor([v])
        keys = torch.from_numpy(data.keys)
        with torch.no_grad():
            pair, ids = pair_inputs(
                cfg,
                keys[iu],
                keys[iv],
                tau,
                rep.neighbour_lists(np.array([u])),
                rep.neighbour_lists(np.array([v])),
                rep.states.n_events[iu],
                rep.states.n_events[iv],
                rep.states.t_last[iu],
                rep.states.t_last[iv],
            )
            su = replace.get(u, rep.states.select(iu))
            sv = replace.get(v, rep.states.select(iv))
            return float(model.score_states(su, sv, tau, pair, ids)[0])

    def rebuilt(events: list[NodeEvent]) -> NodeStates:
        ev, lengths = pad_events([events], cfg.edge_feature_dim)
        with torch.no_grad():
            states, _ = model.scan(NodeStates.initial(1, cfg), ev, lengths)
        return states

    for (u, v, t), answer in zip(queries, answers, strict=True):
        ex = answer["explanation"]
        assert ex["logit"] == pytest.approx(answer["logit"], abs=1e-4)
        full = logit(u, v, t)
        assert full == pytest.approx(answer["logit"], abs=1e-4)
        for side, node in (("src", u), ("dst", v)):
            e = ex[side]
            mine = history[node]
            assert e["node"] == data.node_ids[node]
            assert e["events_in_state"] == len(mine) == len(e["events"])
            assert sorted(row_of(x["event_id"]) for x in e["events"]) == [n.seq for n in mine]
            size = [abs(x["contribution"]) for x in e["events"]]
            assert size == sorted(size, reverse=True) and size[0] > size[-1]
            for x in e["events"]:
                row = row_of(x["event_id"])
                assert x["t"] == stream.t[row] < t
                assert x["counterpart"] == (
                    stream.dst[row] if x["role"] == "src" else stream.src[row]
                )
                assert data.node_ids[node] == (
                    stream.src[row] if x["role"] == "src" else stream.dst[row]
                )
            # the history is complete here: its terms rebuild the whole state
            assert abs(e["unexplained"]) < 1e-3 * max(1.0, abs(e["total"]))
            top, bottom = row_of(e["events"][0]["event_id"]), row_of(e["events"][-1]["event_id"])
            base = logit(u, v, t, {node: rebuilt(mine)})
            assert base == pytest.approx(full, abs=1e-4)
            without_top = logit(u, v, t, {node: rebuilt([n for n in mine if n.seq != top])})
            without_bottom = logit(u, v, t, {node: rebuilt([n for n in mine if n.seq != bottom])})
            assert abs(without_top - base) > abs(without_bottom - base), (side, u, v, t)
            # and the top event's first-order contribution has the sign of what it adds
            assert np.sign(e["events"][0]["contribution"]) == np.sign(base - without_top)


def test_a_model_without_state_explains_nothing(tmp_path):
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", DygMambaLinkModel(ModelConfig(use_state=False)))
    engine = Engine(ModelRuntime.load(tmp_path / "ck"), make_store(None))
    engine.ingest([{"src": "a", "dst": "b", "t": 1.0}, {"src": "b", "dst": "a", "t": 2.0}])
    ex = explain_pair(engine, "a", "b", 3.0, 5)
    assert ex.logit is None and ex.src.events == [] and ex.dst.events == []
    scored, _ = engine.score_pairs([("a", "b", 3.0)])
    assert np.isfinite(scored[0].logit)
