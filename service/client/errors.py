"""The client's exceptions: one class per 4xx the service answers (carrying its
detail), one for a retry budget spent, one for a request that cannot be resent safely.

    DygserveError
    |-- ApiError                 an answer the client does not retry (status, detail)
    |   |-- ClientError          4xx
    |   |   |-- BadRequest       400 malformed body
    |   |   |-- Unauthorized     401 no X-API-Key
    |   |   |-- Forbidden        403 wrong key, or a checkpoint outside the models dir
    |   |   |-- NotFound         404
    |   |   |-- PayloadTooLarge  413 body or batch over the service's limits
    |   |   `-- ValidationFailed 422 (``issues`` lists the fields when the service says)
    |   `-- ServerError          5xx that is not retried (500)
    |-- RetriesExhausted         502/503/504, timeouts, dropped connections past the budget
    |-- DeliveryUnknown          a failure after which the request may have been applied,
    |                            for events without ids: resending could apply them twice
    `-- InvalidResponse          a 2xx whose body is not the route's response model

Raised out of ``ingest``, every one carries ``progress`` (``IngestProgress``): what was
answered and the events still to send, with their ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
from pydantic import ValidationError

from ..schemas import ErrorResponse, ValidationIssue

if TYPE_CHECKING:
    from .results import IngestProgress


class DygserveError(Exception):
    progress: IngestProgress | None = None


class ApiError(DygserveError):
    def __init__(
        self,
        status: int,
        detail: str | list[ValidationIssue],
        *,
        local: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        self.status = status
        self.detail = detail
        self.local = local  # refused by the client before sending, as the service would
        self.retry_after_s = retry_after_s
        where = "refused before sending" if local else f"HTTP {status}"
        super().__init__(f"{where}: {self.message}")

    @property
    def message(self) -> str:
        if isinstance(self.detail, str):
            return self.detail
        return "; ".join(
            f"{'.'.join(str(p) for p in issue.loc)}: {issue.msg}" for issue in self.detail
        )


class ClientError(ApiError):
    pass


class BadRequest(ClientError):
    pass


class Unauthorized(ClientError):
    pass


class Forbidden(ClientError):
    pass


class NotFound(ClientError):
    pass


class PayloadTooLarge(ClientError):
    pass


class ValidationFailed(ClientError):
    @property
    def issues(self) -> list[ValidationIssue]:
        """The fields the service (or the local check) refused; empty for a plain message
        (for example a feature vector of the wrong length)."""
        return [] if isinstance(self.detail, str) else list(self.detail)

    @classmethod
    def from_validation(
        cls, exc: ValidationError, prefix: tuple[str | int, ...]
    ) -> ValidationFailed:
        """A local refusal, with the locations the service would have answered."""
        issues = [
            ValidationIssue(loc=[*prefix, *e["loc"]], msg=e["msg"], type=e["type"])
            for e in exc.errors()
        ]
        return cls(422, issues, local=True)


class ServerError(ApiError):
    pass


BY_STATUS: dict[int, type[ClientError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    413: PayloadTooLarge,
    422: ValidationFailed,
}


class RetriesExhausted(DygserveError):
    """Every attempt the retry policy allowed failed with something retryable."""

    def __init__(
        self,
        attempts: int,
        elapsed_s: float,
        last_status: int | None,
        last_detail: str,
    ) -> None:
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_status = last_status  # None: the last attempt got no answer
        self.last_detail = last_detail
        last = f"HTTP {last_status}" if last_status is not None else "no answer"
        super().__init__(
            f"gave up after {attempts} attempt(s) in {elapsed_s:.1f}s; last: {last}: {last_detail}"
        )


class DeliveryUnknown(DygserveError):
    """The request may have reached the service and been applied, and it holds events
    without an event id, so sending it again could apply them twice. Give events ids
    (the client's default) and every such failure is retried instead."""


class InvalidResponse(DygserveError):
    """The service answered 2xx with a body that is not the route's response model."""


def _detail(response: httpx.Response) -> str | list[ValidationIssue]:
    try:
        return ErrorResponse.model_validate_json(response.content).detail
    except ValidationError:
        return response.text[:2000] or response.reason_phrase


def error_for(response: httpx.Response, retry_after_s: float | None = None) -> ApiError:
    """The exception for a non-2xx answer that is not retried."""
    status = response.status_code
    detail = _detail(response)
    if 400 <= status < 500:
        return BY_STATUS.get(status, ClientError)(status, detail, retry_after_s=retry_after_s)
    return ServerError(status, detail, retry_after_s=retry_after_s)


def detail_text(response: httpx.Response) -> str:
    """A non-2xx answer's detail as one line (for RetriesExhausted and the attempt hook)."""
    detail = _detail(response)
    if isinstance(detail, str):
        return detail
    return "; ".join(f"{'.'.join(str(p) for p in i.loc)}: {i.msg}" for i in detail)
