"""``dygserve backfill``: build the states of a (new) model version from the log,
instead of letting every node rebuild lazily on its first query."""

from __future__ import annotations

from pathlib import Path

from state_store.applier import ApplyStats, apply_nodes
from state_store.factory import make_store

from .engine import ModelRuntime
from .settings import DEFAULT_CHECKPOINT


def backfill(checkpoint: str | Path | None, redis_url: str, batch: int = 1000) -> ApplyStats:
    runtime = ModelRuntime.load(Path(checkpoint) if checkpoint else DEFAULT_CHECKPOINT)
    store = make_store(redis_url)
    stats = ApplyStats()
    try:
        seen: set[str] = set()
        after = -1
        while True:
            page = store.read_log(after, batch)
            if not page:
                return stats
            after = page[-1].seq
            nodes = [n for e in page for n in (e.src, e.dst) if n not in seen]
            seen.update(nodes)
            if nodes:
                stats.add(
                    apply_nodes(
                        store, runtime.version, list(dict.fromkeys(nodes)), runtime.advance_blobs
                    )
                )
    finally:
        store.close()
