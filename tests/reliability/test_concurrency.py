"""No lost update: 8 concurrent clients on overlapping nodes (UCI's hubs appear in
almost every batch) against one service with 2 worker processes on one Redis. Each
node's events_applied must equal the accepted events touching it, and the states
must equal a sequential replay of the stored log."""

from __future__ import annotations

from pathlib import Path

from .helpers import (
    Driver,
    batches_of,
    check_log_against_outcomes,
    read_whole_log,
    redis_store,
    serve,
    uci_events,
    verify_exactly_once,
)

N_EVENTS = 6000
BATCH = 60
CLIENTS = 8


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, ValueError):
                continue
    return out


def overlapping_concurrent_pairs(driver: Driver) -> int:
    """Pairs of batches that were in flight at the same time and share a node."""
    spans = [
        (b.first_sent, b.acked_at, {n for e in b.events for n in (e["src"], e["dst"])})
        for b in driver.batches
    ]
    n = 0
    for i, (s1, e1, n1) in enumerate(spans):
        for s2, e2, n2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1 and n1 & n2:
                n += 1
    return n


def test_two_workers_eight_clients_lose_no_update(data_dir, redis_aof, runtime, tmp_path, figures):
    events = uci_events(data_dir, N_EVENTS)
    svc = serve(tmp_path / "svc", {"DYGSERVE_REDIS_URL": redis_aof.url, "DYGSERVE_WORKERS": "2"})
    try:
        workers = children(svc.proc.pid)  # uvicorn's worker processes (spawned children)
        before = {p: cpu_ticks(p) for p in workers}
        driver = Driver(
            batches_of(events, BATCH), svc.url, n_clients=CLIENTS, keepalive=False
        ).start()
        driver.join(300)
        assert set(driver.statuses) == {"200"}, driver.statuses
        # Both workers served: each took a fair share of the children's CPU (a share,
        # not seconds: the faster ingest gets, the fewer seconds the same work takes).
        used = {p: cpu_ticks(p) - before[p] for p in workers}
        total = sum(used.values())
        assert total >= 20, f"the workers did almost no work: {used} ticks"
        busy = [p for p, ticks in used.items() if ticks >= 0.25 * total]
        assert len(busy) >= 2, f"not both workers served requests: {used} ticks"
        log = read_whole_log(redis_store(redis_aof.url))
        counted = check_log_against_outcomes(log, driver.batches)
        checked = verify_exactly_once(redis_aof.url, svc.url, runtime)
        pairs = overlapping_concurrent_pairs(driver)
        assert pairs > 0
        figures.update(
            driver.outcome_summary(),
            worker_processes_busy=len(busy),
            concurrent_overlapping_batch_pairs=pairs,
            events_logged=counted["logged"],
            events_rejected_late=counted["rejected"],
            nodes=checked["nodes"],
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        svc.stop()
