"""Every error a Shoal server answers, and the one table that maps them to HTTP statuses.

`error_response(exc)` turns any exception into the status, headers and `{"error": "..."}`
body that the replica, the gateway, shoal up's server, the cluster roles and the control
API all answer; serving/asgi.py writes it. Pure: no I/O, no clock, no web framework.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson


class InferenceError(Exception):
    """Base of the errors Shoal answers; its status is the table's (STATUS below)."""

    retry_after_s: float | None = None  # sent as Retry-After, in whole seconds (at least 1)

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def status(self) -> int:
        return status_of(self)

    @property
    def headers(self) -> dict[str, str]:
        return dict(headers_of(self))


class InvalidInput(InferenceError):
    """The request cannot be decoded or does not fit the model."""


class Unauthorized(InferenceError):
    """No credentials: the client is told how to authenticate."""

    challenge = 'Bearer realm="shoal"'


class Forbidden(InferenceError):
    """Credentials that are not the right ones."""


class NotFound(InferenceError):
    """Nothing by that name (a function in the control API)."""


class ModelNotFound(NotFound):
    def __init__(self, name: str, version: str | None = None):
        what = f"model {name!r}" if version is None else f"model {name!r} version {version!r}"
        super().__init__(f"{what} not found on this server")


class RouteNotFound(NotFound):
    pass


class MethodNotAllowed(InferenceError):
    def __init__(self, message: str, allow: str = "GET"):
        super().__init__(message)
        self.allow = allow


class LengthRequired(InferenceError):
    pass


class PayloadTooLarge(InferenceError):
    pass


class UnsupportedMediaType(InferenceError):
    pass


class UnprocessableRequest(InferenceError):
    """The request's parameters do not validate (FastAPI's validation errors)."""


class ClientDisconnected(InferenceError):
    """The client went away mid-request (nginx's 499); nothing can be answered."""


class ModelError(InferenceError):
    """The model itself raised; the replica keeps serving."""


class BadGateway(InferenceError):
    """The replica failed while answering."""


class Overloaded(InferenceError):
    """A queue is full: the client should back off and retry."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelNotReady(InferenceError):
    def __init__(self, name: str):
        super().__init__(f"model {name!r} is not ready yet (still loading)")
        self.retry_after_s = 1.0


class Unavailable(InferenceError):
    """The function cannot serve right now (its replica failed to start, the controller is away)."""

    def __init__(self, message: str, retry_after_s: float = 5.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InferenceTimeout(InferenceError):
    pass


class StatusError(InferenceError):
    """A status decided elsewhere: a Python handler's own `(status, body)`, a web framework's."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.own_status = status


# The one table. Headers: Retry-After where `retry_after_s` is set (Overloaded, ModelNotReady
# 1 s, Unavailable 5 s), Allow on 405, WWW-Authenticate on 401. None: the error carries its own.
STATUS: dict[type[InferenceError], int | None] = {
    InferenceError: 500,
    InvalidInput: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    LengthRequired: 411,
    PayloadTooLarge: 413,
    UnsupportedMediaType: 415,
    UnprocessableRequest: 422,
    ClientDisconnected: 499,
    ModelError: 500,
    BadGateway: 502,
    Overloaded: 503,
    ModelNotReady: 503,
    Unavailable: 503,
    InferenceTimeout: 504,
    StatusError: None,
}


class ErrorResponse(NamedTuple):
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def status_of(exc: BaseException) -> int:
    """The table's status for `exc` (its nearest listed class); 500 for anything not Shoal's."""
    if not isinstance(exc, InferenceError):
        return 500
    status = next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)
    return exc.own_status if status is None else status


def message_of(exc: BaseException) -> str:
    if isinstance(exc, InferenceError):
        return exc.message
    return f"internal error: {type(exc).__name__}: {exc}"


def headers_of(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The headers the table adds to `exc`'s answer."""
    out: list[tuple[str, str]] = []
    retry_s = getattr(exc, "retry_after_s", None)
    if retry_s:
        out.append(("Retry-After", str(max(1, round(retry_s)))))
    if isinstance(exc, MethodNotAllowed):
        out.append(("Allow", exc.allow))
    if isinstance(exc, Unauthorized):
        out.append(("WWW-Authenticate", exc.challenge))
    return tuple(out)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def error_response(exc: BaseException) -> ErrorResponse:
    """What every Shoal server answers for `exc`: status, headers and `{"error": "..."}`."""
    return ErrorResponse(status_of(exc), headers_of(exc), error_body(message_of(exc)))
