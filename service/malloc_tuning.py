"""Keep large freed blocks in the heap instead of returning them to the kernel.

glibc serves allocations above its mmap threshold (128 KiB to start with, adapting
upwards) with fresh mmap'd pages and unmaps them on free, so every multi-megabyte
torch temporary of an ingest batch (the decays and inputs of ~2,000 events are 8 MB
each) page-faults its memory in again, on every batch. Raising the mmap and trim
thresholds makes those blocks come from, and return to, the heap: the rank-major
advance of a UCI batch of 1,000 events went from ~32 ms to ~24 ms (measured in
``docs/BENCHMARKS.md`` runs). The price is that the process keeps its peak heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("dygserve")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc caps the mmap threshold at 32 MiB on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX):
# blocks above it (long cold rebuilds) are still mmap'd, which is fine.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Apply the thresholds; True if glibc took them (False elsewhere: musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not ok:
        log.info("mallopt refused the thresholds; large temporaries stay mmap'd")
    return ok
