"""Crashes (DESIGN invariant 5): the service is killed while clients ingest, restarted
on the same Redis (AOF, appendfsync always), and the clients retry what was not
acknowledged with the same event ids. Every logged event must then be applied exactly
once and the states must equal a clean sequential replay of the stored log.

* ``test_sigkill_under_eight_concurrent_clients``: 50,000 UCI events, 8 client threads
  fed by one ordered sequencer (batches of 500 in time order), SIGKILL at ~35%.
* ``test_crash_between_logging_and_applying``: the precise window, with
  ``DYGSERVE_FAULT=after_log`` (the service exits right after logging a batch).
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

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

N_EVENTS = 50_000
BATCH = 500
CLIENTS = 8


def test_sigkill_under_eight_concurrent_clients(data_dir, redis_aof, runtime, tmp_path, figures):
    events = uci_events(data_dir, N_EVENTS)
    env = {"DYGSERVE_REDIS_URL": redis_aof.url}
    services = [serve(tmp_path / "first", env)]
    t_start = time.monotonic()
    driver = Driver(batches_of(events, BATCH), services[0].url, n_clients=CLIENTS).start()
    store = redis_store(redis_aof.url)
    try:
        # Kill while events are logged but not applied (pending), so the restart's
        # re-drive has work to do; the count read after the kill is asserted below.
        wait_until(
            lambda: (
                driver.acked >= 0.35 * len(driver.batches)
                and driver.in_flight >= 4
                and store.pending(1)
            ),
            240,
            0.01,
            "35% of the batches acknowledged, requests in flight, events pending",
        )
        driver.up.clear()  # senders whose request fails now wait for the restart
        in_flight = driver.in_flight
        assert services[0].stop(signal.SIGKILL) == -signal.SIGKILL
        logged_at_kill = len(read_whole_log(store))
        pending_at_kill = len(store.pending(N_EVENTS))
        assert pending_at_kill > 0, "no event was pending at the kill: the re-drive went untested"
        acked_at_kill = sum(
            b.response["accepted"] + b.response["duplicates"]
            for b in driver.batches
            if b.response is not None
        )

        services.append(serve(tmp_path / "second", env))  # ready only after its start-up re-drive
        pending_after_restart = len(store.pending(N_EVENTS))
        assert pending_after_restart == 0, "the start-up re-drive left logged events unapplied"
        driver.url = services[1].url
        driver.up.set()
        driver.join(300)
        ingest_s = time.monotonic() - t_start
        t_verify = time.monotonic()

        outcome = driver.outcome_summary()
        assert outcome["batches_retried"] >= 1, "the kill hit no request in flight"
        log = read_whole_log(store)
        counted = check_log_against_outcomes(log, driver.batches)
        checked = verify_exactly_once(redis_aof.url, services[1].url, runtime)
        assert counted["logged"] + counted["rejected"] == N_EVENTS
        # every rejection must be a late one caused by the interleaving of clients
        assert counted["rejected"] == counted.get("rejected_late", 0)
        figures.update(
            outcome,
            requests_in_flight_at_kill=in_flight,
            events_logged_at_kill=logged_at_kill,
            events_acknowledged_at_kill=acked_at_kill,
            events_pending_at_kill=pending_at_kill,
            events_logged=counted["logged"],
            events_rejected_late=counted["rejected"],
            events_lost=0,
            nodes=checked["nodes"],
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
            ingest_s=round(ingest_s, 1),
            verify_s=round(time.monotonic() - t_verify, 1),
        )
    finally:
        driver.up.set()
        store.close()
        for svc in services:
            svc.stop()


def test_crash_between_logging_and_applying(data_dir, redis_aof, runtime, tmp_path, figures):
    events = uci_events(data_dir, 3000)
    first, second, third = events[:1000], events[1000:2000], events[2000:]
    env = {"DYGSERVE_REDIS_URL": redis_aof.url}
    store = redis_store(redis_aof.url)
    services = []
    try:
        services.append(serve(tmp_path / "before", env))
        with services[-1].client() as c:
            for b in batches_of(first, 500):
                assert c.post("/v1/events", json={"events": b}).json()["accepted"] == len(b)
        assert services[-1].stop() in (
            0,
            -signal.SIGTERM,
        )  # uvicorn re-raises SIGTERM after a graceful stop

        services.append(serve(tmp_path / "faulty", {**env, "DYGSERVE_FAULT": "after_log"}))
        with services[-1].client() as c, pytest.raises(httpx.HTTPError):
            c.post("/v1/events", json={"events": second})  # logged, then the process exits
        assert services[-1].proc.wait(timeout=30) == 86
        pending = store.pending(10_000)
        assert sorted(e.event_id for e in pending) == sorted(e["event_id"] for e in second)
        # not applied: no blob has a watermark beyond the first part's seqs
        nodes = sorted({n for e in second for n in (e["src"], e["dst"])})
        marks = [
            runtime.codec.check_header(b)[1] for b in store.read_states(runtime.version, nodes) if b
        ]
        assert max(marks) <= len(first)

        services.append(serve(tmp_path / "after", env))  # re-drives on start
        assert store.pending(10) == []
        with services[-1].client() as c:
            retry = c.post("/v1/events", json={"events": second}).json()  # the client retries
            assert retry["accepted"] == 0 and retry["duplicates"] == len(second), retry
            for b in batches_of(third, 500):
                assert c.post("/v1/events", json={"events": b}).json()["accepted"] == len(b)
        checked = verify_exactly_once(redis_aof.url, services[-1].url, runtime)
        assert checked["events_logged"] == len(events)
        figures.update(
            events_logged_then_crashed=len(pending),
            retried_as_duplicates=retry["duplicates"],
            events_lost=0,
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        store.close()
        for svc in services:
            svc.stop()
