"""The live evaluator behind the real engine and a real Redis (in process, so that the
test can wait for the background thread and read its record): the sample and the
negatives are a function of the stream and the seed, every sampled event is either
scored or counted as skipped, and an apply that fails on a store error hands nothing
over and is counted."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from prometheus_client import REGISTRY

from model.checkpoint import load_checkpoint
from service.cpu_budget import CpuBudget
from service.engine import Engine, ModelRuntime
from service.live_eval import LiveEvaluator, sampled
from service.settings import DEFAULT_CHECKPOINT
from state_store.base import StoreUnavailable
from state_store.factory import make_store
from tests.support.redis_server import redis_available, start_redis
from tests.support.store_model import uci_events

RATE, K, SEED = 0.3, 3, 11


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="module")
def runtime() -> ModelRuntime:
    return ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT))


def replay_with_evaluator(
    runtime, url: str, record, seed: int, events, rate: float = RATE, **store_options
) -> list[dict]:
    engine = Engine(runtime, make_store(url, **store_options))
    evaluator = LiveEvaluator(rate, K, window=10_000, seed=seed, record=record)
    engine.apply_watch = evaluator.watch
    try:
        for lo in range(0, len(events), 250):  # cuts that ignore timestamp groups
            engine.ingest(events[lo : lo + 250])
        evaluator.drain()
    finally:
        evaluator.close()
        engine.store.close()
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_samples_and_negatives_follow_the_stream_and_the_seed(runtime, redis_server, tmp_path):
    events = [{"src": e.src, "dst": e.dst, "t": e.t} for e in uci_events(2000)]
    skipped_before = {
        r: counter("dygserve_live_eval_skipped_total", reason=r)
        for r in ("not_visible", "few_destinations")
    }
    samples_before = counter("dygserve_live_eval_samples_total")

    redis_server.flush()
    first = replay_with_evaluator(runtime, redis_server.url, tmp_path / "a.jsonl", SEED, events)
    seqs = np.arange(1, len(events) + 1)  # the log numbers events from 1
    chosen = seqs[sampled(seqs, SEED, RATE)]
    skipped = {
        r: counter("dygserve_live_eval_skipped_total", reason=r) - skipped_before[r]
        for r in skipped_before
    }
    # every sampled event is scored or counted as skipped, and only sampled ones are scored
    assert len(first) + sum(skipped.values()) == len(chosen)
    assert counter("dygserve_live_eval_samples_total") - samples_before == len(first)
    assert {s["seq"] for s in first} <= set(chosen.tolist())
    assert len(first) > 0.8 * len(chosen)
    for s in first:
        negs = [n["dst"] for n in s["negatives"]]
        assert len(negs) == K == len(set(negs)) and s["dst"] not in negs and s["src"] not in negs
        assert np.isfinite([s["logit"], *[n["logit"] for n in s["negatives"]]]).all()

    redis_server.flush()
    again = replay_with_evaluator(runtime, redis_server.url, tmp_path / "b.jsonl", SEED, events)
    assert again == first  # same stream, same seed: the same samples, negatives and scores

    redis_server.flush()
    other = replay_with_evaluator(runtime, redis_server.url, tmp_path / "c.jsonl", SEED + 1, events)
    assert {s["seq"] for s in other} != {s["seq"] for s in first}


def test_a_store_error_in_the_apply_skips_the_batch_and_counts_it(runtime, tmp_path):
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    server = start_redis(tmp_path)
    engine = Engine(runtime, make_store(server.url, socket_timeout=0.5))
    evaluator = LiveEvaluator(1.0, K, seed=SEED)
    engine.apply_watch = evaluator.watch
    try:
        rt = engine.runtime
        _, logged = engine.log_events(rt, [{"src": "a", "dst": "b", "t": 1.0}])
        failed_before = counter("dygserve_live_eval_skipped_total", reason="batch_store_error")
        samples_before = counter("dygserve_live_eval_samples_total")
        server.stop()
        with pytest.raises(StoreUnavailable):
            engine.apply(rt, logged)
        evaluator.drain()
        assert (
            counter("dygserve_live_eval_skipped_total", reason="batch_store_error")
            == failed_before + 1
        )
        assert counter("dygserve_live_eval_samples_total") == samples_before
        # the re-drive will write what the failed apply did not: the pool starts again
        assert evaluator._pool_dirty
    finally:
        evaluator.close()
        engine.store.close()
        server.stop()


def test_past_its_cpu_budget_the_evaluator_skips_and_counts(runtime, redis_server, tmp_path):
    events = [{"src": e.src, "dst": e.dst, "t": e.t} for e in uci_events(2000)]
    reasons = ("not_visible", "few_destinations", "cpu_budget")
    before = {r: counter("dygserve_live_eval_skipped_total", reason=r) for r in reasons}
    samples_before = counter("dygserve_live_eval_samples_total")
    redis_server.flush()
    engine = Engine(runtime, make_store(redis_server.url))
    evaluator = LiveEvaluator(1.0, K, seed=SEED, cpu_budget=0.01)
    # Scripted clocks, so that the outcome does not hang on this machine's speed: 1% of
    # a core gives 20 ms of allowance to start with and 10 ms per batch (a wall second
    # passes at each check), and each evaluated batch costs 27 ms of CPU. The allowance
    # at each batch's check then runs 20, 3, -14, -4, 6, -11, -1, 9 ms: batches 1 (which
    # only fills the destination pool), 2, 5 and 8 are evaluated, the other four refused.
    wall, cpu = itertools.count(0.0, 1.0), itertools.count(0.0, 0.027)
    evaluator.budget = CpuBudget(0.01, wall=lambda: next(wall), cpu=lambda: next(cpu))
    engine.apply_watch = evaluator.watch
    try:
        for lo in range(0, len(events), 250):
            engine.ingest(events[lo : lo + 250])
        evaluator.drain()
    finally:
        evaluator.close()
        engine.store.close()
    skipped = {
        r: counter("dygserve_live_eval_skipped_total", reason=r) - before[r] for r in reasons
    }
    scored = counter("dygserve_live_eval_samples_total") - samples_before
    assert scored + sum(skipped.values()) == len(events)  # rate 1: every event sampled
    assert skipped["cpu_budget"] == 4 * 250
    assert evaluator.budget.spent == pytest.approx(4 * 0.027)
    assert scored > 0


def test_an_event_logged_in_two_partitions_is_sampled_once(
    runtime, redis_cluster, redis_server, tmp_path
):
    """With the partitioned log (P = 16 on a 3-master cluster) nearly every event is
    logged as two copies with two seqs; at rate 1 every event must be sampled once (not
    once per copy), and each sample scored from the same states as on one Redis."""
    events = [
        {"src": e.src, "dst": e.dst, "t": e.t, "event_id": f"ev-{i}"}
        for i, e in enumerate(uci_events(1000))
    ]
    reasons = ("not_visible", "few_destinations", "cpu_budget")
    before = {r: counter("dygserve_live_eval_skipped_total", reason=r) for r in reasons}
    samples_before = counter("dygserve_live_eval_samples_total")
    redis_cluster.flush()
    parted = replay_with_evaluator(
        runtime, redis_cluster.url, tmp_path / "p16.jsonl", SEED, events, 1.0, partitions=16
    )
    skipped = sum(
        counter("dygserve_live_eval_skipped_total", reason=r) - before[r] for r in reasons
    )
    scored = counter("dygserve_live_eval_samples_total") - samples_before
    assert scored == len(parted)
    assert scored + skipped == len(events)  # once per event, not once per copy
    ids = [s["event_id"] for s in parted]
    assert len(ids) == len(set(ids))

    redis_server.flush()
    single = replay_with_evaluator(
        runtime, redis_server.url, tmp_path / "p1.jsonl", SEED, events, 1.0
    )
    assert sorted(ids) == sorted(s["event_id"] for s in single)  # the same events scored
    by_id = {s["event_id"]: s["logit"] for s in single}
    assert max(abs(s["logit"] - by_id[s["event_id"]]) for s in parted) <= 1e-4
