"""``dygserve backfill``: build the states of a (new) model version from the stored
histories, instead of letting every node rebuild lazily on its first query.

Every node of the log is read once; nodes go in windows of ``window`` (one history read
each), and within a window in batches of similar history length
(``model.kernels.batching.length_batches``), so the batch scan pads little: on CUDA with
mamba-ssm, one ``selective_scan_fn`` per batch (``model.kernels``); elsewhere torch's
rank-major path. Each batch is written with the applier's compare-and-set
(``apply_nodes``), so a backfill running beside a live service never overwrites a newer
state. A progress bar counts nodes and shows events/s; the report gives the total rate
and the time spent in the model (decode, advance, encode) apart from the store.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from model.kernels.batching import length_batches
from state_store.applier import ApplyStats, JustLogged, apply_nodes
from state_store.base import LoggedEvent, StateStore
from state_store.factory import make_store_as_recorded

from .engine import ModelRuntime
from .settings import DEFAULT_CHECKPOINT

LOG_PAGE = 10_000


@dataclass
class BackfillReport:
    stats: ApplyStats = field(default_factory=ApplyStats)
    nodes: int = 0  # nodes seen in the log
    seconds: float = 0.0  # wall time, store included
    model_seconds: float = 0.0  # inside the advance: decode, model, encode
    kernel_path: str = ""

    @property
    def events_per_s(self) -> float:
        return self.stats.events_applied / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        model_rate = self.stats.events_applied / self.model_seconds if self.model_seconds else 0.0
        return (
            f"backfilled {self.stats.events_applied:,} events of {self.stats.nodes_applied:,}"
            f" nodes ({self.nodes:,} in the log) in {self.seconds:.2f} s: {self.events_per_s:,.0f}"
            f" events/s; model {self.model_seconds:.2f} s ({model_rate:,.0f} events/s) on"
            f" {self.kernel_path}; {self.stats.conflicts} conflicts"
        )


def log_nodes(store: StateStore) -> list[str]:
    """Every node of the log, in order of first appearance."""
    seen: dict[str, None] = {}
    after = -1
    while page := store.read_log(after, LOG_PAGE):
        after = page[-1].seq
        for e in page:
            seen[e.src] = None
            seen[e.dst] = None
    return list(seen)


def backfill_store(
    runtime: ModelRuntime, store: StateStore, window: int = 2000, progress: bool = True
) -> BackfillReport:
    """Bring every logged node's state of ``runtime.version`` up to date with its history."""
    report = BackfillReport(kernel_path=runtime.kernels.path)
    start = time.perf_counter()

    def advance(
        nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        t0 = time.perf_counter()
        try:
            return runtime.advance_blobs(nodes, blobs, new_events, log=store)
        finally:
            report.model_seconds += time.perf_counter() - t0

    nodes = log_nodes(store)
    report.nodes = len(nodes)
    bar = tqdm(total=len(nodes), unit="node", disable=not progress, file=sys.stderr)
    try:
        for lo in range(0, len(nodes), window):
            chunk = nodes[lo : lo + window]
            histories = store.read_histories(chunk)
            for group in length_batches(
                [len(h) for h in histories], runtime.kernels.max_padded_events
            ):
                batch = [chunk[i] for i in group.tolist() if histories[i]]
                if batch:
                    # The histories just read stand in for the applier's own read: for a
                    # node with no blob they are its whole input, for one with a blob the
                    # applier keeps the events after its watermark.
                    known = {chunk[i]: JustLogged(-1, histories[i]) for i in group.tolist()}
                    report.stats.add(
                        apply_nodes(store, runtime.version, batch, advance, known=known)
                    )
                bar.update(len(group))
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"{report.stats.events_applied / elapsed:,.0f} events/s")
    finally:
        bar.close()
    report.seconds = time.perf_counter() - start
    return report


def backfill(
    checkpoint: str | Path | None,
    redis_url: str,
    batch: int = 2000,
    device: str = "auto",
    progress: bool = True,
) -> BackfillReport:
    runtime = ModelRuntime.load(
        Path(checkpoint) if checkpoint else DEFAULT_CHECKPOINT, device=device
    )
    store = make_store_as_recorded(redis_url)  # a partitioned store as it is recorded
    try:
        return backfill_store(runtime, store, window=batch, progress=progress)
    finally:
        store.close()
