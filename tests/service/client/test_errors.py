"""Each 4xx the service answers becomes its own exception, with the service's detail."""

from __future__ import annotations

import httpx
import pytest

from service.client import (
    ApiError,
    BadRequest,
    ClientError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServerError,
    Unauthorized,
    ValidationFailed,
)
from service.client.errors import error_for

REQUEST = httpx.Request("POST", "http://svc/v1/events")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (413, PayloadTooLarge),
        (422, ValidationFailed),
        (405, ClientError),
        (429, ClientError),
        (500, ServerError),
    ],
)
def test_status_to_exception(status, kind):
    err = error_for(httpx.Response(status, json={"detail": "why"}, request=REQUEST))
    assert type(err) is kind and isinstance(err, ApiError)
    assert err.status == status and err.detail == "why" and not err.local
    assert f"HTTP {status}: why" in str(err)


def test_validation_issues_and_bodies_that_are_not_json():
    issues = [{"loc": ["body", "events", 0, "t"], "msg": "bad t", "type": "float_type"}]
    err = error_for(httpx.Response(422, json={"detail": issues}, request=REQUEST))
    assert isinstance(err, ValidationFailed)
    assert err.issues[0].loc == ["body", "events", 0, "t"] and "body.events.0.t: bad t" in str(err)
    proxy = error_for(httpx.Response(413, text="<html>too big</html>", request=REQUEST))
    assert isinstance(proxy, PayloadTooLarge) and proxy.detail == "<html>too big</html>"
