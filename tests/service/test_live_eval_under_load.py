"""The live gauges move under the load generator (loadtests/replay_load.py) against
the real service, and its /metrics serves them as Prometheus would scrape them."""

from __future__ import annotations

import asyncio
import re
import time

from loadtests.replay_load import LoadConfig, run_load
from model.checkpoint import load_checkpoint
from service.live_eval import reference_ap
from service.settings import DEFAULT_CHECKPOINT
from tests.support.service_process import start_service


def value(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_live_gauges_move_under_replayed_load(tmp_path, data_dir):
    svc = start_service(
        tmp_path, {"DYGSERVE_LIVE_EVAL_RATE": "0.2", "DYGSERVE_LIVE_EVAL_CPU_BUDGET": "1"}
    )
    try:
        with svc.client() as c:
            idle = c.get("/metrics").text
        cfg = LoadConfig(
            url=svc.url,
            data=str(data_dir / "uci" / "edges.csv.gz"),
            out=str(tmp_path / "load"),
            batch_size=100,
            concurrency=2,
            max_events=3000,
            duration=20.0,
            score_rate=10.0,
            plots=False,
        )
        report, _ = asyncio.run(run_load(cfg))
        assert report.events_accepted > 2000 and report.events_failed == 0
        with svc.client() as c:
            last = -1.0
            for _ in range(100):  # the evaluator runs behind the answers: wait till it is idle
                text = c.get("/metrics").text
                samples = value(text, "dygserve_live_eval_samples_total")
                if samples == last:
                    break
                last = samples
                time.sleep(0.3)
    finally:
        svc.stop()
    assert value(idle, "dygserve_live_window_samples") == 0
    assert value(idle, "dygserve_live_eval_samples_total") == 0
    samples = value(text, "dygserve_live_eval_samples_total")
    assert samples >= 300 and value(text, "dygserve_live_window_samples") == min(samples, 1000)
    # a model far better than chance on its own data (test AP 0.97; the live negatives
    # are drawn from recently active destinations only)
    assert 0.7 < value(text, "dygserve_live_ap") <= 1.0
    assert 0.7 < value(text, "dygserve_live_auc") <= 1.0
    assert 0.1 < value(text, "dygserve_live_mrr") <= 1.0
    ckpt_ap = reference_ap(load_checkpoint(DEFAULT_CHECKPOINT).metrics)
    assert value(text, "dygserve_checkpoint_test_ap") == ckpt_ap
    positives = value(text, 'dygserve_live_score_count{label="positive"}')
    negatives = value(text, 'dygserve_live_score_count{label="negative"}')
    assert positives == samples and negatives == 9 * samples
    assert value(text, 'dygserve_live_eval_skipped_total{reason="batch_backlog"}') == 0
