"""API key for write and admin routes (and, with ``DYGSERVE_AUTH_READS=true``, for the
score, rank, nodes and model routes): 401 without a key, 403 with a wrong one."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request
from fastapi.security import APIKeyHeader

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)


async def require_api_key(request: Request) -> None:
    expected: str | None = request.app.state.settings.api_key
    if not expected:
        return
    given = await api_key_header(request)
    if not given:
        raise HTTPException(401, "missing X-API-Key", headers={"WWW-Authenticate": "APIKey"})
    # Constant time: the comparison does not leak how many leading bytes matched.
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(403, "wrong X-API-Key")


async def require_read_key(request: Request) -> None:
    """The API key on read routes, when ``auth_reads`` is set: an anonymous read can
    otherwise trigger a cold rebuild (history reads, a batch scan, state writes)."""
    if request.app.state.settings.auth_reads:
        await require_api_key(request)
