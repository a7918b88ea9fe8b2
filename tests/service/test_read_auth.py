"""``DYGSERVE_AUTH_READS`` and what ``GET /v1/model`` shows (issue 15, defect 7), in
process through ``httpx.ASGITransport`` with the app's lifespan.

With ``auth_reads`` the score, rank, nodes and model routes take the API key like the
write routes (401 without, 403 wrong): an anonymous read could otherwise trigger a
cold rebuild and store writes. Health and metrics stay open for probes and scrapers.
``/v1/model`` names the checkpoint by its folder and shows no absolute path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from service.app import create_app
from service.settings import Settings

KEY = "k3y-for-reads"
READS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/v1/score", {"params": {"src": "a", "dst": "b", "t": 2.0}}),
    ("POST", "/v1/score", {"json": {"pairs": [{"src": "a", "dst": "b", "t": 2.0}]}}),
    ("POST", "/v1/rank", {"json": {"src": "a", "t": 2.0, "candidates": ["b", "c"]}}),
    ("GET", "/v1/nodes/a", {}),
    ("GET", "/v1/model", {}),
]
OPEN = ["/healthz", "/readyz", "/metrics"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "models" / "ck-a"
    metrics = {"data": "/home/alice/private/uci/edges.csv.gz", "val_ap": 0.9, "notes": ["/srv/x"]}
    save_checkpoint(path, DygMambaLinkModel(ModelConfig(d_model=8, d_state=4)), metrics)
    return path


@asynccontextmanager
async def client_for(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c


@pytest.mark.anyio
async def test_auth_reads_puts_read_routes_behind_the_key(checkpoint: Path) -> None:
    async with client_for(Settings(checkpoint=checkpoint, api_key=KEY, auth_reads=True)) as c:
        for method, path, kw in READS:
            r = await c.request(method, path, **kw)
            assert r.status_code == 401, (path, r.status_code)
            r = await c.request(method, path, headers={"X-API-Key": "wrong"}, **kw)
            assert r.status_code == 403, (path, r.status_code)
            r = await c.request(method, path, headers={"X-API-Key": KEY}, **kw)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
        for path in OPEN:
            assert (await c.get(path)).status_code == 200, path


@pytest.mark.anyio
async def test_reads_stay_open_by_default(checkpoint: Path) -> None:
    async with client_for(Settings(checkpoint=checkpoint, api_key=KEY)) as c:
        for method, path, kw in READS:
            r = await c.request(method, path, **kw)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
        r = await c.post("/v1/events", json={"events": [{"src": "a", "dst": "b", "t": 1.0}]})
        assert r.status_code == 401  # writes need the key either way


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


@pytest.mark.anyio
async def test_model_info_shows_no_absolute_path(checkpoint: Path) -> None:
    async with client_for(Settings(checkpoint=checkpoint)) as c:
        info = (await c.get("/v1/model")).json()
    assert info["checkpoint"] == "ck-a"
    assert info["metrics"]["data"] == "edges.csv.gz" and info["metrics"]["val_ap"] == 0.9
    leaked = [s for s in strings(info) if s.startswith(("/", "~")) or str(checkpoint) in s]
    assert not leaked, leaked
