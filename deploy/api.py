"""The control-plane REST API (FastAPI), under /api/v1, behind the bearer token.

    POST   /api/v1/artifacts?filename=F        body: the artifact bytes -> {ref, size}
    PUT    /api/v1/functions/{name}            body: a function spec -> the function
    GET    /api/v1/functions[/{name}]
    DELETE /api/v1/functions/{name}
    GET    /api/v1/functions/{name}/export     a Nuclio function.yaml (Python handler functions)
    GET    /api/v1/events?function=&after=&limit=
    GET    /api/v1/status                       functions, replicas, slices, duty, p95 (for `shoal top`)
    GET    /api/v1/inventory

No token: 401; a wrong token: 403; tokens are compared in constant time.
Errors are `{"error": "..."}` with the statuses of the one table in
serving/protocol/errors.py, the framework's own (no route, validation) mapped through it.

An artifact's bytes are sniffed (functions/sniff.py) when it is uploaded, before it is kept:
that is the first request of a deploy, so an ONNX file that is not ONNX or a zip bomb is a
400 at once and never enters the store. A PUT sniffs the stored file again (cheap: bounded
reads), for artifacts stored before the check existed or put in the store by other means.
Pickles are never opened here; without trust they are refused at the PUT.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from functions.artifacts import ArtifactError, ArtifactTooLarge, validate_filename
from functions.nuclio import to_function_yaml
from functions.registry import NotFound as RegistryNotFound
from functions.sniff import sniff_artifact
from functions.spec import SpecError, spec_from_dict, validate_name
from serving.protocol.errors import (
    Forbidden,
    InferenceError,
    InvalidInput,
    LengthRequired,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RouteNotFound,
    StatusError,
    Unauthorized,
    UnprocessableRequest,
    error_response,
)

PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib")
MAX_SPEC_BYTES = 1024 * 1024


def check_token(header: str | None, token: str) -> InferenceError | None:
    """None when authorized; else 401 (no credentials) or 403 (wrong ones)."""
    if not header:
        return Unauthorized("missing bearer token: pass --token, SHOAL_TOKEN or the token file of shoal up")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not token or not value or not hmac.compare_digest(value.encode(), token.encode()):
        return Forbidden("invalid bearer token")
    return None


def as_error(exc: Exception) -> Exception:
    """The table's error for what the API, its specs or FastAPI raised (anything else: a 500)."""
    if isinstance(exc, InferenceError):
        return exc
    if isinstance(exc, SpecError):
        return (PayloadTooLarge if isinstance(exc, ArtifactTooLarge) else InvalidInput)(str(exc))
    if isinstance(exc, RequestValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}" for e in exc.errors())
        return UnprocessableRequest(f"invalid request: {problems}")
    if isinstance(exc, StarletteHTTPException):  # FastAPI's own answers: no such route, method not allowed
        if exc.status_code == 404:
            return RouteNotFound(str(exc.detail))
        if exc.status_code == 405:
            return MethodNotAllowed(str(exc.detail), allow=(exc.headers or {}).get("Allow", "GET"))
        return StatusError(exc.status_code, str(exc.detail))
    return exc


def error_reply(exc: Exception) -> Response:
    status, headers, body = error_response(as_error(exc))
    return Response(body, status_code=status, headers=dict(headers), media_type="application/json")


async def write_artifact(store, stream, filename: str):
    """Stream an upload into the artifact store; the disk writes and the sniff of the complete
    file run off the event loop. Nothing of a refused or broken upload is kept."""
    loop = asyncio.get_running_loop()
    writer = store.writer(filename)
    try:
        async for chunk in stream:
            await loop.run_in_executor(None, writer.write, chunk)
        return await loop.run_in_executor(None, functools.partial(writer.commit, check=sniff_artifact))
    finally:
        writer.abort()


def create_api(plane) -> FastAPI:
    """`plane` is the running ControlPlane (deploy/local/server.py)."""
    app = FastAPI(title="Shoal control API", version="1", docs_url=None, redoc_url=None, openapi_url="/api/v1/openapi.json")

    async def _error(request: Request, exc: Exception) -> Response:
        return error_reply(exc)

    for kind in (InferenceError, SpecError, StarletteHTTPException, RequestValidationError):
        app.add_exception_handler(kind, _error)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Callable):
        denied = check_token(request.headers.get("authorization"), plane.token)
        if denied is not None:
            return error_reply(denied)
        return await call_next(request)

    @app.post("/api/v1/artifacts")
    async def upload(request: Request, filename: str) -> dict[str, Any]:
        validate_filename(filename)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > plane.store.max_bytes:
            raise ArtifactTooLarge(f"artifact {filename!r} of {declared} bytes exceeds the limit of {plane.store.max_bytes} bytes")
        artifact = await plane.store_artifact(request.stream(), filename)
        return {"ref": artifact.ref, "digest": artifact.digest, "size": artifact.size}

    @app.put("/api/v1/functions/{name}")
    async def put_function(name: str, request: Request) -> dict[str, Any]:
        validate_name(name)
        declared = request.headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > MAX_SPEC_BYTES:
            raise (PayloadTooLarge if declared.isdigit() else LengthRequired)(
                f"a function spec needs a Content-Length of at most {MAX_SPEC_BYTES} bytes")
        try:
            doc = await request.json()
        except ValueError:
            raise InvalidInput("function spec must be a JSON object") from None
        if not isinstance(doc, dict):
            raise InvalidInput("function spec must be a JSON object")
        doc["name"] = name
        spec = spec_from_dict(doc)
        if not plane.store.has(spec.artifact):
            raise InvalidInput(f"artifact {spec.artifact!r} is not in the store: upload it first")
        # a pickle by its name, or anything the sklearn loader would unpickle: refused before it is opened
        if (spec.artifact.lower().endswith(PICKLE_SUFFIXES) or spec.loader == "sklearn") and not spec.trust:
            raise InvalidInput(f"{spec.artifact.rsplit('/', 1)[-1]} is a pickle: loading it runs code from the file; "
                               "refused without --trust (trust: true)")
        path = plane.store.path(spec.artifact)
        sniff = functools.partial(sniff_artifact, path, loader=spec.loader)
        if await asyncio.get_running_loop().run_in_executor(None, sniff) == "notebook":
            raise InvalidInput(f"{path.name} is a notebook, which a replica cannot load: `shoal deploy` and the SDK "
                               "convert it to a handler .py (nuclio-jupyter); deploy that")
        record = plane.put_function(spec)
        return plane.function_view(record)

    @app.get("/api/v1/functions")
    async def list_functions() -> dict[str, Any]:
        return {"functions": [plane.function_view(r) for r in plane.registry.list_functions()]}

    @app.get("/api/v1/functions/{name}")
    async def get_function(name: str) -> dict[str, Any]:
        return plane.function_view(_get(plane, name))

    @app.get("/api/v1/functions/{name}/metadata")
    async def metadata(name: str) -> dict[str, Any]:
        return plane.model_metadata(_get(plane, name))

    @app.delete("/api/v1/functions/{name}")
    async def delete_function(name: str) -> dict[str, Any]:
        _get(plane, name)
        plane.delete_function(name)
        return {"deleted": name}

    @app.get("/api/v1/functions/{name}/export")
    async def export(name: str) -> PlainTextResponse:
        record = _get(plane, name)
        path = plane.store.path(record.spec.artifact)
        if path.suffix != ".py":
            raise InvalidInput(f"{name} is a {path.suffix} model: export writes Nuclio function.yaml for Python handler functions")
        return PlainTextResponse(to_function_yaml(record.spec, path.read_bytes()), media_type="application/yaml")

    @app.get("/api/v1/events")
    async def events(function: str | None = None, after: int = 0, limit: int = 200) -> dict[str, Any]:
        return {"events": [e.to_json() for e in plane.registry.events(function, after, max(1, min(limit, 1000)))]}

    @app.get("/api/v1/status")
    async def status() -> dict[str, Any]:
        return plane.status()

    @app.get("/api/v1/inventory")
    async def inventory() -> dict[str, Any]:
        return plane.inventory_view()

    return app


def _get(plane, name: str):
    try:
        return plane.registry.get_function(name)
    except RegistryNotFound:
        raise NotFound(f"function {name!r} not found") from None


__all__ = ["create_api", "check_token", "as_error", "error_reply", "ArtifactError"]
