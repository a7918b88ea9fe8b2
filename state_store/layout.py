"""The store's layout record: how many log partitions it was written with.

``P:meta`` (a hash, ``partitions`` field) is claimed by the first replica that starts
(``HSETNX``) and checked by every later one: the partition of a node is a function
of ``P``, so two replicas with different ``P`` would log one node's events in two
places and break its order. A replica with another ``P`` refuses to start.

A store written before the meta key existed holds the single-slot layout (its
counter is ``P:{P:log}:seq``): that is ``P = 1``, and a replica with ``P > 1``
refuses it rather than start an empty partitioned log beside the old one.
"""

from __future__ import annotations

from typing import Any


class LayoutMismatch(RuntimeError):
    """The store was written with another number of partitions (not a 503: the
    replica's configuration is wrong, and retrying cannot help)."""


def meta_key(prefix: str) -> bytes:
    return f"{prefix}:meta".encode()


def claim_partitions(client: Any, prefix: str, partitions: int, legacy_counter: bytes) -> int:
    """Record ``partitions`` in a new store, or check it against the recorded one.
    Returns the recorded count; raises ``LayoutMismatch`` when it differs."""
    key = meta_key(prefix)
    stored = client.execute_command("HGET", key, b"partitions")
    if stored is None:
        if partitions > 1 and client.execute_command("EXISTS", legacy_counter):
            raise LayoutMismatch(
                f"the store (key prefix {prefix!r}) holds a log in the single-slot layout "
                f"(one partition, written before the partitioned log), and this replica is "
                f"configured with {partitions} partitions (DYGSERVE_STORE__PARTITIONS). Start "
                "it with the setting unset (or 1), or replay the stream into a new store or "
                "key prefix: converting a single-slot store is not supported "
                "(docs/STATE_STORE.md, 'Migration')."
            )
        client.execute_command("HSETNX", key, b"partitions", str(partitions).encode())
        stored = client.execute_command("HGET", key, b"partitions")
    recorded = int(stored)
    if recorded != partitions:
        raise LayoutMismatch(
            f"the store (key prefix {prefix!r}) was written with {recorded} log partition(s) "
            f"and this replica is configured with {partitions} (DYGSERVE_STORE__PARTITIONS"
            f"{'' if partitions > 1 else ' unset or 1'}). The number of partitions is fixed "
            f"per deployment: set DYGSERVE_STORE__PARTITIONS={recorded}."
        )
    return recorded


def recorded_partitions(client: Any, prefix: str) -> int | None:
    """The partition count a store records, or None (a new or single-slot store)."""
    stored = client.execute_command("HGET", meta_key(prefix), b"partitions")
    return None if stored is None else int(stored)
