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
