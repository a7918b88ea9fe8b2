"""Redis goes away mid-stream (kill -9; AOF with appendfsync always) and comes back on
the same port with the same AOF folder. The service must answer 503 with Retry-After
(never a 500, never hang: every request has a client timeout), /readyz must turn 503,
and after Redis returns the same service process (no restart) must become ready again,
re-drive what was logged but not applied, and have lost no acknowledged event."""

from __future__ import annotations

import time

import httpx

from tests.support.redis_server import start_redis

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

N_EVENTS = 8000
DOWN_S = 3.0


def status(url: str, path: str, **params) -> tuple[int, httpx.Headers]:
    r = httpx.get(f"{url}{path}", params=params, timeout=10.0)
    return r.status_code, r.headers


def test_redis_down_answers_503_then_recovers_without_a_restart(
    data_dir, redis_aof, runtime, tmp_path, figures
):
    events = uci_events(data_dir, N_EVENTS)
    svc = serve(tmp_path / "svc", {"DYGSERVE_REDIS_URL": redis_aof.url})
    pid = svc.proc.pid
    driver = Driver(batches_of(events, 200), svc.url, n_clients=2, timeout=20.0).start()
    revived = None
    try:
        wait_until(lambda: driver.acked >= 10, 120, 0.05, "10 batches acknowledged")
        acked_before = sum(b.response["accepted"] for b in driver.batches if b.response)
        redis_aof.proc.kill()  # no shutdown, no final fsync: only appendfsync always protects us
        redis_aof.proc.wait(timeout=10)
        t_down = time.monotonic()

        wait_until(lambda: status(svc.url, "/readyz")[0] == 503, 15, 0.05, "/readyz to turn 503")
        unready_after_s = time.monotonic() - t_down
        code, headers = status(svc.url, "/readyz")
        assert code == 503 and headers.get("retry-after")
        code, headers = status(svc.url, "/v1/score", src="1", dst="2", t=10.0)
        assert code == 503 and headers.get("retry-after") == "1", code
        wait_until(lambda: driver.statuses["503"] >= 2, 15, 0.05, "ingest requests answered 503")
        assert status(svc.url, "/healthz")[0] == 200  # alive, only not ready
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_down)))

        revived = start_redis(redis_aof.workdir.parent, port=redis_aof.port, appendfsync="always")
        t_up = time.monotonic()
        wait_until(lambda: status(svc.url, "/readyz")[0] == 200, 30, 0.1, "/readyz to recover")
        ready_after_s = time.monotonic() - t_up
        driver.join(300)

        assert svc.proc.poll() is None and svc.proc.pid == pid, "the service was restarted"
        unexpected = {k: v for k, v in driver.statuses.items() if k not in ("200", "503")}
        assert not unexpected, f"answers other than 200/503 during the outage: {unexpected}"
        assert all(v == "1" for v in driver.retry_after_seen), driver.retry_after_seen
        log = read_whole_log(redis_store(revived.url))
        counted = check_log_against_outcomes(log, driver.batches)
        checked = verify_exactly_once(revived.url, svc.url, runtime)
        figures.update(
            driver.outcome_summary(),
            events_acknowledged_before_outage=acked_before,
            answers_503=driver.statuses["503"],
            answers_5xx_other=sum(
                v for k, v in driver.statuses.items() if k.startswith("5") and k != "503"
            ),
            slowest_answer_s=round(driver.slowest_answer_s, 2),
            unready_after_s=round(unready_after_s, 2),
            ready_after_redis_back_s=round(ready_after_s, 2),
            events_logged=counted["logged"],
            events_lost=0,
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        driver.up.set()
        svc.stop()
        if revived is not None:
            revived.stop()
