"""The allocator tuning the service applies at start (``service.malloc_tuning``)."""

from __future__ import annotations

import platform

import pytest
import torch

from service.malloc_tuning import keep_freed_memory


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)
def test_glibc_takes_the_thresholds_and_torch_still_works():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent
    for _ in range(3):  # big temporaries allocated and freed again come out right
        x = torch.full((2048, 1024), 2.0)
        assert float((x * x).sum()) == 4.0 * 2048 * 1024
