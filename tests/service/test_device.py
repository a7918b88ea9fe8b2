"""Where the model runs: ``DYGSERVE_DEVICE`` (auto | cpu | cuda). The CPU path is
what this machine and CI run; the CUDA check runs only where torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from model.checkpoint import load_checkpoint
from service.engine import Engine, ModelRuntime, resolve_device
from service.settings import DEFAULT_CHECKPOINT
from state_store.factory import make_store
from tests.support.store_model import uci_events

HAS_CUDA = torch.cuda.is_available()


def test_auto_takes_cuda_only_when_torch_sees_it():
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("cpu").type == "cpu"
    if not HAS_CUDA:
        with pytest.raises(RuntimeError, match="no CUDA device"):
            resolve_device("cuda")


def _ingest_and_score(device: str) -> tuple[dict[str, bytes], list[float]]:
    engine = Engine(
        ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT), device=device), make_store(None)
    )
    events = [
        {"src": e.src, "dst": e.dst, "t": e.t, "features": list(e.features)}
        for e in uci_events(600)
    ]
    for lo in range(0, 600, 200):
        engine.ingest(events[lo : lo + 200])
    nodes = sorted({e["src"] for e in events} | {e["dst"] for e in events})
    blobs = dict(zip(nodes, engine.store.read_states(engine.runtime.version, nodes), strict=True))
    t = events[-1]["t"] + 10.0
    scored, _ = engine.score_pairs(
        [(a, b, t) for a, b in zip(nodes[:50], nodes[50:100], strict=True)]
    )
    return blobs, [p.logit for p in scored]


def test_cpu_device_serves():
    blobs, logits = _ingest_and_score("cpu")
    assert all(b is not None for b in blobs.values()) and all(abs(x) < 1e3 for x in logits)


@pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device on this machine (CPU torch build); runs on a GPU machine"
)
def test_cuda_matches_cpu():
    cpu_blobs, cpu_logits = _ingest_and_score("cpu")
    gpu_blobs, gpu_logits = _ingest_and_score("cuda")
    codec = ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT)).codec
    nodes = list(cpu_blobs)
    a = codec.decode_many([cpu_blobs[n] for n in nodes])
    b = codec.decode_many([gpu_blobs[n] for n in nodes])
    torch.testing.assert_close(a.h, b.h, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.last_seq, b.last_seq)
    assert max(abs(x - y) for x, y in zip(cpu_logits, gpu_logits, strict=True)) < 1e-4
