"""Every error the data path can raise, and the one table that maps them to HTTP statuses.

The body of every error response is the protocol's `{"error": "..."}`.
"""

from __future__ import annotations


class InferenceError(Exception):
    """Base of the data path's errors; `status` is the HTTP status it maps to."""

    status = 500
    retry_after_s: float | None = None

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(InferenceError):
    status = 400


class ModelNotFound(InferenceError):
    status = 404

    def __init__(self, name: str, version: str | None = None):
        what = f"model {name!r}" if version is None else f"model {name!r} version {version!r}"
        super().__init__(f"{what} not found on this server")


class RouteNotFound(InferenceError):
    status = 404


class MethodNotAllowed(InferenceError):
    status = 405

    def __init__(self, message: str, allow: str = "GET"):
        super().__init__(message)
        self.allow = allow


class PayloadTooLarge(InferenceError):
    status = 413


class UnsupportedMediaType(InferenceError):
    status = 415


class Overloaded(InferenceError):
    """The replica's queue is full: the client should back off and retry."""

    status = 503

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelNotReady(InferenceError):
    status = 503

    def __init__(self, name: str):
        super().__init__(f"model {name!r} is not ready yet (still loading)")
        self.retry_after_s = 1.0


class InferenceTimeout(InferenceError):
    status = 504


class ClientDisconnected(InferenceError):
    """The client went away mid-request (nginx's 499); nothing can be answered."""

    status = 499


class ModelError(InferenceError):
    """The model itself raised; the replica keeps serving."""

    status = 500


def status_of(exc: BaseException) -> int:
    return exc.status if isinstance(exc, InferenceError) else 500


def message_of(exc: BaseException) -> str:
    if isinstance(exc, InferenceError):
        return exc.message
    return f"internal error: {type(exc).__name__}: {exc}"
