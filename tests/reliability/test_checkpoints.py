"""A tampered, truncated or mismatched checkpoint is refused at start (the process exits
non-zero with one clear line, with one worker and with several) and at hot reload
(422; the previous version keeps serving, requests during the attempts included).

* tampered: one byte of the weights flipped (same size; checksums.json unchanged);
* truncated: the weights cut in half;
* mismatched: the bundled config with the weights of another architecture, and a
  checksums.json recomputed to match (so only the shape check can catch it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from model.checkpoint import CHECKSUMS_FILE, CONFIG_FILE, WEIGHTS_FILE, _sha256, model_version
from tests.service.conftest import make_checkpoint
from tests.support.redis_server import free_port

from .helpers import DEFAULT_CHECKPOINT, REPO, serve, wait_until

REASONS = {
    "tampered": "does not match its sha256",
    "truncated": "does not match its sha256",
    "mismatched": "the config implies",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(DEFAULT_CHECKPOINT, root / "good")
    make_checkpoint(root / "other", seed=3, edge_feature_dim=0)  # a valid second checkpoint

    shutil.copytree(DEFAULT_CHECKPOINT, root / "tampered")
    w = bytearray((root / "tampered" / WEIGHTS_FILE).read_bytes())
    w[len(w) // 2] ^= 0x01
    (root / "tampered" / WEIGHTS_FILE).write_bytes(bytes(w))

    shutil.copytree(DEFAULT_CHECKPOINT, root / "truncated")
    w = (root / "truncated" / WEIGHTS_FILE).read_bytes()
    (root / "truncated" / WEIGHTS_FILE).write_bytes(w[: len(w) // 2])

    mm = root / "mismatched"
    shutil.copytree(DEFAULT_CHECKPOINT, mm)
    shutil.copy(root / "other" / WEIGHTS_FILE, mm / WEIGHTS_FILE)
    config_bytes, weights = (mm / CONFIG_FILE).read_bytes(), (mm / WEIGHTS_FILE).read_bytes()
    sums = {
        CONFIG_FILE: _sha256(config_bytes),
        WEIGHTS_FILE: _sha256(weights),
        "model_version": model_version(json.loads(config_bytes), weights),
    }
    (mm / CHECKSUMS_FILE).write_text(json.dumps(sums))
    return root


def run_serve(
    checkpoint: Path, workers: int = 1, redis_url: str | None = None
) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "DYGSERVE_WORKERS": str(workers)}
    if redis_url:
        env["DYGSERVE_REDIS_URL"] = redis_url
    cmd = [
        sys.executable,
        "-m",
        "service.cli",
        "serve",
        "--checkpoint",
        str(checkpoint),
        "--port",
        str(free_port()),
        "--log-level",
        "warning",
    ]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("kind", ["tampered", "truncated", "mismatched"])
def test_refused_at_start(models, kind):
    done = run_serve(models / kind)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: checkpoint refused:") and REASONS[kind] in last, last


def test_refused_at_start_with_several_workers(models, redis_aof):
    """uvicorn's supervisor used to exit 0 when its workers failed to load the checkpoint."""
    done = run_serve(models / "tampered", workers=2, redis_url=redis_aof.url)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "error: checkpoint refused:" in done.stderr


def test_refused_at_hot_reload_previous_version_keeps_serving(models, tmp_path, figures):
    svc = serve(
        tmp_path / "svc",
        {"DYGSERVE_CHECKPOINT": str(models / "good"), "DYGSERVE_MODELS_DIR": str(models)},
    )
    stop = threading.Event()
    served: list[tuple[int, str | None]] = []

    errors: list[str] = []

    def score_traffic() -> None:
        try:
            with httpx.Client(base_url=svc.url, timeout=30.0) as c:
                while not stop.is_set():
                    r = c.get("/v1/score", params={"src": "a", "dst": "b", "t": 50.0})
                    served.append((r.status_code, r.json().get("model_version")))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    traffic = threading.Thread(target=score_traffic, daemon=True)
    try:
        with svc.client() as c:
            before = c.get("/v1/model").json()["model_version"]
            c.post(
                "/v1/events",
                json={
                    "events": [
                        {"src": "a", "dst": "b", "t": 10.0},
                        {"src": "b", "dst": "c", "t": 20.0},
                    ]
                },
            )
            score = c.get("/v1/score", params={"src": "a", "dst": "b", "t": 30.0}).json()
            traffic.start()
            wait_until(lambda: len(served) >= 3, 30, 0.01, "score traffic")
            for kind in ("tampered", "truncated", "mismatched"):
                r = c.post("/v1/admin/reload", json={"checkpoint": kind})
                assert r.status_code == 422, (kind, r.status_code, r.text)
                detail = r.json()["detail"]
                assert f"still serving {before}" in detail and REASONS[kind] in detail, detail
                assert c.get("/v1/model").json()["model_version"] == before
                again = c.get("/v1/score", params={"src": "a", "dst": "b", "t": 30.0}).json()
                # Same state, same score; dynamic batching with the background traffic may
                # change the float32 rounding of the read-out (batch-size-dependent kernels).
                assert again.pop("logit") == pytest.approx(score["logit"], rel=1e-6, abs=1e-6)
                assert again.pop("probability") == pytest.approx(
                    score["probability"], rel=1e-6, abs=1e-6
                )
                assert again == {
                    k: v for k, v in score.items() if k not in ("logit", "probability")
                }
                ok = c.post(
                    "/v1/events",
                    json={"events": [{"src": f"{kind}-u", "dst": f"{kind}-v", "t": 40.0}]},
                ).json()
                assert ok["accepted"] == 1
            # odd names (found by the fuzzer: a NUL byte made this a 500)
            for name in ("good\x00", "x" * 300, "a/" * 3000, " ", "good/../../etc"):
                r = c.post("/v1/admin/reload", json={"checkpoint": name})
                assert r.status_code in (403, 422), (name[:20], r.status_code, r.text[:200])
            assert c.get("/v1/model").json()["model_version"] == before
            stop.set()
            traffic.join(30)
            assert not errors, errors
            assert served and all(s == (200, before) for s in served), set(served)
            # control: a sound checkpoint does switch
            r = c.post("/v1/admin/reload", json={"checkpoint": "other"})
            assert r.status_code == 200 and r.json()["model_version"] != before
        figures.update(reload_attempts_refused=8, scores_served_during_attempts=len(served))
    finally:
        stop.set()
        svc.stop()


SIGNING_KEY = "a-signing-key-of-enough-bytes"


def test_signature_required_at_start_and_at_reload(models, tmp_path):
    """With DYGSERVE_CHECKPOINT_KEY set, an unsigned or wrongly signed checkpoint is
    refused at start (exit 2, one line) and at reload (422, the old version serves);
    a checkpoint signed with `dygserve sign-checkpoint` and the key is accepted."""
    root = tmp_path / "signed-models"
    shutil.copytree(models / "good", root / "good")
    shutil.copytree(models / "other", root / "unsigned")
    shutil.copytree(models / "other", root / "wrong-key")
    shutil.copytree(models / "other", root / "signed")
    key_file = tmp_path / "key"
    for name, key in (
        ("good", SIGNING_KEY),
        ("wrong-key", "another-key-of-16-bytes"),
        ("signed", SIGNING_KEY),
    ):
        key_file.write_text(key)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "service.cli",
                "sign-checkpoint",
                str(root / name),
                "--key-file",
                str(key_file),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    env = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "DYGSERVE_CHECKPOINT_KEY": SIGNING_KEY}
    for name, reason in (("unsigned", "not signed"), ("wrong-key", "signature does not match")):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "service.cli",
                "serve",
                "--checkpoint",
                str(root / name),
                "--port",
                str(free_port()),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 2, (name, done.returncode, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("error: checkpoint refused:") and reason in last, last

    svc = serve(
        tmp_path / "svc",
        {
            "DYGSERVE_CHECKPOINT": str(root / "good"),
            "DYGSERVE_MODELS_DIR": str(root),
            "DYGSERVE_CHECKPOINT_KEY": SIGNING_KEY,
        },
    )
    try:
        with svc.client() as c:
            before = c.get("/v1/model").json()["model_version"]
            for name, reason in (("unsigned", "not signed"), ("wrong-key", "does not match")):
                r = c.post("/v1/admin/reload", json={"checkpoint": name})
                assert r.status_code == 422 and reason in r.json()["detail"], (name, r.text)
                assert c.get("/v1/model").json()["model_version"] == before
            r = c.post("/v1/admin/reload", json={"checkpoint": "signed"})
            assert r.status_code == 200 and r.json()["model_version"] != before, r.text
    finally:
        svc.stop()
