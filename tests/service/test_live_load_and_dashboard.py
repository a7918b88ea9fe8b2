"""The load generator against the real service on a real Redis (as deployed), and
every metric the Grafana dashboard queries present in that service's live /metrics
after the traffic (the store's memory figures exist only with Redis)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import time
from pathlib import Path

from loadtests.replay_load import LoadConfig, run_load
from tests.support.redis_server import start_redis
from tests.support.service_process import start_service

REPO = Path(__file__).resolve().parents[2]


def dashboard_metric_names() -> set[str]:
    spec = importlib.util.spec_from_file_location(
        "dashboard_checks", REPO / "tests" / "deploy" / "test_dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dashboard_metric_names()


def test_load_generator_and_dashboard_metrics(tmp_path, data_dir):
    redis = start_redis(tmp_path / "redis")
    svc = start_service(
        tmp_path, {"DYGSERVE_REDIS_URL": redis.url, "DYGSERVE_STORE_INFO_INTERVAL_S": "0.2"}
    )  # bundled checkpoint
    try:
        cfg = LoadConfig(
            url=svc.url,
            data=str(data_dir / "uci" / "edges.csv.gz"),
            out=str(tmp_path / "load"),
            batch_size=100,
            concurrency=2,
            max_events=1500,
            duration=20.0,
            score_rate=30.0,
            plots=False,
        )
        report, latencies = asyncio.run(run_load(cfg))
        assert report.events_accepted > 0 and report.events_failed == 0
        assert (
            report.events_answered
            == report.events_accepted + report.events_duplicate + report.events_rejected
        )
        assert sum(report.score_requests.values()) > 0 and report.score_pairs > 0
        with svc.client() as c:
            # one late event, so that the rejected-by-reason series exists too
            c.post("/v1/events", json={"events": [{"src": "1", "dst": "2", "t": -1.0}]})
            # the store's figures are sampled in the background, started by a scrape
            deadline = time.monotonic() + 20
            while "dygserve_store_memory_used_bytes" not in (text := c.get("/metrics").text):
                assert time.monotonic() < deadline, "no store memory figures in /metrics"
                time.sleep(0.2)
            ingested = float(
                re.search(r"^dygserve_events_ingested_total (\S+)$", text, re.M).group(1)
            )
        assert ingested == report.events_accepted
        series = {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        names = dashboard_metric_names()
        assert names, "the dashboard queries no metric"
        missing = [
            n for n in sorted(names) if not any(s == n or s.startswith(n + "_") for s in series)
        ]
        assert not missing, f"dashboard metrics absent from live /metrics: {missing}"
    finally:
        svc.stop()
        redis.stop()
