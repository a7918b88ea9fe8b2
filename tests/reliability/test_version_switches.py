"""Model switches with two replicas on one Redis (issue 15, defects 1 and 2), over HTTP.

Serve A on two replicas, ingest, reload B on one of them (the other follows), ingest
more through both, reload A on the other one (the first follows), then probe pairs
of nodes that got events under B through both replicas: every score must equal a
fresh replay of the whole stored log under A, and the states must pass the
exactly-once check. Figures (how long each replica took to follow, how many states
were caught up, the largest difference) go to docs/RELIABILITY.md.
"""

from __future__ import annotations

import re
import shutil
import time

import httpx

from service.engine import Engine
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

POLL_S = 0.5
PARITY_TOL = 1e-4


def ingest(url: str, events, size=500) -> None:
    with httpx.Client(base_url=url, timeout=60.0) as c:
        for b in batches_of(events, size):
            r = c.post("/v1/events", json={"events": b})
            assert r.status_code == 200 and r.json()["accepted"] == len(b), r.text


def reload(url: str, name: str) -> tuple[str, float]:
    r = httpx.post(f"{url}/v1/admin/reload", json={"checkpoint": name}, timeout=60.0)
    assert r.status_code == 200, r.text
    return r.json()["model_version"], time.monotonic()


def follow(url: str, version: str, since: float) -> float:
    wait_until(
        lambda: httpx.get(f"{url}/v1/model").json()["model_version"] == version,
        60,
        0.02,
        f"{url} to serve {version}",
    )
    return time.monotonic() - since


def counter(url: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_switch_back_and_forth_with_two_replicas(data_dir, redis_aof, runtime, tmp_path, figures):
    models = tmp_path / "models"
    shutil.copytree(DEFAULT_CHECKPOINT, models / "a")
    make_checkpoint(models / "b", seed=1, edge_feature_dim=0)
    env = {
        "DYGSERVE_REDIS_URL": redis_aof.url,
        "DYGSERVE_CHECKPOINT": str(models / "a"),
        "DYGSERVE_MODELS_DIR": str(models),
        "DYGSERVE_MODEL_POLL_S": str(POLL_S),
    }
    events = uci_events(data_dir, 6000)
    services = [serve(tmp_path / "one", env), serve(tmp_path / "two", env)]
    one, two = (s.url for s in services)
    store = redis_store(redis_aof.url)
    try:
        a = httpx.get(f"{one}/v1/model").json()["model_version"]
        assert a == runtime.version
        ingest(one, events[:2000])

        b, t_b = reload(one, "b")
        follow_b = follow(two, b, t_b)
        ingest(two, events[2000:3000])  # under B, through both replicas
        ingest(one, events[3000:4000])

        back, t_a = reload(two, "a")
        assert back == a
        follow_a = follow(one, a, t_a)

        # Nodes that got events under B, probed through both replicas.
        b_era = events[2000:4000]
        nodes = list(dict.fromkeys(n for e in b_era for n in (e["src"], e["dst"])))
        t = events[3999]["t"] + 1.0
        pairs = [(n, nodes[(7 * i + 3) % len(nodes)], t) for i, n in enumerate(nodes)][:300]
        body = {"pairs": [{"src": s, "dst": d, "t": tt} for s, d, tt in pairs]}
        got_one = httpx.post(f"{one}/v1/score", json=body).json()
        got_two = httpx.post(f"{two}/v1/score", json=body).json()
        assert got_one["model_version"] == got_two["model_version"] == a

        ref = replay(read_whole_log(store), runtime)
        want, _ = Engine(runtime, ref).score_pairs(pairs)
        diffs = [
            abs(g["logit"] - w.logit)
            for got in (got_one, got_two)
            for g, w in zip(got["scores"], want, strict=True)
        ]
        wrong = sum(d > PARITY_TOL for d in diffs)
        assert wrong == 0, f"{wrong} of {len(diffs)} scores from stale states"
        caught_up = counter(one, "dygserve_stale_catchups_total") + counter(
            two, "dygserve_stale_catchups_total"
        )
        assert caught_up > 0  # the probe did find stale states (else it tested nothing)

        ingest(one, events[4000:])  # A advances caught-up and still-stale states alike
        checked = verify_exactly_once(redis_aof.url, one, runtime)
        figures.update(
            replica_followed_reload_to_b_s=round(follow_b, 2),
            replica_followed_reload_to_a_s=round(follow_a, 2),
            poll_s=POLL_S,
            pairs_probed=len(diffs),
            pairs_wrong=wrong,
            max_abs_logit_diff=max(diffs),
            stale_states_caught_up=int(caught_up),
            events_logged=checked["events_logged"],
            max_abs_state_diff=checked["max_abs_diff"],
        )
    finally:
        store.close()
        for svc in services:
            svc.stop()
