"""Self-loops (u, u) are two entries for u, source then destination, in the service
exactly as in the trainer and evaluator (Can. Parl. has hundreds of them)."""

from __future__ import annotations

import numpy as np

from model.checkpoint import load_checkpoint
from service.engine import Engine, ModelRuntime
from state_store.factory import make_store
from training.batches import IndexedStream
from training.data import EdgeStream
from training.replay import StreamReplay


def test_service_scores_equal_the_evaluator_with_self_loops(models_dir):
    rng = np.random.default_rng(0)
    n = 300
    src = rng.integers(0, 12, n).astype(str).astype(object)
    dst = rng.integers(0, 12, n).astype(str).astype(object)
    dst[::7] = src[::7]  # plenty of self-loops
    stream = EdgeStream(
        src,
        dst,
        np.sort(rng.random(n) * 100.0),
        rng.standard_normal((n, 2)).astype(np.float32),
        None,
        ("a", "b"),
    )
    assert (stream.src == stream.dst).sum() > 30

    ck = load_checkpoint(models_dir / "a")
    data = IndexedStream.build(stream)
    offline = StreamReplay(ck.model, data)
    engine = Engine(ModelRuntime(ck), make_store(None))
    ids = list(data.node_ids)
    pairs = [(a, b) for a in ids for b in ids]
    for lo in range(0, n, 50):
        rows = np.arange(lo, lo + 50)
        offline.ingest(rows)
        engine.ingest(
            [
                {
                    "src": stream.src[i],
                    "dst": stream.dst[i],
                    "t": float(stream.t[i]),
                    "features": stream.features[i].tolist(),
                }
                for i in rows
            ]
        )
        t = float(stream.t[rows[-1]]) + 0.5
        qs = np.array([ids.index(a) for a, _ in pairs])
        qd = np.array([ids.index(b) for _, b in pairs])
        want = offline.score(qs, qd, np.full(len(pairs), t))
        got, _ = engine.score_pairs([(a, b, t) for a, b in pairs])
        assert max(abs(g.logit - w) for g, w in zip(got, want, strict=True)) <= 1e-4
