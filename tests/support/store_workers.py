"""Writer processes for the state-store exactly-once tests.

Importable by name, so multiprocessing 'spawn' children (and ``python -m``) can run
them: each writer logs a batch of events, then applies it (``apply_logged``), with
``maybe_crash("after_log")`` in between, as the service does.

    python -m tests.support.store_workers --url URL --rows 0:200 --batch 50 [--partitions 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from state_store.applier import ApplyStats, apply_logged, logged_events, redrive
from state_store.base import NewEvent, StoreUnavailable
from state_store.factory import make_store
from state_store.faults import maybe_crash

_pool_state: dict[str, Any] = {}


def log_then_apply(
    store: Any, advance: Any, batches: list[list[NewEvent]], version: str, retries: int = 0
) -> dict[str, Any]:
    """Log each batch, then apply it. With ``retries``, a batch that meets a
    ``StoreUnavailable`` (e.g. nodes held by a copy in doubt that a killed writer left)
    is retried with the same ids after a re-drive, as a client and the service would."""
    accepted = duplicates = rejected = retried = 0
    stats = ApplyStats()
    for batch in batches:
        for attempt in range(retries + 1):
            try:
                res = store.append_events(batch)
                maybe_crash("after_log")
                logged = logged_events(batch, res)
                stats.add(apply_logged(store, version, logged, advance))
                break
            except StoreUnavailable:
                if attempt == retries:
                    raise
                retried += 1
                time.sleep(0.05 * (attempt + 1))
                try:  # applies what the failed attempt logged; decides old copies in doubt
                    stats.add(redrive(store, version, advance))
                except StoreUnavailable:
                    pass
        if retries:  # a writer's ids are its own: a duplicate here is an earlier attempt's
            accepted += len(batch) - len(res.late)
        else:
            accepted += sum(s is not None for s in res.seqs)  # events, not partition copies
            duplicates += len(res.duplicates)
        rejected += len(res.late)
    return {
        "accepted": accepted,
        "duplicates": duplicates,
        "rejected": rejected,
        "retried": retried,
        "stats": stats.__dict__,
    }


def pool_init(barrier: Any) -> None:
    """Pool initializer: one torch thread, the model built once per process."""
    torch.set_num_threads(1)
    from tests.support.store_model import ModelAdvance, build_model

    _pool_state["barrier"] = barrier
    _pool_state["advance"] = ModelAdvance(build_model())


def pool_writer(task: tuple[str | None, dict[str, Any], list[list[NewEvent]]]) -> dict[str, Any]:
    """One writer: wait until all writers are ready (so they truly overlap), then go."""
    from tests.support.store_model import VERSION

    url, options, batches = task
    _pool_state["barrier"].wait(timeout=120)
    store = make_store(url, **options)
    try:
        t0 = time.perf_counter()
        out = log_then_apply(store, _pool_state["advance"], batches, VERSION)
        out["seconds"] = time.perf_counter() - t0
        out["pid"] = os.getpid()
        return out
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """A writer as its own process (the crash test runs it with DYGSERVE_FAULT set)."""
    torch.set_num_threads(1)
    from tests.support.store_model import VERSION, ModelAdvance, build_model, uci_events

    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--rows", default="0:100", help="start:stop rows of UCI")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=None, help="log partitions (P > 1)")
    ap.add_argument("--retries", type=int, default=0, help="retries of a batch that gets a 503")
    ap.add_argument("--doubt-timeout", type=float, default=10.0, help="doubt_timeout_s")
    args = ap.parse_args(argv)
    start, stop = (int(x) for x in args.rows.split(":"))
    events = uci_events(stop)[start:stop]
    batches = [events[i : i + args.batch] for i in range(0, len(events), args.batch)]
    options: dict[str, Any] = {"partitions": args.partitions}
    if args.partitions:
        options["doubt_timeout_s"] = args.doubt_timeout
    store = make_store(args.url, **options)
    out = log_then_apply(store, ModelAdvance(build_model()), batches, VERSION, args.retries)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
