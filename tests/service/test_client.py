"""The Python client (``service.client``) against the real service and a real Redis.

The service runs under uvicorn in its own process (``tests/support/service_process.py``)
behind a real TCP proxy that can drop answers (``tests/support/tcp_proxy.py``), or in
process through ``httpx.ASGITransport``. What is checked:

* exactly once across retries: answers dropped after the service logged and applied the
  events, and a service that crashes between logging and applying and is restarted;
  each node's state then counts each of its events once;
* Retry-After honoured on real 503s (a Redis stopped, then started again);
* batching under the service's event and byte limits, per-node order across batches
  (also with several async requests in flight), late events at their input index;
* typed errors for 4xx, never retried; a spent retry budget; ids kept for a resend;
* every route, with the blocking and the async client.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import defaultdict
from typing import Any

import httpx
import pytest

from loadtests.reads_bench import events_logged
from service.app import create_app
from service.client import (
    AsyncDygserveClient,
    Attempt,
    BatchLimits,
    ClientConfig,
    DeliveryUnknown,
    DygserveClient,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RetriesExhausted,
    RetryPolicy,
    Unauthorized,
    ValidationFailed,
    event_id_from_key,
)
from service.schemas import EventIn
from service.settings import Settings
from state_store.faults import CRASH_EXIT_CODE, FAULT_ENV
from tests.support.redis_server import free_port, start_redis
from tests.support.service_process import ServiceProcess, start_service
from tests.support.tcp_proxy import TcpProxy

KEY = "k3y"
MAX_EVENTS = 50  # the module service's DYGSERVE_MAX_BATCH_EVENTS
MAX_BYTES = 8192  # and DYGSERVE_MAX_BODY_BYTES
FAST_RETRIES = RetryPolicy(base_delay_s=0.01, max_delay_s=0.2)


def config(url: str, **kw: Any) -> ClientConfig:
    base: dict[str, Any] = {
        "url": url,
        "api_key": KEY,
        "limits": BatchLimits(max_batch_events=MAX_EVENTS, max_body_bytes=MAX_BYTES),
        "retry": FAST_RETRIES,
        "trust_env": False,
    }
    base.update(kw)
    return ClientConfig(**base)


def stream(prefix: str, n: int, nodes: int = 10, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` time-ordered events among ``nodes`` nodes (each node in many batches)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.sample(range(nodes), 2)
        out.append(
            {"src": f"{prefix}-{a}", "dst": f"{prefix}-{b}", "t": float(i), "features": [0.1, -0.2]}
        )
    return out


def per_node(events: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """Each node's event count and last time."""
    count: dict[str, int] = defaultdict(int)
    last: dict[str, float] = {}
    for e in events:
        for node in {e["src"], e["dst"]}:
            count[node] += 1
            last[node] = max(last.get(node, -math.inf), e["t"])
    return {node: (count[node], last[node]) for node in count}


def assert_applied_once(client: DygserveClient, events: list[dict[str, Any]]) -> None:
    """Every node's state has applied each of its events exactly once, the last one last."""
    for node, (count, last) in per_node(events).items():
        summary = client.node(node)
        assert (summary.events_applied, summary.history_length, summary.t_last) == (
            count,
            count,
            last,
        ), node


class Attempts(list[Attempt]):
    """The attempt hook: keeps every attempt (thread-safe enough: list.append)."""

    def __call__(self, attempt: Attempt) -> None:
        self.append(attempt)

    def events(self) -> list[Attempt]:
        return [a for a in self if a.path == "/v1/events"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def service(models_dir, redis_server, tmp_path_factory):
    """The real service on a real Redis, with an API key and small request limits."""
    svc = start_service(
        tmp_path_factory.mktemp("client-svc"),
        {
            "DYGSERVE_CHECKPOINT": str(models_dir / "a"),
            "DYGSERVE_MODELS_DIR": str(models_dir),
            "DYGSERVE_REDIS_URL": redis_server.url,
            "DYGSERVE_API_KEY": KEY,
            "DYGSERVE_MAX_BATCH_EVENTS": str(MAX_EVENTS),
            "DYGSERVE_MAX_BODY_BYTES": str(MAX_BYTES),
        },
    )
    yield svc
    svc.stop()


@pytest.fixture
def proxy(service):
    p = TcpProxy(int(service.url.rsplit(":", 1)[1]))
    yield p
    p.close()


# --------------------------------------------------------------------------- exactly once


def test_dropped_answers_are_retried_with_the_same_ids_and_applied_once(service, proxy):
    events = stream("drop", 400)
    attempts = Attempts()
    with DygserveClient(config(proxy.url), on_attempt=attempts) as client:
        # The first batch is logged and applied, and its answer lost, three times over.
        proxy.cut_next_answers(3)
        result = client.ingest(events)
        assert proxy.answers_cut == 3
        lost = [a for a in attempts.events() if a.status is None]
        assert len(lost) == 3 and all(a.retry_in_s is not None for a in lost)
        assert {a.error for a in lost} <= {"RemoteProtocolError", "ReadError"}
        assert [a.number for a in attempts.events()[:4]] == [1, 2, 3, 4]
        # the first attempt logged the batch: the resent ones are duplicates, not new events
        assert result.duplicates == MAX_EVENTS and result.rejected == []
        assert result.accepted + result.duplicates == len(events)
        assert len(set(result.event_ids)) == len(events)
        assert_applied_once(client, events)

        # the same events with the ids they went with: all duplicates, nothing applied again
        again = client.ingest(
            [dict(e, event_id=i) for e, i in zip(events, result.event_ids, strict=True)]
        )
        assert (again.accepted, again.duplicates) == (0, len(events))
        assert again.event_ids == result.event_ids
        assert_applied_once(client, events)


def test_async_client_retries_dropped_answers_with_requests_in_flight(service, proxy):
    events = stream("adrop", 400, nodes=40)
    attempts = Attempts()

    async def run() -> Any:
        async with AsyncDygserveClient(config(proxy.url), on_attempt=attempts) as client:
            proxy.cut_next_answers(4)
            return await client.ingest(events, concurrency=3)

    result = asyncio.run(run())
    assert proxy.answers_cut == 4
    assert sum(a.status is None for a in attempts.events()) == 4
    assert result.duplicates > 0 and result.rejected == []
    assert result.accepted + result.duplicates == len(events)
    with DygserveClient(config(service.url)) as client:
        assert_applied_once(client, events)


def test_without_ids_a_dropped_answer_is_not_resent(service, proxy):
    events = [EventIn(src="noid-a", dst="noid-b", t=1.0, features=[0.0, 0.0])]
    attempts = Attempts()
    cfg = config(proxy.url, assign_event_ids=False)
    with DygserveClient(cfg, on_attempt=attempts) as client:
        proxy.cut_next_answers(1)
        with pytest.raises(DeliveryUnknown) as caught:
            client.ingest(events)
        assert len(attempts.events()) == 1  # not resent: it was in fact logged
        assert caught.value.progress is not None
        assert caught.value.progress.remaining[0].get("event_id") is None
        assert client.node("noid-a").events_applied == 1


def test_a_crash_between_logging_and_applying_then_a_restart(models_dir, redis_server, tmp_path):
    """The service exits right after logging the first batch (fault point ``after_log``),
    before applying or answering it; a new process on the same Redis re-drives the log at
    start; the client, retrying the same ids meanwhile, gets duplicates for that batch."""
    env = {
        "DYGSERVE_CHECKPOINT": str(models_dir / "a"),
        "DYGSERVE_REDIS_URL": redis_server.url,
        "DYGSERVE_STORE__KEY_PREFIX": "crash",
        "DYGSERVE_MAX_BATCH_EVENTS": str(MAX_EVENTS),
    }
    crashing = start_service(tmp_path, {**env, FAULT_ENV: "after_log"})
    proxy = TcpProxy(int(crashing.url.rsplit(":", 1)[1]))
    events = stream("crash", 200)
    attempts = Attempts()
    outcome: dict[str, Any] = {}
    patient = RetryPolicy(max_attempts=200, budget_s=120.0, base_delay_s=0.05, max_delay_s=0.5)
    client = DygserveClient(config(proxy.url, api_key=None, retry=patient), on_attempt=attempts)
    restarted: ServiceProcess | None = None

    def ingest() -> None:
        try:
            outcome["result"] = client.ingest(events)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    worker = threading.Thread(target=ingest)
    try:
        worker.start()
        assert crashing.proc.wait(timeout=60) == CRASH_EXIT_CODE
        restarted = start_service(tmp_path, env)
        proxy.set_upstream(int(restarted.url.rsplit(":", 1)[1]))
        worker.join(timeout=150)
        assert not worker.is_alive()
        assert "error" not in outcome, outcome.get("error")
        result = outcome["result"]
        assert result.duplicates == MAX_EVENTS  # the batch the crashed process logged
        assert result.accepted == len(events) - MAX_EVENTS and result.rejected == []
        assert sum(a.status is None for a in attempts.events()) >= 1
        with DygserveClient(config(restarted.url, api_key=None)) as direct:
            assert_applied_once(direct, events)
    finally:
        client.close()
        proxy.close()
        crashing.stop()
        if restarted is not None:
            restarted.stop()


# --------------------------------------------------------------------------- Retry-After


def test_retry_after_is_honoured_on_503_from_a_stopped_redis(models_dir, tmp_path):
    port = free_port()
    redis = start_redis(tmp_path / "r", port=port, appendfsync="always")
    svc = start_service(
        tmp_path,
        {"DYGSERVE_CHECKPOINT": str(models_dir / "a"), "DYGSERVE_REDIS_URL": redis.url},
    )
    first_503 = threading.Event()
    attempts = Attempts()

    def hook(attempt: Attempt) -> None:
        attempts(attempt)
        if attempt.status == 503:
            first_503.set()

    patient = RetryPolicy(max_attempts=60, budget_s=90.0, base_delay_s=0.05, max_delay_s=0.2)
    outcome: dict[str, Any] = {}
    events = stream("outage", 120)
    client = DygserveClient(config(svc.url, api_key=None, retry=patient), on_attempt=hook)
    try:
        assert client.ingest(events[:20]).accepted == 20
        redis.stop()
        worker = threading.Thread(target=lambda: outcome.update(result=client.ingest(events[20:])))
        worker.start()
        assert first_503.wait(timeout=60)
        redis = start_redis(tmp_path / "r", port=port, appendfsync="always")  # same files
        worker.join(timeout=120)
        assert not worker.is_alive() and "result" in outcome
        refused = [a for a in attempts.events() if a.status == 503]
        assert refused
        for a in refused:
            assert a.retry_after_s == 1.0  # what the service asks for a store outage
            assert a.retry_in_s is not None
            # never earlier than asked; the jitter after it is at most max_delay_s
            assert a.retry_after_s <= a.retry_in_s <= a.retry_after_s + patient.max_delay_s
        assert outcome["result"].accepted + outcome["result"].duplicates == 100
        assert_applied_once(client, events)
    finally:
        client.close()
        svc.stop()
        redis.stop()


# --------------------------------------------------------------------------- batches and order


@pytest.mark.parametrize("id_bytes", [8, 200], ids=["count-bound", "byte-bound"])
def test_batches_stay_under_the_service_limits(service, id_bytes):
    events = stream(f"lim{id_bytes}", 500)
    for i, e in enumerate(events):
        e["event_id"] = f"{i:0{id_bytes}d}"
    attempts = Attempts()
    with DygserveClient(config(service.url), on_attempt=attempts) as client:
        result = client.ingest(events)
    sent = attempts.events()
    assert all(a.status == 200 for a in sent)  # never a 413
    assert all(a.items is not None and a.items <= MAX_EVENTS for a in sent)
    assert all(a.request_bytes <= MAX_BYTES for a in sent)
    assert sum(a.items or 0 for a in sent) == len(events) == result.accepted
    assert result.requests == len(sent)
    if id_bytes == 8:
        assert len(sent) == len(events) // MAX_EVENTS
    else:  # 50 events with 200-byte ids are ~15 KB: the byte limit cuts first
        assert len(sent) > len(events) // MAX_EVENTS
        assert max(a.request_bytes for a in sent) > MAX_BYTES * 0.8  # batches are filled


def test_limits_above_the_service_s_are_refused_as_payload_too_large(service):
    events = stream("toolarge", 120)
    attempts = Attempts()
    cfg = config(
        service.url, limits=BatchLimits(max_batch_events=100, max_body_bytes=MAX_BYTES * 4)
    )
    with DygserveClient(cfg, on_attempt=attempts) as client:
        with pytest.raises(PayloadTooLarge) as caught:
            client.ingest(events)
    err = caught.value
    assert err.status == 413 and not err.local and "8192 bytes" in err.message
    assert len(attempts) == 1  # a 4xx is never retried
    assert err.progress is not None and err.progress.answered.requests == 0
    assert err.progress.remaining_index == list(range(len(events)))


def test_an_event_alone_over_the_byte_limit_is_refused_before_sending(service):
    attempts = Attempts()
    big = {"src": "x" * 250, "dst": "y" * 250, "t": 1.0, "features": [0.0, 0.0]}
    small = config(service.url, limits=BatchLimits(max_body_bytes=500))
    with DygserveClient(small, on_attempt=attempts) as client:
        with pytest.raises(PayloadTooLarge) as caught:
            client.ingest([big])
    assert caught.value.local and "events[0]" in caught.value.message
    assert attempts == []  # nothing went out


@pytest.mark.parametrize("concurrency", [1, 4])
def test_per_node_order_is_kept_across_batches(service, data_dir, concurrency):
    """A real stream (UCI, time-ordered, hubs in most batches) cut into 50-event
    requests: any event of a node that reached the service before an earlier one of the
    same node would be refused as late; none is, and every node counts all its events."""
    from training.data import read_edge_stream

    uci = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=1000)
    events = [
        {"src": f"o{concurrency}-{s}", "dst": f"o{concurrency}-{d}", "t": float(t)}
        for s, d, t in zip(uci.src, uci.dst, uci.t, strict=True)
        if s != d
    ]
    for e in events:
        e["features"] = [0.0, 1.0]

    async def run() -> Any:
        async with AsyncDygserveClient(config(service.url)) as client:
            return await client.ingest(events, concurrency=concurrency)

    result = asyncio.run(run())
    assert result.rejected == [] and result.accepted == len(events)
    assert result.requests == math.ceil(len(events) / MAX_EVENTS)
    with DygserveClient(config(service.url)) as client:
        assert_applied_once(client, events)


def test_a_late_event_is_reported_at_its_input_index_and_not_resent(service):
    events = stream("late", 120)
    late_at = 110  # in the third request: its node has moved on to later times
    events[late_at] = dict(events[late_at], src=events[5]["src"], t=3.0)
    attempts = Attempts()
    with DygserveClient(config(service.url), on_attempt=attempts) as client:
        result = client.ingest(events)
        assert [r.index for r in result.rejected] == [late_at]
        assert result.rejected[0].reason.startswith("late")
        assert result.accepted == len(events) - 1
        assert len(attempts) == result.requests == 3  # nothing resent
        # its id was not remembered: sent again, it is late again, not a duplicate
        again = client.ingest([dict(events[late_at], event_id=result.event_ids[late_at])])
        assert (again.accepted, again.duplicates, len(again.rejected)) == (0, 0, 1)


# --------------------------------------------------------------------------- errors


def test_4xx_answers_raise_typed_errors_and_are_never_retried(service, models_dir):
    attempts = Attempts()
    event = {"src": "err-a", "dst": "err-b", "t": 1.0, "features": [0.0, 0.0]}
    with DygserveClient(config(service.url, api_key=None), on_attempt=attempts) as anon:
        with pytest.raises(Unauthorized, match="missing X-API-Key") as no_key:
            anon.ingest([event])
        assert no_key.value.status == 401
    with DygserveClient(config(service.url, api_key="wrong"), on_attempt=attempts) as wrong:
        with pytest.raises(Forbidden, match="wrong X-API-Key"):
            wrong.ingest([event])
    with DygserveClient(config(service.url), on_attempt=attempts) as client:
        with pytest.raises(Forbidden, match="models directory"):
            client.reload("../../..")
        with pytest.raises(ValidationFailed, match="the model expects 2") as bad_dim:
            client.ingest([dict(event, features=[1.0, 2.0, 3.0])])
        assert bad_dim.value.issues == [] and not bad_dim.value.local
        with pytest.raises(ValidationFailed, match="checkpoint refused"):
            client.reload("no-such-checkpoint")
    with DygserveClient(config(service.url + "/nowhere"), on_attempt=attempts) as lost:
        with pytest.raises(NotFound):
            lost.model()
    assert [a.status for a in attempts] == [401, 403, 403, 422, 422, 404]
    assert all(a.retry_in_s is None for a in attempts)


def test_local_validation_refuses_what_the_service_would_with_the_same_locations(service):
    bad = {"src": "v-a", "dst": "v-b", "t": float("nan"), "colour": "red"}
    attempts = Attempts()
    with DygserveClient(config(service.url), on_attempt=attempts) as client:
        with pytest.raises(ValidationFailed) as local:
            client.ingest([bad])
    assert local.value.local and attempts == []
    # the service's refusal of the same event (the client told not to check)
    unchecked = config(service.url, validate_requests=False)
    with DygserveClient(unchecked, on_attempt=attempts) as client:
        with pytest.raises(ValidationFailed) as remote:
            client.ingest([dict(bad, t=1e30)])  # NaN is not JSON: an out-of-range t instead
    assert not remote.value.local and len(attempts) == 1
    local_locs = {tuple(i.loc) for i in local.value.issues}
    remote_locs = {tuple(i.loc) for i in remote.value.issues}
    assert ("body", "events", 0, "colour") in local_locs & remote_locs
    assert ("body", "events", 0, "t") in local_locs & remote_locs


def test_a_spent_retry_budget_keeps_the_ids_for_a_resend(service):
    nothing = f"http://127.0.0.1:{free_port()}"  # no one listens there
    events = stream("budget", 80)
    attempts = Attempts()
    cfg = config(nothing, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01))
    with DygserveClient(cfg, on_attempt=attempts) as client:
        with pytest.raises(RetriesExhausted) as caught:
            client.ingest(events)
    err = caught.value
    assert err.attempts == 3 and err.last_status is None
    assert [a.error for a in attempts] == ["ConnectError"] * 3
    assert [a.retry_in_s is None for a in attempts] == [False, False, True]
    progress = err.progress
    assert progress is not None and progress.answered.accepted == 0
    assert progress.remaining_index == list(range(len(events)))
    ids = [e["event_id"] for e in progress.remaining]
    assert len(set(ids)) == len(events) and ids == progress.answered.event_ids
    # the caller resends what is left, with the ids it was given, to the service
    with DygserveClient(config(service.url)) as client:
        assert client.ingest(progress.remaining).event_ids == ids
        assert_applied_once(client, events)


def test_event_ids_from_keys_make_a_restarted_producer_exactly_once(service):
    events = stream("keyed", 60)
    keyed = [dict(e, event_id=event_id_from_key("orders", i)) for i, e in enumerate(events)]
    with DygserveClient(config(service.url)) as client:
        assert client.ingest(keyed).accepted == 60
    with DygserveClient(config(service.url)) as fresh:  # another process, same keys
        rebuilt = [dict(e, event_id=event_id_from_key("orders", i)) for i, e in enumerate(events)]
        assert fresh.ingest(rebuilt).duplicates == 60
        assert_applied_once(fresh, events)


# --------------------------------------------------------------------------- every route


def test_every_route_with_the_blocking_client(service):
    events = stream("routes", 60)
    with DygserveClient(config(service.url)) as client:
        assert client.health().status == "ok"
        assert client.wait_ready(timeout_s=10).ready
        client.ingest(events)
        info = client.model()
        one = client.score("routes-1", "routes-2", 100.0)
        assert one.model_version == info.model_version and 0.0 < one.probability < 1.0
        assert not one.src_inductive and not one.clamped
        many = client.score_pairs([("routes-1", "routes-2", 100.0), ("routes-3", "routes-4")])
        assert abs(many.scores[0].logit - one.logit) < 1e-5 and len(many.scores) == 2
        ranked = client.rank("routes-1", ["routes-2", "routes-3", "routes-4"], 100.0)
        logits = [r.logit for r in ranked.ranking]
        assert logits == sorted(logits, reverse=True) and len(logits) == 3
        node = client.node("routes-1")
        assert node.events_applied == per_node(events)["routes-1"][0]
        weird = client.node("a b?c=%d#e")  # an id the path must carry as one segment
        assert weird.node == "a b?c=%d#e" and weird.history_length == 0
        assert "dygserve_events_ingested_total" in client.metrics()
        other = client.reload("b")
        assert other.model_version != info.model_version
        assert client.reload("a").model_version == info.model_version


def test_ingests_go_to_the_ingest_url_and_the_reads_see_them(
    service, models_dir, redis_server, tmp_path
):
    writer = start_service(
        tmp_path,
        {
            "DYGSERVE_CHECKPOINT": str(models_dir / "a"),
            "DYGSERVE_MODELS_DIR": str(models_dir),
            "DYGSERVE_REDIS_URL": redis_server.url,
            "DYGSERVE_API_KEY": KEY,
        },
    )
    try:
        events = stream("split", 60)
        attempts = Attempts()
        before = events_logged(service.url, KEY), events_logged(writer.url, KEY)
        cfg = config(service.url, ingest_url=writer.url + "/")
        with DygserveClient(cfg, on_attempt=attempts) as client:
            assert client.ingest(events).accepted == 60
            assert_applied_once(client, events)  # read on the other replica
            one = client.score("split-1", "split-2", 100.0)
        assert events_logged(writer.url, KEY) - before[1] == 60
        assert events_logged(service.url, KEY) == before[0]
        assert len(attempts.events()) == 2 and 0.0 < one.probability < 1.0
    finally:
        writer.stop()
    with pytest.raises(ValueError, match="ingest_url"):
        ClientConfig(ingest_url="redis://nope")


def test_score_pairs_are_cut_under_the_limits_and_keep_their_order(service):
    events = stream("cutpairs", 60)
    pairs = [(f"cutpairs-{i % 10}", f"cutpairs-{(i * 3 + 1) % 10}", 70.0) for i in range(240)]
    attempts = Attempts()
    small = BatchLimits(max_batch_events=MAX_EVENTS, max_score_pairs=100, max_body_bytes=MAX_BYTES)
    with DygserveClient(config(service.url, limits=small), on_attempt=attempts) as client:
        client.ingest(events)
        answer = client.score_pairs(pairs)
        singles = [client.score(s, d, t).logit for s, d, t in pairs[:5] + pairs[-5:]]
    posts = [a for a in attempts if a.path == "/v1/score" and a.method == "POST"]
    assert len(posts) == 3 and all((a.items or 0) <= 100 for a in posts)
    assert [(s.src, s.dst) for s in answer.scores] == [(s, d) for s, d, _ in pairs]
    got = [s.logit for s in answer.scores[:5] + answer.scores[-5:]]
    assert max(abs(a - b) for a, b in zip(got, singles, strict=True)) < 1e-5


@pytest.mark.anyio
async def test_every_route_with_the_async_client_in_process(models_dir, redis_server):
    settings = Settings(
        checkpoint=models_dir / "a",
        models_dir=models_dir,
        api_key=KEY,
        max_batch_events=MAX_EVENTS,
        max_body_bytes=MAX_BYTES,
        store={"url": redis_server.url, "key_prefix": "inproc"},
    )
    app = create_app(settings)
    events = stream("aroutes", 200)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        cfg = config("http://in-process", limits=BatchLimits.from_settings(settings))
        async with AsyncDygserveClient(cfg, transport=transport) as client:
            assert (await client.health()).status == "ok"
            assert (await client.ready()).ready
            result = await client.ingest(events, concurrency=2)
            assert result.accepted == 200 and result.requests == 4
            info = await client.model()
            one = await client.score("aroutes-1", "aroutes-2", 300.0)
            many = await client.score_pairs([("aroutes-1", "aroutes-2", 300.0)])
            assert abs(many.scores[0].logit - one.logit) < 1e-5
            ranked = await client.rank("aroutes-1", ["aroutes-2", "aroutes-3"], 300.0)
            assert {r.dst for r in ranked.ranking} == {"aroutes-2", "aroutes-3"}
            node = await client.node("aroutes-1")
            assert node.events_applied == per_node(events)["aroutes-1"][0]
            assert "dygserve_" in await client.metrics()
            assert (await client.reload("b")).model_version != info.model_version
            with pytest.raises(Forbidden):
                await client.reload("../..")
            again = await client.ingest(
                [dict(e, event_id=i) for e, i in zip(events, result.event_ids, strict=True)]
            )
            assert again.duplicates == 200


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_limits_from_the_service_environment():
    env = {"DYGSERVE_MAX_BATCH_EVENTS": "50", "DYGSERVE_MAX_BODY_BYTES": "8192"}
    limits = BatchLimits.from_env(env)
    assert (limits.max_batch_events, limits.max_body_bytes) == (50, 8192)
    assert limits.max_score_pairs == Settings().max_score_pairs  # unset: the service default
    assert BatchLimits() == BatchLimits.from_settings(Settings())


def test_a_bare_url_is_a_config():
    client = DygserveClient("http://127.0.0.1:9")
    try:
        assert client.config.url == "http://127.0.0.1:9" and client.config.assign_event_ids
    finally:
        client.close()
    with pytest.raises(ValueError, match="http"):
        ClientConfig(url="127.0.0.1:8000")
