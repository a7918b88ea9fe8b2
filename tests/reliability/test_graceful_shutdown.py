"""SIGTERM while ingest requests are in flight: every request either completes (200,
and then its events are applied) or fails before anything of it is logged; nothing is
left half-applied (the pending set is empty the moment the process has exited, before
any restart); after a restart the clients re-drive the failed requests and every
acknowledged event is applied exactly once."""

from __future__ import annotations

import signal
import time

from .helpers import (
    Driver,
    batches_of,
    check_log_against_outcomes,
    read_whole_log,
    redis_store,
    serve,
    uci_events,
    verify_exactly_once,
    wait_until,
)

N_EVENTS = 10_000
BATCH = 250
CLIENTS = 6


def test_sigterm_during_in_flight_ingests(data_dir, redis_aof, runtime, tmp_path, figures):
    events = uci_events(data_dir, N_EVENTS)
    env = {"DYGSERVE_REDIS_URL": redis_aof.url}
    services = [serve(tmp_path / "first", env)]
    driver = Driver(batches_of(events, BATCH), services[0].url, n_clients=CLIENTS).start()
    store = redis_store(redis_aof.url)
    try:
        wait_until(
            lambda: driver.acked >= 8 and driver.in_flight >= 3, 120, 0.01, "requests in flight"
        )
        in_flight = driver.in_flight
        t_term = time.monotonic()
        services[0].proc.send_signal(signal.SIGTERM)  # senders keep sending during the shutdown
        rc = services[0].proc.wait(timeout=60)
        shutdown_s = time.monotonic() - t_term
        driver.up.clear()
        assert rc in (0, -signal.SIGTERM), rc  # uvicorn re-raises SIGTERM after a graceful stop

        # Nothing half-applied: the process finished what it had logged before exiting.
        assert store.pending(10) == [], "logged events left unapplied by a graceful shutdown"
        log_ids = {e.event_id for e in read_whole_log(store)}
        completed = [b for b in driver.batches if b.response is not None]
        completed_during_shutdown = [b for b in completed if b.acked_at > t_term]
        failed = [b for b in driver.batches if b.response is None and b.attempts]
        for b in completed:
            accepted = {e["event_id"] for i, e in enumerate(b.events) if i not in b.rejected}
            assert accepted <= log_ids
        for b in failed:
            touched = {e["event_id"] for e in b.events} & log_ids
            assert not touched, (
                f"batch {b.index} failed but {len(touched)} of its events were logged"
            )
        assert completed_during_shutdown or failed, "SIGTERM hit no request"

        services.append(serve(tmp_path / "second", env))
        driver.url = services[1].url
        driver.up.set()
        driver.join(300)
        log = read_whole_log(store)
        counted = check_log_against_outcomes(log, driver.batches)
        checked = verify_exactly_once(redis_aof.url, services[1].url, runtime)
        figures.update(
            driver.outcome_summary(),
            requests_in_flight_at_sigterm=in_flight,
            requests_completed_during_shutdown=len(completed_during_shutdown),
            requests_failed_before_logging=len(failed),
            shutdown_s=round(shutdown_s, 2),
            exit_code=rc,
            events_logged=counted["logged"],
            events_rejected_late=counted["rejected"],
            events_lost=0,
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        driver.up.set()
        store.close()
        for svc in services:
            svc.stop()
