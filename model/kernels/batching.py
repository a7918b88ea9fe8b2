"""Batches of nodes by history length, for the padded batch scan (cold rebuilds, backfill).

A padded scan costs rows x longest length, so rows of similar length go together:
sorted longest first and cut where the next row would push rows x (the group's
longest) past the budget. Each group holds at least one row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def length_batches(lengths: Sequence[int] | np.ndarray, max_padded_events: int) -> list[np.ndarray]:
    """Indices into ``lengths``, grouped: longest first, each group's row count times
    its longest length at most ``max_padded_events`` (or one row)."""
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lens, kind="stable")
    groups = []
    start = 0
    while start < len(order):
        longest = max(int(lens[order[start]]), 1)
        rows = max(1, max_padded_events // longest)
        groups.append(order[start : start + rows])
        start += rows
    return groups
