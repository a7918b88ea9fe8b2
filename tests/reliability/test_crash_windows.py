"""Each crash window of "log first, apply second", hit exactly by its fault point
(``state_store.faults``, ``DYGSERVE_FAULT``): the service exits with code 86 right
there, on Redis with AOF ``appendfsync always``; it is restarted on the same Redis;
the client retries with the same event ids. Each test first checks that the crash
left the store in the state the window describes (so it cannot pass by crashing
somewhere else), then that every logged event ends up applied exactly once and the
states equal a clean sequential replay of the stored log.

(``after_log``, the window between logging and any state write, is
``test_crash.py::test_crash_between_logging_and_applying``.)

* ``after_partial_write``: part of a batch's compare-and-set writes landed.
* ``before_mark``: every state written, nothing marked applied.
* ``at_reload``: the store's serving version changed, the process that made the
  change died before switching or answering.
"""

from __future__ import annotations

import shutil

import httpx
import pytest

from service.engine import Engine, ModelRuntime
from state_store.faults import CRASH_EXIT_CODE
from tests.service.conftest import make_checkpoint

from .helpers import (
    DEFAULT_CHECKPOINT,
    batches_of,
    read_whole_log,
    redis_store,
    replay,
    serve,
    uci_events,
    verify_exactly_once,
    wait_until,
)


def ingest(svc, events, size=500) -> None:
    with svc.client() as c:
        for b in batches_of(events, size):
            r = c.post("/v1/events", json={"events": b})
            assert r.status_code == 200 and r.json()["accepted"] == len(b), r.text


def crash_on(svc, events) -> None:
    """POST ``events``; the fault point ends the process before it answers."""
    with svc.client() as c, pytest.raises(httpx.HTTPError):
        c.post("/v1/events", json={"events": events})
    assert svc.proc.wait(timeout=60) == CRASH_EXIT_CODE, svc.log()


def watermarks(store, runtime, nodes) -> dict[str, int]:
    """Each node's stored watermark seq (-1: no blob)."""
    blobs = store.read_states(runtime.version, nodes)
    return {
        n: (runtime.codec.check_header(b)[1] if b else -1)
        for n, b in zip(nodes, blobs, strict=True)
    }


def endpoints(events) -> list[str]:
    return sorted({n for e in events for n in (e["src"], e["dst"])})


def retry_and_finish(svc, crashed, rest) -> dict:
    with svc.client() as c:
        retry = c.post("/v1/events", json={"events": crashed}).json()
    assert retry["accepted"] == 0 and retry["duplicates"] == len(crashed), retry
    assert retry["applied"] is True
    ingest(svc, rest)
    return retry


def test_crash_after_part_of_the_compare_and_set_writes(
    data_dir, redis_aof, runtime, tmp_path, figures
):
    events = uci_events(data_dir, 3000)
    first, crashed, rest = events[:1000], events[1000:2000], events[2000:]
    env = {"DYGSERVE_REDIS_URL": redis_aof.url}
    store = redis_store(redis_aof.url)
    services = []
    try:
        services.append(serve(tmp_path / "before", env))
        ingest(services[-1], first)
        services[-1].stop()
        before = watermarks(store, runtime, endpoints(crashed))

        services.append(
            serve(tmp_path / "faulty", {**env, "DYGSERVE_FAULT": "after_partial_write"})
        )
        crash_on(services[-1], crashed)
        # The window: every event pending; some endpoints advanced past the first part,
        # others not touched.
        pending = store.pending(10_000)
        assert sorted(e.event_id for e in pending) == sorted(e["event_id"] for e in crashed)
        after = watermarks(store, runtime, endpoints(crashed))
        advanced = [n for n in after if after[n] > len(first)]
        untouched = [n for n in after if after[n] == before[n]]
        assert advanced and untouched, (len(advanced), len(untouched))

        services.append(serve(tmp_path / "after", env))  # the start-up re-drive
        assert store.pending(10) == []
        retry = retry_and_finish(services[-1], crashed, rest)
        checked = verify_exactly_once(redis_aof.url, services[-1].url, runtime)
        assert checked["events_logged"] == len(events)
        figures.update(
            nodes_written_before_the_crash=len(advanced),
            nodes_not_written=len(untouched),
            events_pending_at_the_crash=len(pending),
            retried_as_duplicates=retry["duplicates"],
            events_lost=0,
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        store.close()
        for svc in services:
            svc.stop()


def test_crash_between_the_state_writes_and_marking_applied(
    data_dir, redis_aof, runtime, tmp_path, figures
):
    events = uci_events(data_dir, 3000)
    first, crashed, rest = events[:1000], events[1000:2000], events[2000:]
    env = {"DYGSERVE_REDIS_URL": redis_aof.url}
    store = redis_store(redis_aof.url)
    services = []
    try:
        services.append(serve(tmp_path / "before", env))
        ingest(services[-1], first)
        services[-1].stop()

        services.append(serve(tmp_path / "faulty", {**env, "DYGSERVE_FAULT": "before_mark"}))
        crash_on(services[-1], crashed)
        # The window: every endpoint's state is written (its watermark is its last event
        # of the crashed batch) and every event is still pending.
        pending = store.pending(10_000)
        assert sorted(e.event_id for e in pending) == sorted(e["event_id"] for e in crashed)
        last_seq = {}
        for e in pending:
            last_seq[e.src] = last_seq[e.dst] = e.seq  # pending is in seq order
        assert watermarks(store, runtime, sorted(last_seq)) == last_seq

        services.append(serve(tmp_path / "after", env))  # re-drive: nothing to fold in twice
        assert store.pending(10) == []
        retry = retry_and_finish(services[-1], crashed, rest)
        checked = verify_exactly_once(redis_aof.url, services[-1].url, runtime)
        assert checked["events_logged"] == len(events)
        figures.update(
            events_written_not_marked_at_the_crash=len(pending),
            nodes_written_at_the_crash=len(last_seq),
            retried_as_duplicates=retry["duplicates"],
            events_applied_twice=0,
            max_abs_state_diff=checked["max_abs_diff"],
            max_scaled_state_diff=checked["max_scaled_diff"],
        )
    finally:
        store.close()
        for svc in services:
            svc.stop()


def test_crash_at_reload(data_dir, redis_aof, tmp_path, figures):
    models = tmp_path / "models"
    shutil.copytree(DEFAULT_CHECKPOINT, models / "a")
    make_checkpoint(models / "b", seed=1, edge_feature_dim=0)
    b = ModelRuntime.load(models / "b")
    events = uci_events(data_dir, 2000)
    env = {
        "DYGSERVE_REDIS_URL": redis_aof.url,
        "DYGSERVE_CHECKPOINT": str(models / "a"),
        "DYGSERVE_MODELS_DIR": str(models),
        "DYGSERVE_MODEL_POLL_S": "0.5",
    }
    store = redis_store(redis_aof.url)
    services = []
    try:
        other = serve(tmp_path / "other", env)  # a replica beside the one that crashes
        services.append(other)
        services.append(serve(tmp_path / "faulty", {**env, "DYGSERVE_FAULT": "at_reload"}))
        ingest(services[-1], events[:1000])
        with services[-1].client() as c, pytest.raises(httpx.HTTPError):
            c.post("/v1/admin/reload", json={"checkpoint": "b"})
        assert services[-1].proc.wait(timeout=60) == CRASH_EXIT_CODE
        # The window: the store serves B, no process has switched yet because of it.
        serving = store.read_serving().serving
        assert serving is not None and serving.version == b.version

        wait_until(
            lambda: httpx.get(f"{other.url}/v1/model").json()["model_version"] == b.version,
            60,
            0.1,
            "the other replica to follow the reload",
        )
        restarted = serve(tmp_path / "restarted", env)  # configured with A, serves B
        services.append(restarted)
        assert httpx.get(f"{restarted.url}/v1/model").json()["model_version"] == b.version
        ingest(restarted, events[1000:])

        # B's states (cold rebuilds of A's era, then B's own applies) equal a fresh
        # replay of the whole log under B; nothing is pending.
        wait_until(lambda: store.pending(1) == [], 30, 0.2, "the pending set to drain")
        nodes = endpoints(events)
        t = events[-1]["t"] + 1.0
        pairs = [
            {"src": n, "dst": nodes[(i * 7 + 1) % len(nodes)], "t": t}
            for i, n in enumerate(nodes[:300])
        ]
        with restarted.client() as c:
            got = c.post("/v1/score", json={"pairs": pairs}).json()
        assert got["model_version"] == b.version
        ref = replay(read_whole_log(store), b)
        want, _ = Engine(b, ref).score_pairs([(p["src"], p["dst"], p["t"]) for p in pairs])
        diff = max(abs(g["logit"] - w.logit) for g, w in zip(got["scores"], want, strict=True))
        assert diff <= 1e-4
        figures.update(
            store_version_after_crash="B",
            restarted_replica_serves="B",
            other_replica_followed=True,
            pairs_checked=len(pairs),
            max_abs_logit_diff_vs_replay_under_b=diff,
        )
    finally:
        store.close()
        for svc in services:
            svc.stop()
