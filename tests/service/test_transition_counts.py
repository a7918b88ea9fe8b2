"""Serving a model with transition counts (model/transition_counts.py), whose apply
reads where each event's other endpoint was just before from the log's histories
(docs/STATE_STORE.md, "Transition counts"). The train/serve parity of such a model is
in test_train_serve_parity.py."""

from __future__ import annotations

import pytest

from model.node_state import StateCodec
from service.engine import Engine, ModelRuntime
from state_store.factory import make_store
from state_store.layout import LayoutMismatch
from tests.service.conftest import make_checkpoint
from tests.service.test_cold_equals_warm import ingest, scores
from tests.support.service_process import start_service
from training.data import read_edge_stream


@pytest.fixture(scope="module")
def counting_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("counting") / "ck"
    version = make_checkpoint(path, seed=3, transition_buckets=16)
    return path, version


def test_dropped_states_are_rebuilt_with_their_counts(
    redis_server, counting_checkpoint, data_dir, tmp_path
):
    """Cold equals warm: a rebuild asks the log the same questions for every event of
    the node's history, so the records, and the scores, come back as they were."""
    path, version = counting_checkpoint
    stream = read_edge_stream(data_dir / "uci", limit=2000)
    redis_server.flush()
    svc = start_service(
        tmp_path, {"DYGSERVE_CHECKPOINT": str(path), "DYGSERVE_REDIS_URL": redis_server.url}
    )
    try:
        with svc.client() as client:
            ingest(client, stream, 0, 2000)
            t = float(stream.t[-1]) + 1.0
            pairs = [(stream.src[i], stream.dst[i], t) for i in range(0, 2000, 7)]
            warm = scores(client, pairs)
            nodes = sorted({p[0] for p in pairs} | {p[1] for p in pairs})
            store = make_store(redis_server.url)
            try:
                codec = StateCodec(ModelRuntime.load(path).config, version)
                warm_counts = codec.decode_with_neighbours(store.read_states(version, nodes))[1]
                assert warm_counts.transitions is not None
                assert warm_counts.transitions.totals().sum() > 1000  # type: ignore[union-attr]
                with redis_server.client() as r:
                    r.delete(*list(r.scan_iter(match="dygserve:{n:*}:s:*")))
                cold = scores(client, pairs)  # rebuilt from the histories
                rebuilt = codec.decode_with_neighbours(store.read_states(version, nodes))[1]
            finally:
                store.close()
    finally:
        svc.stop()
    assert max(abs(a - b) for a, b in zip(warm, cold, strict=True)) <= 1e-4
    assert (rebuilt.transitions.counts == warm_counts.transitions.counts).all()  # type: ignore[union-attr]


def test_a_partitioned_log_refuses_the_model(redis_server, counting_checkpoint, tmp_path):
    """Its copies are numbered per partition, so it cannot say where a node was just
    before an event: a replica refuses such a model rather than count wrong (a model
    without the counts starts there as before)."""
    path, _ = counting_checkpoint
    make_checkpoint(tmp_path / "plain", seed=3)
    redis_server.flush()
    store = make_store(redis_server.url, partitions=4)
    try:
        with pytest.raises(LayoutMismatch, match="Transition counts"):
            Engine(ModelRuntime.load(path), store)
        engine = Engine(ModelRuntime.load(tmp_path / "plain"), store)
        assert engine.runtime.log is store
    finally:
        store.close()


def test_answers_in_hand_equal_the_logs(data_dir):
    """``counterparts_previous`` answers most events from the nodes advanced in the same
    call (their new events, their blobs' newest list entries) and asks the log only for
    the rest. Whatever is in hand, the answers are the log's: here every node of a
    UCI slice (with self-loops added) is advanced at once from its blob after a random
    cut of its history, with some nodes left out, some already past the cut, and cold
    ones from nothing."""
    import random

    from model.node_ids import node_key
    from model.transition_counts import PAD
    from service.engine import counterparts_previous
    from state_store.base import NewEvent
    from state_store.common import other_endpoint
    from state_store.memory import InMemoryStore

    stream = read_edge_stream(data_dir / "uci", limit=3000)
    store = InMemoryStore()
    events = [
        NewEvent(str(s), str(d), float(t))
        for s, d, t in zip(stream.src, stream.dst, stream.t, strict=True)
    ]
    events += [NewEvent(e.src, e.src, e.t) for e in events[::97]]  # self-loops
    events.sort(key=lambda e: e.t)
    store.append_events(events)
    nodes = sorted({e.src for e in events} | {e.dst for e in events})
    histories = dict(zip(nodes, store.read_histories(nodes), strict=True))
    rng = random.Random(0)
    here, watermarks, latest, new_events = [], [], [], []
    for n in nodes:
        if rng.random() < 0.2:
            continue  # not in this call: its partners ask the log
        h = histories[n]
        cut = rng.randrange(len(h) + 1) if rng.random() < 0.7 else 0  # 30% cold
        applied, new = h[:cut], h[cut:]
        here.append(n)
        watermarks.append(applied[-1].seq if applied else -1)
        latest.append(node_key(other_endpoint(applied[-1], n)) if applied else PAD)
        new_events.append(new)
    got = counterparts_previous(store, here, new_events, watermarks, latest)
    asked = 0
    for n, new, row in zip(here, new_events, got, strict=True):
        expected = []
        for e in new:
            found = store.neighbours_before([other_endpoint(e, n)], [e.seq])[0]
            key = PAD if found is None else node_key(found)
            expected += [key, key] if e.src == e.dst else [key]
            asked += 1
        assert row == expected, n
    assert asked > 2000 and sum(k != PAD for row in got for k in row) > 1000


def test_a_reload_to_the_model_on_a_partitioned_log_is_refused(redis_server, tmp_path):
    """Over HTTP: a replica on the partitioned log keeps serving what it serves and
    answers 422 with the reason, and the store's serving version does not move."""
    make_checkpoint(tmp_path / "models" / "plain", seed=3)
    make_checkpoint(tmp_path / "models" / "counting", seed=3, transition_buckets=16)
    redis_server.flush()
    svc = start_service(
        tmp_path,
        {
            "DYGSERVE_CHECKPOINT": str(tmp_path / "models" / "plain"),
            "DYGSERVE_REDIS_URL": redis_server.url,
            "DYGSERVE_STORE__PARTITIONS": "4",
        },
    )
    try:
        with svc.client() as client:
            before = client.get("/v1/model").json()["model_version"]
            r = client.post("/v1/admin/reload", json={"checkpoint": "counting"})
            assert r.status_code == 422 and "transition counts" in r.text, r.text
            assert client.get("/v1/model").json()["model_version"] == before
    finally:
        svc.stop()
