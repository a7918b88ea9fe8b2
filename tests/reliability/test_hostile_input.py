"""Hostile input beyond tests/service/test_bad_input.py, against the real service on a
real Redis: every refused request must change nothing in Redis (a digest of every key
and value is compared), every accepted one must leave finite states, and nothing may
answer 5xx.

Covered here (not there): chunked bodies without Content-Length over the limit; 1 MB
ids in query strings and paths; absurd timestamps (+-1e300, +-1.8e308, integers of 400
digits, beyond +-1e20) on ingest and on scoring; the far-future policy (per-event
"future" rejection); multibyte ids over 256 bytes; lone surrogates; features outside
float32; ids that look like the Redis key syntax; duplicate ids inside one batch;
form/multipart/XML content types; the API key compared in constant time.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import socket
import time
from urllib.parse import quote

import httpx
import pytest

from service.engine import ModelRuntime
from tests.service.conftest import make_checkpoint
from tests.support.redis_server import redis_available, start_redis

from .helpers import REPO, redis_store, serve

KEY = "k3y-hostile"
MAX_BODY = 65536
SKEW = 1e6


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    root = tmp_path_factory.mktemp("hostile")
    redis = start_redis(root / "redis")
    make_checkpoint(root / "ck", seed=0, edge_feature_dim=2)
    svc = serve(
        root / "svc",
        {
            "DYGSERVE_REDIS_URL": redis.url,
            "DYGSERVE_CHECKPOINT": str(root / "ck"),
            "DYGSERVE_API_KEY": KEY,
            "DYGSERVE_MAX_BODY_BYTES": str(MAX_BODY),
            "DYGSERVE_MAX_BATCH_EVENTS": "100",
            "DYGSERVE_MAX_FUTURE_SKEW": str(SKEW),
        },
    )
    runtime = ModelRuntime.load(root / "ck")
    with httpx.Client(base_url=svc.url, timeout=30.0, headers={"X-API-Key": KEY}) as c:
        r = c.post(
            "/v1/events",
            json={
                "events": [{"src": "base-a", "dst": "base-b", "t": 100.0, "features": [1.0, 2.0]}]
            },
        )
        assert r.json()["accepted"] == 1
    yield svc, redis, runtime
    svc.stop()
    redis.stop()


@pytest.fixture()
def client(stack):
    with httpx.Client(base_url=stack[0].url, timeout=30.0, headers={"X-API-Key": KEY}) as c:
        yield c


def digest(redis) -> str:
    """Every key and value in Redis (DUMP), order-independent."""
    h = hashlib.sha256()
    with redis.client() as r:
        for k in sorted(r.scan_iter(count=1000)):
            h.update(k + b"\0" + (r.dump(k) or b"") + b"\0")
    return h.hexdigest()


def port_of(svc) -> int:
    return int(svc.url.rsplit(":", 1)[1])


def raw_http(svc, request: bytes, settle: float = 0.0) -> bytes:
    """Send raw bytes, read the answer (until the server closes or 64 KB)."""
    with socket.create_connection(("127.0.0.1", port_of(svc)), timeout=20) as s:
        s.sendall(request)
        if settle:
            time.sleep(settle)
        data = b""
        while len(data) < 65536:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and len(body) >= int(
                        line.split(b":")[1]
                    ):
                        return data
    return data


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def finite_states(stack, nodes: list[str]) -> bool:
    _, redis, runtime = stack
    store = redis_store(redis.url)
    try:
        blobs = store.read_states(runtime.version, nodes)
    finally:
        store.close()
    assert all(b is not None for b in blobs), nodes
    st = runtime.codec.decode_many(blobs)
    return bool(st.h.isfinite().all() and st.conv.isfinite().all())


def ev(src, dst, t, **kw):
    return {"src": src, "dst": dst, "t": t, "features": [0.5, -0.5], **kw}


# ----------------------------------------------------------------------------- bodies


def chunked_request(body: bytes, terminate: bool) -> bytes:
    head = (
        b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"X-API-Key: "
        + KEY.encode()
        + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096])
        for i in range(0, len(body), 4096)
    )
    return head + chunks + (b"0\r\n\r\n" if terminate else b"")


def events_body(n: int, prefix: str) -> bytes:
    return json.dumps(
        {"events": [ev(f"{prefix}{i}", f"{prefix}x", 1000.0 + i) for i in range(n)]}
    ).encode()


def test_chunked_body_over_the_limit_is_413(stack, client, figures):
    svc, redis, _ = stack
    before = digest(redis)
    body = events_body(1000, "chunk-big-")  # ~85 KB, sent without Content-Length
    assert len(body) > MAX_BODY
    # the client stops right after crossing the limit and waits for the answer
    answer = raw_http(svc, chunked_request(body[: MAX_BODY + 8192], terminate=False), settle=0.3)
    assert status_of(answer) == 413, answer[:300]
    assert b"body over" in answer

    def stream():
        for i in range(0, len(body), 1024):
            yield body[i : i + 1024]

    try:  # a client that streams the whole body: 413, or the server drops it mid-upload
        r = httpx.post(
            f"{svc.url}/v1/events",
            content=stream(),
            headers={"X-API-Key": KEY, "content-type": "application/json"},
        )
        assert r.status_code == 413, (r.status_code, r.text[:200])
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        pass
    assert digest(redis) == before
    figures.update(chunked_bytes_sent=MAX_BODY + 8192, limit=MAX_BODY)


def test_chunked_body_under_the_limit_is_accepted(stack):
    body = events_body(20, "chunk-small-")
    answer = raw_http(stack[0], chunked_request(body, terminate=True))
    assert status_of(answer) == 200 and b'"accepted":20' in answer, answer[-300:]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/xml",
        "text/csv",
    ],
)
def test_wrong_content_types_are_refused(stack, client, content_type):
    before = digest(stack[1])
    payload = json.dumps({"events": [ev("ct-a", "ct-b", 500.0)]})
    if content_type.startswith("multipart"):
        payload = f'--xyz\r\nContent-Disposition: form-data; name="events"\r\n\r\n{payload}\r\n--xyz--\r\n'
    elif content_type.endswith("urlencoded"):
        payload = "events=" + quote(payload)
    r = client.post("/v1/events", content=payload.encode(), headers={"content-type": content_type})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert digest(stack[1]) == before


# ----------------------------------------------------------------------------- ids


def test_megabyte_ids_in_query_strings_and_paths(stack, client, figures):
    svc, redis, _ = stack
    before = digest(redis)
    mb = "x" * 1_000_000
    answers = {
        "score query": raw_http(
            svc,
            f"GET /v1/score?src={mb}&dst=b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode(),
        ),
        "node path": raw_http(
            svc, f"GET /v1/nodes/{mb} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
        ),
        "60 KB query": raw_http(
            svc,
            f"GET /v1/score?src={'y' * 60_000}&dst=b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode(),
        ),
    }
    codes = {k: status_of(v) for k, v in answers.items()}
    assert all(400 <= c < 500 for c in codes.values()), codes
    # 256 characters but 1,024 bytes
    assert client.get(f"/v1/nodes/{quote(chr(0x1F600) * 256)}").status_code == 422
    assert client.get("/healthz").status_code == 200
    assert digest(redis) == before
    figures.update(query_id_bytes=len(mb), answers=codes)


def test_oversized_and_invalid_ids_are_refused(stack, client):
    before = digest(stack[1])
    bodies = {
        "event id of 65 emoji (260 bytes)": json.dumps(
            {"events": [ev("id-a", "id-b", 600.0, event_id=chr(0x1F600) * 65)]}
        ),
        "node id of 129 'é' (258 bytes)": json.dumps({"events": [ev("é" * 129, "id-b", 600.0)]}),
        "lone surrogate src": '{"events": [{"src": "\\ud800", "dst": "id-b", "t": 600.0, "features": [0, 0]}]}',
        "lone surrogate event id": '{"events": [{"src": "id-a", "dst": "id-b", "t": 600.0, "features": [0, 0], "event_id": "\\udfff"}]}',
        "integer id of 5000 digits": '{"events": [{"src": '
        + "9" * 5000
        + ', "dst": "id-b", "t": 600.0, "features": [0, 0]}]}',
        "empty event id": json.dumps({"events": [ev("id-a", "id-b", 600.0, event_id="")]}),
    }
    for name, body in bodies.items():
        r = client.post(
            "/v1/events", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert r.status_code in (400, 422), (name, r.status_code, r.text[:200])
    for path in ("/v1/nodes/%ED%A0%80", "/v1/nodes/%FF%FE", "/v1/score?src=%ED%A0%80&dst=b"):
        assert client.get(path).status_code < 500, path
    assert digest(stack[1]) == before
    # exactly 256 bytes is fine
    r = client.post(
        "/v1/events",
        json={"events": [ev(chr(0x1F600) * 64, "id-b", 600.0, event_id=chr(0x1F601) * 64)]},
    )
    assert r.status_code == 200 and r.json()["accepted"] == 1


def test_ids_that_look_like_key_syntax_stay_distinct(stack, client):
    ids = [
        "ks",
        "ks}",
        "{ks}",
        "ks}:s:0123456789abcdef",
        "ks:h:x",
        "ks\x00",
        "ks\n",
        "ks\u00fc",
        "ks\u202e",
        "ks:{P:log}:seq",
    ]
    events = [ev(n, "ks-hub", 700.0 + i, event_id=f"{{eid}}:{i}:{n}") for i, n in enumerate(ids)]
    r = client.post("/v1/events", json={"events": events}).json()
    assert r["accepted"] == len(ids), r
    for n in ids:
        s = client.get(f"/v1/nodes/{quote(n, safe='')}").json()
        assert s["node"] == n and s["events_applied"] == s["history_length"] == 1, (n, s)
    assert client.get("/v1/nodes/ks-hub").json()["events_applied"] == len(ids)
    assert finite_states(stack, ids + ["ks-hub"])


def test_duplicate_event_ids_inside_one_batch(stack, client):
    r = client.post(
        "/v1/events",
        json={
            "events": [
                ev("dup-a", "dup-b", 800.0, event_id="same"),
                ev("dup-a", "dup-c", 801.0, event_id="same"),
            ]
        },
    ).json()
    assert r["accepted"] == 1 and r["duplicates"] == 1, r
    assert client.get("/v1/nodes/dup-a").json()["events_applied"] == 1
    assert client.get("/v1/nodes/dup-c").json()["history_length"] == 0


# ----------------------------------------------------------------------------- numbers


ABSURD_TIMES = [
    "-1e300",
    "1e300",
    "-1.7976931348623157e308",
    "1.7976931348623157e308",
    "1e21",
    "-1e21",
    "1" + "0" * 400,
    "-1" + "0" * 400,
]


def test_absurd_timestamps_are_refused_and_change_nothing(stack, client, figures):
    before = digest(stack[1])
    tried = 0
    for t in ABSURD_TIMES:
        body = '{"events": [{"src": "abs-a", "dst": "abs-b", "t": ' + t + ', "features": [0, 0]}]}'
        r = client.post(
            "/v1/events", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 422, (t, r.status_code, r.text[:200])
        for path, payload in (
            ("/v1/score", '{"pairs": [{"src": "base-a", "dst": "base-b", "t": ' + t + "}]}"),
            ("/v1/rank", '{"src": "base-a", "t": ' + t + ', "candidates": ["base-b"]}'),
        ):
            r = client.post(
                path, content=payload.encode(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 422, (path, t, r.status_code)
        r = client.get("/v1/score", params={"src": "base-a", "dst": "base-b", "t": t})
        assert r.status_code == 422, (t, r.status_code)
        tried += 4
    assert digest(stack[1]) == before
    figures.update(absurd_timestamps=len(ABSURD_TIMES), requests=tried)


def test_extreme_but_allowed_timestamps_keep_states_finite(stack, client):
    # -1e20 (the bound), then a gap of 1e20 to t=0: accepted under the late/future policy
    r = client.post(
        "/v1/events",
        json={
            "events": [ev("lo-a", "lo-b", -1e20), ev("lo-a", "lo-c", -5.0), ev("lo-a", "lo-b", 0.0)]
        },
    )
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    assert finite_states(stack, ["lo-a", "lo-b", "lo-c"])
    for t in (1e20, -1e20, 0.0, 1.5):
        s = client.get("/v1/score", params={"src": "lo-a", "dst": "lo-b", "t": t}).json()
        assert math.isfinite(s["logit"]) and 0.0 <= s["probability"] <= 1.0, (t, s)
    ranked = client.post(
        "/v1/rank", json={"src": "lo-a", "t": 1e20, "candidates": ["lo-b", "lo-c", "base-a"]}
    ).json()
    assert all(math.isfinite(x["logit"]) for x in ranked["ranking"])


def test_far_future_event_is_rejected_per_event(stack, client):
    store = redis_store(stack[1].url)
    try:
        latest = store.last_event_time()
    finally:
        store.close()
    r = client.post(
        "/v1/events",
        json={
            "events": [
                ev("ff-a", "ff-b", latest),
                ev("ff-c", "ff-d", latest + 10 * SKEW),
                ev("ff-e", "ff-f", latest + SKEW / 2),
            ]
        },
    ).json()
    assert r["accepted"] == 2, r
    assert [x["index"] for x in r["rejected"]] == [1] and r["rejected"][0]["reason"].startswith(
        "future"
    ), r
    assert client.get("/v1/nodes/ff-c").json()["history_length"] == 0
    assert client.get("/v1/nodes/ff-a").json()["events_applied"] == 1
    # the far-future event did not move the clock: an event just after `latest` is not late
    r = client.post("/v1/events", json={"events": [ev("ff-a", "ff-g", latest + 1.0)]}).json()
    assert r["accepted"] == 1, r


def test_features_outside_float32_are_refused(stack, client):
    before = digest(stack[1])
    for feats in ("[1e39, 0]", "[0, -3.5e38]", "[1e308, 1]", "[" + "9" * 400 + ", 0]"):
        body = '{"events": [{"src": "f-a", "dst": "f-b", "t": 900.0, "features": ' + feats + "}]}"
        r = client.post(
            "/v1/events", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 422, (feats, r.status_code, r.text[:200])
    assert digest(stack[1]) == before
    r = client.post(
        "/v1/events",
        json={
            "events": [
                ev("f-a", "f-b", 900.0, features=[3.4e38, -3.4e38]),
                ev("f-a", "f-c", 901.0, features=[1e-45, 0.0]),
            ]
        },
    )
    assert r.json()["accepted"] == 2
    assert finite_states(stack, ["f-a", "f-b", "f-c"])


# ----------------------------------------------------------------------------- auth


def test_api_key_is_compared_in_constant_time():
    """Code-level: the key check is hmac.compare_digest, and the key is never compared
    with == / != (which stops at the first differing byte)."""
    tree = ast.parse((REPO / "service" / "auth.py").read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "compare_digest"
        and getattr(n.func.value, "id", "") == "hmac"
    ]
    assert calls, "service/auth.py does not use hmac.compare_digest"
    names = {"given", "expected", "api_key"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops
        ):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            }
            assert not used & names, f"key compared with ==/!= at line {node.lineno}"


def test_odd_api_keys_are_refused_not_crashed(stack):
    svc = stack[0]
    body = json.dumps({"events": [ev("auth-a", "auth-b", 950.0)]}).encode()
    for key, want in (
        (b"", 401),
        (b"\xff\xfe", 403),
        (KEY.encode() + b"\x00", 403),
        (b"k" * 8192, 403),
        (KEY.upper().encode(), 403),
        (KEY[:-1].encode(), 403),
    ):
        req = (
            b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nX-API-Key: "
            + key
            + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        code = status_of(raw_http(svc, req))
        assert code in (want, 400), (key[:20], code)  # 400: a header value the HTTP parser refuses
    with httpx.Client(base_url=svc.url) as c:
        assert c.get("/v1/nodes/auth-a").json()["history_length"] == 0
