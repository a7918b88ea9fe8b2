"""Where the model runs: ``DYGSERVE_DEVICE`` (auto | cpu | cuda). The CPU path is
what this machine and CI run; the CUDA check runs only where torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from model.checkpoint import LoadedCheckpoint, load_checkpoint
from model.kernels.ops import load_mamba_ops
from model.link_model import DygMambaLinkModel
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


def _ingest_and_score(
    device: str, checkpoint: LoadedCheckpoint | None = None
) -> tuple[dict[str, bytes], list[float]]:
    runtime = ModelRuntime(checkpoint or load_checkpoint(DEFAULT_CHECKPOINT), device=device)
    engine = Engine(runtime, make_store(None))
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


@pytest.mark.gpu
def test_cuda_matches_cpu():
    """The bundled checkpoint on CUDA against the CPU (mamba-ssm's kernels where built, else
    torch's rank-major path on CUDA tensors)."""
    cpu_blobs, cpu_logits = _ingest_and_score("cpu")
    gpu_blobs, gpu_logits = _ingest_and_score("cuda")
    codec = ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT)).codec
    nodes = list(cpu_blobs)
    a = codec.decode_many([cpu_blobs[n] for n in nodes])
    b = codec.decode_many([gpu_blobs[n] for n in nodes])
    torch.testing.assert_close(a.h, b.h, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.last_seq, b.last_seq)
    assert max(abs(x - y) for x, y in zip(cpu_logits, gpu_logits, strict=True)) < 1e-4


def _with_step_floor() -> LoadedCheckpoint:
    """The bundled weights with new checkpoints' step floor (the kernels need one)."""
    ck = load_checkpoint(DEFAULT_CHECKPOINT)
    model = DygMambaLinkModel(ck.config.with_updates(delta_min=1e-4)).eval()
    model.load_state_dict(ck.model.state_dict())
    return LoadedCheckpoint(ck.path, model.config, model, "0123456789abcdef", {})


def test_cpu_runtime_takes_rank_major():
    rt = ModelRuntime(_with_step_floor(), device="cpu")
    assert (rt.kernels.path, rt.kernels.reason) == ("torch-cpu", "no CUDA device")


@pytest.mark.gpu
def test_cuda_with_a_step_floor_runs_the_kernels_and_matches_cpu():
    """Ingest (selective_state_update per rank) and cold rebuilds (selective_scan_fn) in
    the service's runtime on CUDA, against the CPU path."""
    ops, why = load_mamba_ops()
    if ops is None:
        pytest.skip(f"mamba-ssm's kernels are not built here: {why}")
    assert ModelRuntime(_with_step_floor(), device="cuda").kernels.path == "mamba-ssm"
    cpu_blobs, cpu_logits = _ingest_and_score("cpu", _with_step_floor())
    gpu_blobs, gpu_logits = _ingest_and_score("cuda", _with_step_floor())
    codec = ModelRuntime(_with_step_floor()).codec
    nodes = list(cpu_blobs)
    a = codec.decode_many([cpu_blobs[n] for n in nodes])
    b = codec.decode_many([gpu_blobs[n] for n in nodes])
    assert float((a.h - b.h).abs().max()) <= 1e-4
    assert torch.equal(a.last_seq, b.last_seq)
    assert max(abs(x - y) for x, y in zip(cpu_logits, gpu_logits, strict=True)) <= 1e-4
