"""Fuzzing.

* schemathesis (its CLI, ``st run``) against the service's own /openapi.json, on a
  real Redis with an API key (so generated writes reach the Lua scripts): at least
  1,000 generated requests (positive and negative), checks ``not_a_server_error``
  (no 5xx) and ``response_schema_conformance`` (every answer matches the documented
  schema of its status code);
* hypothesis properties of the ingest validator (``service.schemas.EventsRequest``),
  fed through ``json.dumps``/``json.loads`` as FastAPI parses a body: whatever it
  accepts has finite, bounded times, ids of 1..256 UTF-8 bytes, float32-finite
  features, and survives the engine's own conversions; anything non-finite or
  oversized is refused; and the only way it refuses is a ``ValidationError``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from model.node_ids import MAX_ID_BYTES
from service.schemas import MAX_ABS_TIME, MAX_FEATURE, EventsRequest

from .helpers import serve

MIN_REQUESTS = 1000
KEY = "fuzz-key"


# ----------------------------------------------------------------------------- schemathesis


def served_requests(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    return int(
        sum(
            float(v)
            for v in re.findall(r"^dygserve_http_requests_total\{[^}]*\} (\S+)$", text, re.M)
        )
    )


def test_schemathesis_against_openapi(redis_aof, tmp_path, figures):
    # reloads are fuzzed too: only from under checkpoints/ (a fuzzed "default" reloads the same version)
    svc = serve(
        tmp_path / "svc",
        {
            "DYGSERVE_REDIS_URL": redis_aof.url,
            "DYGSERVE_API_KEY": KEY,
            "DYGSERVE_MODELS_DIR": str(Path(__file__).resolve().parents[2] / "checkpoints"),
        },
    )
    try:
        before = served_requests(svc.url)
        report = tmp_path / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{svc.url}/openapi.json",
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--max-examples",
            "200",
            "--seed",
            "20261121",
            "--workers",
            "2",
            "--header",
            f"X-API-Key: {KEY}",
            "--request-timeout",
            "30",
            "--report",
            "json",
            "--report-json-path",
            str(report),
            "--no-color",
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path
        )  # its cache goes there
        out = done.stdout[-6000:] + done.stderr[-2000:]
        data = json.loads(report.read_text())
        generated = data["test_cases"]["generated"]
        served = served_requests(svc.url) - before
        assert done.returncode == 0 and not data["failures"] and not data["errors"], out
        assert generated >= MIN_REQUESTS, (generated, out)
        assert served >= 0.8 * MIN_REQUESTS, (
            served
        )  # /healthz, /readyz and /metrics are not counted there
        assert svc.proc.poll() is None and httpx.get(f"{svc.url}/readyz").status_code == 200
        figures.update(
            requests_generated=generated,
            requests_counted_by_service=served,
            operations=data["operations"]["tested"],
            failures=len(data["failures"]),
        )
    finally:
        svc.stop()


# ----------------------------------------------------------------------------- hypothesis

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
ANY_CHAR = st.characters(codec=None)  # every code point, surrogates included

ids = st.one_of(
    st.text(max_size=20),
    st.text(
        alphabet=st.sampled_from(["a", "\u00e9", "\u20ac", "\U0001f600"]), min_size=60, max_size=270
    ),
    st.text(alphabet=ANY_CHAR, max_size=8),
    st.text(alphabet=SURROGATES, min_size=1, max_size=2),
    st.integers(),
    st.integers(min_value=-(10**300), max_value=10**300),
    st.booleans(),
    st.none(),
    st.floats(),
)
numbers = st.one_of(
    st.floats(),  # nan, +-inf, +-1.8e308, subnormals
    st.floats(min_value=-2 * MAX_ABS_TIME, max_value=2 * MAX_ABS_TIME),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from(
        [MAX_ABS_TIME, -MAX_ABS_TIME, math.nextafter(MAX_ABS_TIME, math.inf), MAX_FEATURE, 3.5e38]
    ),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
)
event = st.fixed_dictionaries(
    {"src": ids, "dst": ids, "t": numbers},
    optional={
        "features": st.one_of(st.none(), st.lists(numbers, max_size=3)),
        "event_id": ids,
        "extra": st.integers(),
    },
)
payload = st.one_of(
    st.fixed_dictionaries({"events": st.lists(event, max_size=4)}),
    st.fixed_dictionaries({"events": st.lists(event, max_size=2)}, optional={"more": st.none()}),
    st.lists(st.integers(), max_size=2),
    st.none(),
)


def _id_ok(x: object) -> bool:
    return isinstance(x, str) and 1 <= len(x.encode("utf-8")) <= MAX_ID_BYTES


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(payload)
def test_whatever_the_validator_accepts_is_sane(body):
    wire = json.loads(json.dumps(body))  # as FastAPI reads a body (NaN/Infinity literals included)
    try:
        req = EventsRequest.model_validate(wire)
    except ValidationError:
        return  # refused: the app answers 422 and nothing changes
    for e in req.events:
        assert _id_ok(e.src) and _id_ok(e.dst)
        assert e.event_id is None or _id_ok(e.event_id)
        assert isinstance(e.t, float) and math.isfinite(e.t) and abs(e.t) <= MAX_ABS_TIME
        for x in e.features or []:
            assert isinstance(x, float) and math.isfinite(x) and abs(x) <= MAX_FEATURE
    # the engine's own conversions and the store's encoding cannot fail on it
    for e in (x.model_dump() for x in req.events):
        float(e["t"]), [float(x) for x in e["features"] or []]
        orjson.dumps([e["src"], e["dst"], e["t"], e["features"] or [], e["event_id"] or ""])


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.floats(min_value=MAX_ABS_TIME, exclude_min=True, allow_infinity=False),
        st.floats(max_value=-MAX_ABS_TIME, exclude_max=True, allow_infinity=False),
        # integers are read as float64, whose spacing at 1e20 is 16,384: 1e20 + 1 IS 1e20
        st.integers(min_value=10**20 + 10**5),
        st.integers(max_value=-(10**20) - 10**5),
    )
)
def test_non_finite_or_out_of_range_times_are_refused(t):
    with pytest.raises(ValidationError):
        EventsRequest.model_validate(
            json.loads(json.dumps({"events": [{"src": "a", "dst": "b", "t": t}]}))
        )


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(["a", "\u00e9", "\u20ac", "\U0001f600"]), min_size=65, max_size=300
    ).filter(lambda s: len(s.encode("utf-8")) > MAX_ID_BYTES),
    st.sampled_from(["src", "dst", "event_id"]),
)
def test_ids_over_256_bytes_are_refused(long_id, field):
    e = {"src": "a", "dst": "b", "t": 1.0, field: long_id}
    with pytest.raises(ValidationError):
        EventsRequest.model_validate({"events": [e]})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=False).filter(lambda x: abs(x) > MAX_FEATURE), min_size=1, max_size=1
    )
)
def test_features_beyond_float32_are_refused(feats):
    with pytest.raises(ValidationError):
        EventsRequest.model_validate(
            {"events": [{"src": "a", "dst": "b", "t": 1.0, "features": feats}]}
        )


valid_id = st.one_of(
    st.text(min_size=1, max_size=64).filter(lambda s: len(s.encode("utf-8")) <= MAX_ID_BYTES),
    st.integers(min_value=0, max_value=10**12),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "src": valid_id,
                "dst": valid_id,
                "t": st.one_of(
                    st.floats(min_value=-MAX_ABS_TIME, max_value=MAX_ABS_TIME),
                    st.integers(-(10**15), 10**15),
                ),
            },
            optional={
                "event_id": st.text(min_size=1, max_size=64),
                "features": st.lists(st.floats(-1e30, 1e30), max_size=3),
            },
        ),
        max_size=5,
    )
)
def test_sane_events_are_accepted_unchanged(events):
    assume(
        all(
            not (isinstance(e["t"], float) and e["t"] == 0.0 and math.copysign(1, e["t"]) < 0)
            for e in events
        )
    )
    req = EventsRequest.model_validate(json.loads(json.dumps({"events": events})))
    for got, want in zip(req.events, events, strict=True):
        assert got.src == str(want["src"]) and got.dst == str(want["dst"])
        assert got.t == float(want["t"]) and got.event_id == want.get("event_id")
        assert got.features == (
            [float(x) for x in want["features"]] if "features" in want else None
        )
