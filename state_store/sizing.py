"""How much memory a Redis store needs: a sizing rule from counts.

The per-item figures were measured on Redis 7.0 (jemalloc) with UCI events and the
bundled checkpoint (``MEMORY USAGE`` of every key, and the growth of ``used_memory``);
tests/state_store/test_memory_sizing.py checks the rule against a real server, and
docs/STATE_STORE.md ("Memory and sizing") explains it. Events without edge features;
each feature adds about its JSON length (~20 bytes) to every copy of an event.
"""

from __future__ import annotations

from dataclasses import dataclass

# One event in one node's history (a sorted-set member: the event's JSON, its score,
# the skiplist and dict entries). Every event is in two histories (one for a self-loop).
HISTORY_ENTRY_BYTES = 105
# One event in the global log (a list element: the JSON). The log keeps at least
# ``log_keep`` newest entries (default 100,000), plus everything still pending.
LOG_ENTRY_BYTES = 45
# One client event id in the dedupe window (``dedupe_ttl_s``, default 7 days).
EVENT_ID_BYTES = 106
# Per node, whatever the model: its field in the late-check hash and its history key.
NODE_BYTES = 110
# Per state blob (one per node and model version), on top of the blob itself: key name,
# dict and expiry entries, and the allocator rounding the value up to its size class.
STATE_OVERHEAD_BYTES = 100
STATE_ROUNDING = 1.15


@dataclass(frozen=True)
class SizingInput:
    events_in_histories: int  # sum over nodes of min(node's events, history_cap)
    log_entries: int  # min(events logged, log_keep) + pending
    event_ids: int  # client event ids received within the dedupe window
    nodes: int
    blob_bytes: int  # StateCodec.blob_size of the served checkpoint
    versions: int = 1  # model versions whose states are kept (a switch keeps both)


def state_bytes(blob_bytes: int) -> int:
    """Memory one state blob takes in Redis."""
    return int(blob_bytes * STATE_ROUNDING) + STATE_OVERHEAD_BYTES


def estimate_bytes(s: SizingInput) -> int:
    """The memory the store's keys take (add Redis's own ~1 MB and headroom)."""
    return (
        s.events_in_histories * HISTORY_ENTRY_BYTES
        + s.log_entries * LOG_ENTRY_BYTES
        + s.event_ids * EVENT_ID_BYTES
        + s.nodes * (NODE_BYTES + s.versions * state_bytes(s.blob_bytes))
    )
