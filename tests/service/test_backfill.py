"""``dygserve backfill`` on a real Redis: the states it builds from the stored histories,
in batches by history length, equal the states a warm ingest committed."""

from __future__ import annotations

from pathlib import Path

import torch

from model.checkpoint import LoadedCheckpoint, load_checkpoint
from model.config import ModelConfig
from model.kernels.batching import length_batches
from model.kernels.dispatch import KernelAdvancer
from model.kernels.ops import TWIN_OPS
from model.link_model import DygMambaLinkModel
from service.backfill import backfill, backfill_store
from service.cli import main
from service.engine import Engine, ModelRuntime
from state_store.factory import make_store
from tests.support.store_model import max_state_diff
from training.data import read_edge_stream

N_EVENTS = 3000


def _ingest(engine: Engine, data_dir, n: int = N_EVENTS) -> list[str]:
    stream = read_edge_stream(data_dir / "uci", limit=n)
    events = [
        {"src": str(s), "dst": str(d), "t": float(t), "features": [0.1, -0.2]}
        for s, d, t in zip(stream.src, stream.dst, stream.t, strict=True)
    ]
    for lo in range(0, n, 500):
        engine.ingest(events[lo : lo + 500])
    return sorted({e["src"] for e in events} | {e["dst"] for e in events})


def test_backfill_rebuilds_the_warm_states(redis_server, models_dir, data_dir, capsys):
    redis_server.flush()
    checkpoint = models_dir / "a"
    store = make_store(redis_server.url)
    try:
        runtime = ModelRuntime(load_checkpoint(checkpoint))
        nodes = _ingest(Engine(runtime, store), data_dir)
        warm = store.read_states(runtime.version, nodes)
        assert all(b is not None for b in warm)
        with redis_server.client() as r:  # drop every state: only the log and histories stay
            r.delete(*r.scan_iter(match="dygserve:{n:*}:s:*"))
        assert all(b is None for b in store.read_states(runtime.version, nodes))

        argv = ["backfill", "--checkpoint", str(checkpoint), "--redis-url", redis_server.url]
        assert main([*argv, "--batch", "300", "--device", "cpu"]) == 0
        out = capsys.readouterr()
        assert "events/s" in out.out and "torch-cpu" in out.out
        assert "node" in out.err  # the progress bar (tqdm writes to stderr)

        rebuilt = store.read_states(runtime.version, nodes)
        assert max_state_diff(runtime.codec, warm, rebuilt) <= 1e-5
    finally:
        store.close()


def test_backfill_report_and_a_second_run_changes_nothing(redis_server, models_dir, data_dir):
    redis_server.flush()
    store = make_store(redis_server.url)
    try:
        warm_rt = ModelRuntime(load_checkpoint(models_dir / "b"))
        nodes = _ingest(Engine(warm_rt, store), data_dir, 1500)
        warm = store.read_states(warm_rt.version, nodes)
        # The same weights under another version key: nothing stored for it yet.
        ck = load_checkpoint(models_dir / "b")
        fresh = ModelRuntime(LoadedCheckpoint(ck.path, ck.config, ck.model, "f" * 16, {}))
        report = backfill_store(fresh, store, window=200, progress=False)
        assert report.nodes == len(nodes) and report.stats.nodes_applied == len(nodes)
        assert report.stats.cold_rebuilds == len(nodes)
        assert report.stats.events_applied == 2 * 1500 - sum(
            1 for s, d in _pairs(data_dir, 1500) if s == d
        )
        assert report.events_per_s > 0 and 0 < report.model_seconds <= report.seconds
        a = warm_rt.codec.decode_many(warm)  # type: ignore[arg-type]
        b = fresh.codec.decode_many(store.read_states(fresh.version, nodes))  # type: ignore[arg-type]
        torch.testing.assert_close(b.h, a.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.conv, a.conv, rtol=1e-5, atol=1e-5)
        assert torch.equal(a.last_seq, b.last_seq) and torch.equal(a.n_events, b.n_events)
        again = backfill_store(fresh, store, window=200, progress=False)
        assert again.stats.nodes_applied == 0 and again.stats.events_applied == 0
    finally:
        store.close()


def _pairs(data_dir, n):
    s = read_edge_stream(data_dir / "uci", limit=n)
    return list(zip(s.src, s.dst, strict=True))


def test_backfill_entry_point_takes_a_url(redis_server, models_dir):
    redis_server.flush()  # an empty log: nothing to do, but the store is reached
    report = backfill(models_dir / "a", redis_server.url, device="cpu", progress=False)
    assert report.nodes == 0 and report.stats.events_applied == 0


def test_length_batches_group_similar_histories():
    lengths = [5, 100, 0, 7, 98, 3, 1]
    groups = length_batches(lengths, max_padded_events=200)
    assert sorted(int(i) for g in groups for i in g) == list(range(7))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * longest <= 200
    assert [lengths[i] for i in groups[0]] == [100, 98]  # the long ones together
    assert [len(g) for g in length_batches([10**6, 1], 10)] == [1, 1]  # one row at least
    assert length_batches([], 10) == []


def test_backfill_through_the_kernel_layout_equals_warm_ingest(redis_server, data_dir):
    """The GPU backfill's flow (cold nodes by length -> padded batch scan in the kernels'
    layout) run with the CPU twin of the kernels, against states a warm ingest committed
    with torch's rank-major path. The model has the step floor the kernels need."""
    redis_server.flush()
    store = make_store(redis_server.url)
    try:
        torch.manual_seed(3)
        model = DygMambaLinkModel(ModelConfig(edge_feature_dim=2, d_model=16, n_layers=2)).eval()
        warm_rt = ModelRuntime(LoadedCheckpoint(Path("."), model.config, model, "a" * 16, {}))
        nodes = _ingest(Engine(warm_rt, store), data_dir, 2000)
        twin_rt = ModelRuntime(LoadedCheckpoint(Path("."), model.config, model, "b" * 16, {}))
        twin_rt.kernels = KernelAdvancer(
            model, torch.device("cpu"), TWIN_OPS, "twin", "test", max_padded_events=20_000
        )
        report = backfill_store(twin_rt, store, window=500, progress=False)
        assert report.kernel_path == "twin" and report.stats.cold_rebuilds == len(nodes)
        a = warm_rt.codec.decode_many(store.read_states(warm_rt.version, nodes))  # type: ignore[arg-type]
        b = twin_rt.codec.decode_many(store.read_states(twin_rt.version, nodes))  # type: ignore[arg-type]
        torch.testing.assert_close(b.h, a.h, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.conv, a.conv, rtol=1e-5, atol=1e-5)
        assert torch.equal(a.t_last, b.t_last) and torch.equal(a.last_seq, b.last_seq)
    finally:
        store.close()
