"""``loadtests.gpu_profile``'s CPU-side pieces: the timed ingest that it runs on both
devices (here the CPU one), and the refusal without CUDA. The profile itself needs CUDA
and mamba-ssm's kernels: it runs on the device machine through ``deploy/gpu_check.sh``
(``PROFILE=1``), docs/GPU.md."""

from __future__ import annotations

import pytest
import torch

from loadtests.gpu_profile import _ingest_timings, floor_checkpoint, main
from model.checkpoint import BUNDLED_CHECKPOINT, load_checkpoint
from tests.support.store_model import uci_events


def test_timed_ingest_counts_the_advance_inside_each_batch():
    checkpoint = floor_checkpoint(load_checkpoint(BUNDLED_CHECKPOINT))
    assert checkpoint.config.delta_min > 0
    events = [
        {"src": e.src, "dst": e.dst, "t": e.t, "features": list(e.features)}
        for e in uci_events(600)
    ]
    whole, advance, engine = _ingest_timings(
        checkpoint, "cpu", [events[i : i + 200] for i in range(0, 600, 200)]
    )
    assert engine.runtime.kernels.path == "torch-cpu"
    assert len(whole) == len(advance) == 3
    assert all(0 < a <= w for a, w in zip(advance, whole, strict=True))
    stored = engine.store.read_states(engine.runtime.version, [events[-1]["src"]])
    assert stored[0] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="needs CUDA"):
        main(["--out", str(tmp_path)])
