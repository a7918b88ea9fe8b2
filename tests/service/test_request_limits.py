"""The 413s for too many pairs (``POST /v1/score``) and too many candidates
(``POST /v1/rank``) are reached, not pre-empted by the body limit: the older tests
sent 20,001 pairs to a service with a 64 kB body limit, so the byte limit answered and
the count checks never ran. Here the body fits and the detail names the count; and
with the default settings, the smallest request over each count limit fits under the
default body limit, so the count check is what a client meets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import orjson
import pytest

from service.app import create_app
from service.settings import Settings

from .conftest import make_checkpoint


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def client_for(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c


def pairs(n: int) -> dict:
    return {"pairs": [{"src": "a", "dst": "b", "t": 1.0}] * n}


def rank(n: int) -> dict:
    return {"src": "a", "t": 1.0, "candidates": [str(i) for i in range(n)]}


@pytest.mark.anyio
async def test_count_limits_answer_413_with_their_own_detail(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "a")
    settings = Settings(
        checkpoint=tmp_path / "a",
        max_score_pairs=5,
        max_rank_candidates=7,
        max_body_bytes=1024 * 1024,
    )
    async with client_for(settings) as c:
        r = await c.post("/v1/score", json=pairs(5))
        assert r.status_code == 200 and len(r.json()["scores"]) == 5
        r = await c.post("/v1/score", json=pairs(6))
        assert r.status_code == 413
        assert r.json()["detail"] == "6 pairs; at most 5 per request"

        r = await c.post("/v1/rank", json=rank(7))
        assert r.status_code == 200 and len(r.json()["ranking"]) == 7
        r = await c.post("/v1/rank", json=rank(8))
        assert r.status_code == 413
        assert r.json()["detail"] == "8 candidates; at most 7"


@pytest.mark.anyio
async def test_with_default_settings_the_count_check_answers_first(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "a")
    settings = Settings(checkpoint=tmp_path / "a")
    over_pairs = pairs(settings.max_score_pairs + 1)
    over_rank = rank(settings.max_rank_candidates + 1)
    assert len(orjson.dumps(over_pairs)) < settings.max_body_bytes
    assert len(orjson.dumps(over_rank)) < settings.max_body_bytes
    async with client_for(settings) as c:
        r = await c.post("/v1/score", json=over_pairs)
        assert r.status_code == 413 and "pairs; at most" in r.json()["detail"], r.text[:200]
        r = await c.post("/v1/rank", json=over_rank)
        assert r.status_code == 413 and "candidates; at most" in r.json()["detail"], r.text[:200]
