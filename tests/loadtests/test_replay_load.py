"""The load generator and the soak against a tiny real HTTP server.

The server is a stand-in FastAPI app (defined here) that answers the v1 shapes of
``POST /v1/events``, ``GET /v1/score`` and ``POST /v1/score`` (plus ``/readyz``; the
generator reads the answers into the service's response models), with a
per-node "late" check like the real service's default policy. It counts what it
received, so the report's counts can be compared with the server's. It runs under
uvicorn in a thread on a free loopback port.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from loadtests.replay_load import (
    LoadConfig,
    _iter_batches,
    _make_batch,
    is_loopback_url,
    main,
    read_events,
    run_load,
    write_outputs,
)
from loadtests.report import ROUTE_EVENTS, ROUTE_SCORE_GET, ROUTE_SCORE_POST, LoadReport
from loadtests.soak import (
    SoakConfig,
    find_listening_pid,
    process_tree,
    run_soak,
    series_summary,
    tree_rss_bytes,
)

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- the stand-in


class StandIn:
    """Counts and per-node watermarks of the stand-in service; knobs make it fail."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.c: Counter[str] = Counter()
        self.last_t: dict[str, float] = {}
        self.event_ids: set[str] = set()
        self.fail_next_events = 0  # answer this many event requests with 503
        self.always_422 = False


def make_app(st: StandIn) -> FastAPI:
    app = FastAPI()

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"status": "ready"}

    @app.post("/v1/events")
    async def events(request: Request):
        st.c["event_requests"] += 1
        st.c[f"wait={request.query_params.get('wait', 'true')}"] += 1
        if st.always_422:
            return JSONResponse({"detail": "features: expected 0 values"}, status_code=422)
        if st.fail_next_events > 0:
            st.fail_next_events -= 1
            return JSONResponse({"detail": "overloaded"}, status_code=503)
        body = await request.json()
        evs = body.get("events")
        if not isinstance(evs, list) or not all(
            isinstance(e, dict) and {"src", "dst", "t"} <= e.keys() for e in evs
        ):
            return JSONResponse({"detail": "bad body"}, status_code=422)
        accepted, duplicates, rejected = 0, 0, []
        for i, e in enumerate(evs):
            st.c["events"] += 1
            src, dst, t = str(e["src"]), str(e["dst"]), float(e["t"])
            eid = e.get("event_id")
            if eid is not None and eid in st.event_ids:
                duplicates += 1
                continue
            if t < st.last_t.get(src, float("-inf")) or t < st.last_t.get(dst, float("-inf")):
                rejected.append({"index": i, "reason": "late"})
                continue
            st.last_t[src] = st.last_t[dst] = t
            if eid is not None:
                st.event_ids.add(eid)
            accepted += 1
        st.c["accepted"] += accepted
        st.c["duplicates"] += duplicates
        st.c["rejected"] += len(rejected)
        return {
            "accepted": accepted,
            "duplicates": duplicates,
            "rejected": rejected,
            "applied": True,
        }

    @app.get("/v1/score")
    async def score_one(src: str, dst: str, t: float) -> dict:
        st.c["score_get"] += 1
        st.c["pairs"] += 1
        return {
            "src": src,
            "dst": dst,
            "t": t,
            "probability": 0.5,
            "logit": 0.0,
            "model_version": "standin",
            "src_state_age": None,
            "dst_state_age": None,
            "src_inductive": True,
            "dst_inductive": True,
            "clamped": False,
        }

    @app.post("/v1/score")
    async def score_many(request: Request) -> dict:
        st.c["score_post"] += 1
        pairs = (await request.json())["pairs"]
        st.c["pairs"] += len(pairs)
        return {
            "scores": [
                {"src": p["src"], "dst": p["dst"], "t": p["t"], "probability": 0.5, "logit": 0.0}
                for p in pairs
            ],
            "model_version": "standin",
        }

    return app


@pytest.fixture(scope="module")
def standin():
    st = StandIn()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(st), log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not server.started:
        assert th.is_alive() and time.time() < deadline, "stand-in server did not start"
        time.sleep(0.02)
    yield st, f"http://127.0.0.1:{port}", port
    server.should_exit = True
    th.join(10)
    sock.close()


@pytest.fixture
def server(standin):
    st, url, port = standin
    st.reset()
    return st, url, port


@pytest.fixture
def uci(data_dir: Path) -> Path:
    return data_dir / "uci" / "edges.csv.gz"


def _assert_png(path: str | Path) -> None:
    p = Path(path)
    assert p.exists() and p.stat().st_size > 1000, p
    assert p.read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------- the CLI, ~3 s


def test_cli_replay_counts_match_server(server, uci, tmp_path):
    st, url, _ = server
    out = tmp_path / "load"
    cmd = [
        sys.executable,
        "-m",
        "loadtests.replay_load",
        "--url",
        url,
        "--data",
        str(uci),
        "--out",
        str(out),
        "--duration",
        "3",
        "--max-events",
        "50000",
        "--event-rate",
        "1500",
        "--batch-size",
        "50",
        "--concurrency",
        "3",
        "--score-rate",
        "40",
        "--score-mode",
        "mixed",
        "--score-batch",
        "8",
        "--score-concurrency",
        "2",
        "--progress",
        "0",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rep = LoadReport.read_json(out / "report.json")

    assert rep.stop_reason == "duration"
    assert 2.5 <= rep.elapsed_s < 10
    # what the client counted is what the server received and answered
    assert rep.events_sent == st.c["events"] > 1000
    assert rep.events_answered == rep.events_sent
    assert rep.events_accepted == st.c["accepted"] == rep.events_sent
    assert rep.events_rejected == st.c["rejected"] == 0  # gated ordering: never late per node
    assert rep.events_duplicate == 0 and rep.events_failed == 0
    assert rep.requests[ROUTE_EVENTS] == st.c["event_requests"] == rep.event_batches
    assert rep.score_requests[ROUTE_SCORE_GET] == st.c["score_get"] > 0
    assert rep.score_requests[ROUTE_SCORE_POST] == st.c["score_post"] > 0
    assert rep.score_pairs == st.c["pairs"] == st.c["score_get"] + 8 * st.c["score_post"]
    assert rep.errors == 0 and rep.errors_by_status == {}
    # rates and latency stats are consistent with the counts
    assert rep.events_per_s == pytest.approx(rep.events_answered / rep.elapsed_s)
    assert rep.pairs_per_s == pytest.approx(rep.score_pairs / rep.elapsed_s)
    assert rep.events_per_s < 1500 * 1.2  # the --event-rate cap held
    for route in (ROUTE_EVENTS, ROUTE_SCORE_GET, ROUTE_SCORE_POST):
        s = rep.latency[route]
        assert s.count == rep.requests[route]
        assert 0 < s.p50_ms <= s.p95_ms <= s.p99_ms <= s.max_ms
    assert sum(rep.timeline["events"]) == rep.events_answered
    assert sum(rep.timeline["pairs"]) == rep.score_pairs
    _assert_png(out / "latency_hist.png")
    _assert_png(out / "throughput.png")
    assert "events/s" in proc.stdout


# --------------------------------------------------------------------------- bounds and outcomes


def _cfg(url: str, uci: Path, **kw) -> LoadConfig:
    base = dict(
        url=url,
        data=str(uci),
        duration=20.0,
        batch_size=100,
        concurrency=2,
        score_rate=0.0,
        retries=0,
        max_errors=0,
    )
    base.update(kw)
    return LoadConfig(**base)


def test_max_events_is_a_hard_bound(server, uci, tmp_path):
    st, url, _ = server
    rep, lat = asyncio.run(run_load(_cfg(url, uci, max_events=777, concurrency=3)))
    assert rep.stop_reason == "max_events"
    assert rep.events_sent == rep.events_accepted == st.c["events"] == 777
    assert rep.event_batches == st.c["event_requests"] == 8
    write_outputs(rep, lat, tmp_path, plots=False)
    assert json.loads((tmp_path / "report.json").read_text())["events_sent"] == 777
    assert not (tmp_path / "latency_hist.png").exists()


@pytest.mark.parametrize("wait", [True, False])
def test_wait_false_is_sent_only_when_asked(server, uci, wait):
    st, url, _ = server
    st.reset()
    rep, _ = asyncio.run(run_load(_cfg(url, uci, max_events=300, wait=wait)))
    assert rep.events_accepted == 300
    asked, other = ("wait=true", "wait=false") if wait else ("wait=false", "wait=true")
    assert st.c[asked] == 3 and st.c[other] == 0  # three batches of 100


def test_late_events_count_as_rejected_not_errors(server, uci):
    st, url, _ = server
    table = read_events(uci, limit=400)
    hot = table.src[0]  # a node of the first event: make it "late" for everything after
    r = httpx.post(f"{url}/v1/events", json={"events": [{"src": hot, "dst": "zz", "t": 1e12}]})
    assert r.json()["accepted"] == 1
    st.c.clear()
    rep, _ = asyncio.run(run_load(_cfg(url, uci, max_events=400), table=table))
    expected = sum(1 for s, d in zip(table.src, table.dst, strict=True) if hot in (s, d))
    assert expected > 0
    assert rep.events_rejected == st.c["rejected"] == expected
    assert rep.rejected_by_reason == {"late": expected}
    assert rep.events_accepted == 400 - expected
    assert rep.errors == 0 and rep.events_failed == 0


def test_retries_on_503_use_event_ids(server, uci):
    st, url, _ = server
    st.fail_next_events = 2
    rep, _ = asyncio.run(run_load(_cfg(url, uci, max_events=300, concurrency=1, retries=2)))
    assert rep.retries == 2
    assert rep.errors_by_status == {"503": 2} and rep.status_counts[ROUTE_EVENTS]["503"] == 2
    assert rep.events_failed == 0 and rep.events_accepted == 300 == len(st.event_ids)
    assert rep.requests[ROUTE_EVENTS] == st.c["event_requests"] == 3 + 2


def test_persistent_4xx_stops_the_run(server, uci):
    st, url, _ = server
    st.always_422 = True
    rep, _ = asyncio.run(
        run_load(_cfg(url, uci, max_events=5000, concurrency=1, max_errors=5, retries=3))
    )
    assert rep.stop_reason == "too_many_errors"
    assert rep.errors_by_status == {"422": 5} and rep.retries == 0  # 422 is not retried
    assert rep.events_failed == rep.events_sent == 500 and rep.events_accepted == 0
    assert "features" in rep.error_samples["422"]


def test_refuses_non_loopback_hosts(uci, capsys):
    assert main(["--url", "http://10.1.2.3:8000", "--data", str(uci), "--progress", "0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["--url", "http://example.com", "--data", str(uci)]) == 2
    for url in (
        "http://127.0.0.1:8000",
        "http://localhost:1",
        "http://[::1]:8000",
        "http://127.3.2.1",
    ):
        assert is_loopback_url(url), url
    for url in (
        "http://0.0.0.0:8000",
        "http://192.168.1.1",
        "http://localhost.evil.com",
        "nonsense",
    ):
        assert not is_loopback_url(url), url
    LoadConfig(url="http://10.1.2.3:8000", allow_remote=True).validate()
    with pytest.raises(ValueError, match="allow-remote"):
        LoadConfig(url="http://10.1.2.3:8000").validate()
    with pytest.raises(ValueError, match="allow-remote"):  # the ingest URL is held to it too
        LoadConfig(ingest_url="http://10.1.2.3:8001").validate()
    with pytest.raises(ValueError, match="--ingest-url must be http"):
        LoadConfig(ingest_url="ftp://127.0.0.1:8001").validate()


# --------------------------------------------------------------------------- data and batches


def test_read_events_feature_columns(data_dir):
    mooc = read_events(data_dir / "mooc", limit=5)
    assert mooc.name == "mooc" and len(mooc) == 5
    assert mooc.feature_names == ("f0", "f1", "f2", "f3")
    assert mooc.features is not None and len(mooc.features[0]) == 4
    assert mooc.features[0][0] == -0.3199914794575269  # exact float64 text
    assert read_events(data_dir / "mooc", features="none", limit=3).features is None
    assert read_events(data_dir / "mooc", features="f2", limit=3).feature_names == ("f2",)
    assert read_events(data_dir / "bitcoin-otc", limit=3).feature_names == ("rating",)
    uci = read_events(data_dir / "uci" / "edges.csv.gz", limit=10, start_row=1)
    assert uci.features is None and uci.src[0] == "3" and uci.dst[0] == "4" and uci.t[0] == 114878.0
    assert read_events("uci", limit=2).name == "uci"  # a bare name under $DYGSERVE_DATA
    with pytest.raises(ValueError, match="no feature column"):
        read_events(data_dir / "uci", features="f9", limit=1)


def test_batches_in_order_and_loop_shifts_time(data_dir):
    table = read_events(data_dir / "uslegis", limit=250)
    cfg = LoadConfig(data="x", batch_size=100, max_events=700, loop=True, run_id="r")
    batches = [_make_batch(table, cfg, i, *b) for i, b in enumerate(_iter_batches(table, cfg))]
    assert [len(b.rows) for b in batches] == [100, 100, 50] * 2 + [100, 100]
    ts = [float(t) for b in batches for t in b.t]
    assert all(a <= b for a, b in zip(ts, ts[1:], strict=False)) and ts[250] > ts[249]
    ids = [e["event_id"] for b in batches for e in b.events]
    assert len(ids) == len(set(ids)) == 700
    cfg.loop = False
    assert sum(len(r) for r, _, _ in _iter_batches(table, cfg)) == 250


# --------------------------------------------------------------------------- soak


@pytest.fixture
def redis_url():
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert time.time() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def test_soak_samples_memory(server, uci, tmp_path, redis_url):
    st, url, port = server
    # the stand-in listens in this very process: the soak must find it by its port
    assert find_listening_pid(port) == os.getpid()
    load = _cfg(
        url,
        uci,
        duration=2.0,
        max_events=10**9,
        loop=True,
        event_rate=2000,
        score_rate=10,
        out=str(tmp_path),
    )
    res = asyncio.run(run_soak(SoakConfig(load=load, interval=0.5, redis_url=redis_url)))
    assert res["service_pid"] == os.getpid()
    samples = res["samples"]
    assert len(samples) >= 4
    assert all(s["service_rss_bytes"] and s["service_rss_bytes"] > 10 * 2**20 for s in samples)
    assert samples[-1]["events_answered"] == res["load"]["events_answered"] == st.c["events"] > 0
    if redis_url is not None:
        assert all(s["redis_used_memory_bytes"] > 0 for s in samples)
        assert res["summary"]["redis_used_memory_bytes"]["max"] > 0
    summ = res["summary"]["service_rss_bytes"]
    assert summ["start"] > 0 and summ["max"] >= summ["end"]
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert saved["load"]["stop_reason"] == "duration"
    for name in ("memory.png", "latency_hist.png", "throughput.png"):
        _assert_png(tmp_path / name)
    assert (tmp_path / "report.json").exists()


def test_process_tree_and_series_summary():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_tree(os.getpid())
        total, n = tree_rss_bytes(os.getpid())
        assert n >= 2 and total is not None and total > 0
    finally:
        child.kill()
        child.wait()
    s = series_summary([0, 60, 120, 180], [100, 100, 160, 220])
    assert s["start"] == 100 and s["end"] == 220 and s["growth"] == 120 and s["max"] == 220
    assert s["slope_per_min"] == pytest.approx(60.0)
    assert series_summary([0, 1], [None, None])["max"] is None


# --------------------------------------------------------------------------- open loop


def test_open_loop_sends_every_request_and_counts_from_due_times(server, uci):
    from loadtests.open_loop import OpenLoopConfig, pairs_from_csv, run_open_loop

    st, url, _ = server
    pairs = pairs_from_csv(uci, limit=2000, n=50)
    assert len(pairs) == 50 and all(t == pairs[0][2] for _, _, t in pairs)
    report = run_open_loop(OpenLoopConfig(url=url, rate=100, duration=1.5, threads=4), pairs)
    assert report.requests == 150 and report.errors == 0
    assert st.c["score_get"] == 150  # the server saw each one once
    assert report.latency.count == report.service.count == 150
    # latency from the due time includes any start delay, so it is never below the service time
    assert report.latency.p50_ms >= report.service.p50_ms > 0
    assert 50 < report.achieved_rate < 200


def test_open_loop_counts_failures_as_errors():
    from loadtests.open_loop import OpenLoopConfig, run_open_loop
    from tests.support.redis_server import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    report = run_open_loop(
        OpenLoopConfig(url=url, rate=50, duration=0.4, threads=2, timeout=1.0), [("a", "b", 1.0)]
    )
    assert report.requests == 20 and report.errors == 20 and report.latency.count == 0
