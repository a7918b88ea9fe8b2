"""A reload reaches every worker and replica (issue 15, defect 2).

The serving version is one key in the store. ``POST /v1/admin/reload`` on one
replica sets it; every other replica and uvicorn worker follows within
``DYGSERVE_MODEL_POLL_S`` plus a checkpoint load; a replica started later serves it
too; ``/v1/model`` and ``dygserve_model_info`` / ``dygserve_model_behind_store`` show
the version each one serves. One that cannot load it keeps serving its version, says
so, and turns not ready after ``DYGSERVE_MODEL_BEHIND_LIMIT_S``.

Real processes: one redis-server, the service as ``python -m service.cli serve``.
Timings are printed as figures (docs/RELIABILITY.md), never asserted.
"""

from __future__ import annotations

import re
import shutil
import time

import httpx
import pytest

from tests.reliability.helpers import serve, wait_until

KEY = {"X-API-Key": "k"}
FOLLOW_TIMEOUT_S = 60.0  # generous on a loaded 2-core CI box; the figure is printed


def version_of(url: str) -> dict:
    # a new connection each time: with several uvicorn workers the kernel spreads them
    return httpx.get(f"{url}/v1/model", timeout=30.0).json()


def env_for(redis_url: str, models_dir, checkpoint: str = "a", **extra: str) -> dict[str, str]:
    return {
        "DYGSERVE_CHECKPOINT": str(models_dir / checkpoint),
        "DYGSERVE_MODELS_DIR": str(models_dir),
        "DYGSERVE_REDIS_URL": redis_url,
        "DYGSERVE_API_KEY": "k",
        "DYGSERVE_MODEL_POLL_S": "0.5",
        **extra,
    }


@pytest.fixture()
def services(redis_server):
    redis_server.flush()
    started = []
    yield started
    for svc in started:
        svc.stop()


def test_two_replicas_on_one_redis_follow_a_reload(redis_server, models_dir, tmp_path, services):
    env = env_for(redis_server.url, models_dir)
    one = serve(tmp_path / "one", env)
    services.append(one)
    two = serve(tmp_path / "two", env)
    services.append(two)
    a = version_of(one.url)["model_version"]
    assert version_of(two.url)["model_version"] == a

    with one.client(headers=KEY) as c:
        ev = {"src": "x", "dst": "y", "t": 1.0, "features": [0.0, 0.0]}
        assert c.post("/v1/events", json={"events": [ev]}).status_code == 200
        answered = time.monotonic()
        r = c.post("/v1/admin/reload", json={"checkpoint": "b"})
    assert r.status_code == 200, r.text
    b = r.json()["model_version"]
    assert b != a

    wait_until(
        lambda: version_of(two.url)["model_version"] == b,
        FOLLOW_TIMEOUT_S,
        0.05,
        "the other replica to serve the reloaded version",
    )
    followed_s = time.monotonic() - answered
    assert r.json()["store_model_version"] == b
    info = version_of(two.url)
    assert info["store_model_version"] == b and info["behind_store_s"] is None
    assert info["replica"] != version_of(one.url)["replica"]
    score = httpx.get(f"{two.url}/v1/score", params={"src": "x", "dst": "y", "t": 2.0}).json()
    assert score["model_version"] == b and not score["src_inductive"]
    metrics = httpx.get(f"{two.url}/metrics").text
    assert f'dygserve_model_info{{version="{b}"}} 1.0' in metrics
    assert f'dygserve_model_info{{version="{a}"}} 0.0' in metrics
    assert "dygserve_model_behind_store 0.0" in metrics

    # A replica started after the reload, configured with A, serves what the store names.
    three = serve(tmp_path / "three", env)
    services.append(three)
    assert version_of(three.url)["model_version"] == b
    print(f"\nFIGURES replica followed the reload after {followed_s:.2f} s (poll 0.5 s)")


def test_two_uvicorn_workers_follow_a_reload(redis_server, models_dir, tmp_path, services):
    svc = serve(tmp_path / "w", env_for(redis_server.url, models_dir, DYGSERVE_WORKERS="2"))
    services.append(svc)
    with svc.client(headers=KEY) as c:
        r = c.post("/v1/admin/reload", json={"checkpoint": "b"})
    assert r.status_code == 200, r.text
    b = r.json()["model_version"]

    def every_worker_serves_b() -> bool:
        # multiprocess metrics: one dygserve_model_info series per worker pid
        text = httpx.get(f"{svc.url}/metrics", timeout=30.0).text
        on = re.findall(rf'dygserve_model_info{{pid="(\d+)",version="{b}"}} 1\.0', text)
        on += re.findall(rf'dygserve_model_info{{version="{b}",pid="(\d+)"}} 1\.0', text)
        return len(set(on)) == 2

    wait_until(every_worker_serves_b, FOLLOW_TIMEOUT_S, 0.1, "both workers to serve the reload")
    seen = {}
    for _ in range(40):
        info = version_of(svc.url)
        seen[info["replica"]] = info["model_version"]
    assert set(seen.values()) == {b}
    assert len(seen) == 2, f"requests reached {len(seen)} worker(s) only"


def test_a_replica_that_cannot_load_the_version_says_so_and_turns_unready(
    redis_server, models_dir, tmp_path, services
):
    lone = tmp_path / "lone-models"
    shutil.copytree(models_dir / "a", lone / "a")  # this replica's machine has no "b"
    one = serve(tmp_path / "one", env_for(redis_server.url, models_dir))
    services.append(one)
    two = serve(
        tmp_path / "two",
        env_for(redis_server.url, lone, DYGSERVE_MODEL_BEHIND_LIMIT_S="2"),
    )
    services.append(two)
    a = version_of(two.url)["model_version"]
    with one.client(headers=KEY) as c:
        b = c.post("/v1/admin/reload", json={"checkpoint": "b"}).json()["model_version"]

    wait_until(
        lambda: version_of(two.url)["store_model_version"] == b,
        FOLLOW_TIMEOUT_S,
        0.1,
        "the replica to read the new serving version",
    )
    info = version_of(two.url)
    assert info["model_version"] == a and info["behind_store_s"] is not None
    assert "dygserve_model_behind_store 1.0" in httpx.get(f"{two.url}/metrics").text
    wait_until(
        lambda: httpx.get(f"{two.url}/readyz").status_code == 503,
        FOLLOW_TIMEOUT_S,
        0.2,
        "the lagging replica to report not ready",
    )
    assert httpx.get(f"{one.url}/readyz").status_code == 200
