"""The one error table (serving/protocol/errors.py) and the one writer (serving/asgi.py).

- Every error class, its status and the headers it carries, as a table.
- No module outside serving/protocol/errors.py defines an error class of its own.
- Every server of the project answers an unknown path and the framework's errors the same way:
  the table's status, `application/json` and `{"error": "..."}`.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from deploy.api import as_error
from functions.artifacts import ArtifactTooLarge
from functions.spec import SpecError
from serving.protocol import errors as E

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (E.InvalidInput("bad"), 400, ()),
    (E.Unauthorized("who"), 401, (("WWW-Authenticate", 'Bearer realm="shoal"'),)),
    (E.Forbidden("no"), 403, ()),
    (E.NotFound("function 'f' not found"), 404, ()),
    (E.ModelNotFound("m"), 404, ()),
    (E.RouteNotFound("no route"), 404, ()),
    (E.MethodNotAllowed("use POST", allow="POST"), 405, (("Allow", "POST"),)),
    (E.LengthRequired("length"), 411, ()),
    (E.PayloadTooLarge("big"), 413, ()),
    (E.UnsupportedMediaType("br"), 415, ()),
    (E.UnprocessableRequest("query"), 422, ()),
    (E.ClientDisconnected("gone"), 499, ()),
    (E.InferenceError("base"), 500, ()),
    (E.ModelError("raised"), 500, ()),
    (E.BadGateway("died"), 502, ()),
    (E.Overloaded("full", retry_after_s=2.4), 503, (("Retry-After", "2"),)),  # round(2.4) = 2
    (E.Overloaded("full", retry_after_s=0.2), 503, (("Retry-After", "1"),)),  # round(0.2) = 0, at least 1
    (E.ModelNotReady("m"), 503, (("Retry-After", "1"),)),
    (E.Unavailable("failed to start"), 503, (("Retry-After", "5"),)),
    (E.InferenceTimeout("slow"), 504, ()),
    (E.StatusError(418, "handler answered 418"), 418, ()),  # the handler's own status
    (KeyError("x"), 500, ()),  # not Shoal's: a 500 that names it
]


@pytest.mark.parametrize("exc, status, headers", CASES, ids=[type(c[0]).__name__ + f"-{c[1]}" for c in CASES])
def test_error_response_by_the_table(exc, status, headers):
    response = E.error_response(exc)
    assert (response.status, response.headers) == (status, headers)
    assert orjson.loads(response.body) == {"error": E.message_of(exc)}
    if isinstance(exc, E.InferenceError):
        assert (exc.status, exc.headers) == (status, dict(headers))


def test_a_foreign_exception_names_its_type():
    assert orjson.loads(E.error_response(KeyError("x")).body) == {"error": "internal error: KeyError: 'x'"}


def test_every_error_class_has_a_row():
    classes = [c for c in vars(E).values() if isinstance(c, type) and issubclass(c, E.InferenceError)]
    assert len(classes) >= 19
    for cls in classes:
        assert any(base in E.STATUS for base in cls.__mro__), cls


def _error_classes_outside_the_table() -> list[str]:
    """Classes deriving from any of errors.py's classes, defined anywhere else."""
    names = {n for n, c in vars(E).items() if isinstance(c, type) and issubclass(c, Exception)}
    found = []
    for path in sorted(p for d in ("serving", "deploy", "functions", "autoscaler") for p in (ROOT / d).rglob("*.py")):
        if path == ROOT / "serving/protocol/errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", None)) in names
                                                      for b in node.bases):
                found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_no_error_class_lives_outside_the_table():
    assert _error_classes_outside_the_table() == []


@pytest.mark.parametrize("exc, status, error", [
    (SpecError("max_replicas (2) must be >= min_replicas (3)"), 400, "max_replicas (2) must be >= min_replicas (3)"),
    (ArtifactTooLarge("artifact of 9 bytes exceeds 8"), 413, "artifact of 9 bytes exceeds 8"),
    (HTTPException(404), 404, "Not Found"),
    (HTTPException(405, headers={"Allow": "GET, PUT"}), 405, "Method Not Allowed"),
    (HTTPException(400, "There was an error parsing the body"), 400, "There was an error parsing the body"),
    (RequestValidationError([{"loc": ("query", "filename"), "msg": "Field required"}]), 422,
     "invalid request: query.filename: Field required"),
], ids=["spec-error-400", "too-large-413", "no-route-404", "method-405", "framework-400", "validation-422"])
def test_the_api_maps_its_own_and_the_frameworks_errors_through_the_table(exc, status, error):
    mapped = as_error(exc)
    assert (E.status_of(mapped), E.message_of(mapped)) == (status, error)


def test_a_framework_405_keeps_its_allow_header():
    assert E.headers_of(as_error(HTTPException(405, headers={"Allow": "GET, PUT"}))) == (("Allow", "GET, PUT"),)


def asgi(app, method: str, url: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shoal") as client:
            return await client.request(method, url)

    return asyncio.run(go())


def _servers():
    from prometheus_client import CollectorRegistry

    from deploy.cluster.controller import controller_app
    from deploy.cluster.gateway import build_app
    from deploy.local.server import ControlPlane
    from serving.replica import ReplicaApp

    ctl = SimpleNamespace(is_leader=True, poke=lambda function, held: None)
    return {
        "replica": ReplicaApp(dataplane=None, metrics=None, properties={}),
        "shoal up": functools.partial(ControlPlane.__call__, SimpleNamespace()),  # unknown paths touch no state
        "cluster gateway": build_app(None, CollectorRegistry(), SimpleNamespace(functions=set())),
        "cluster controller": controller_app(ctl, api=None, wake=threading.Event(), alive=lambda: True),
    }


@pytest.mark.parametrize("server", ["replica", "shoal up", "cluster gateway", "cluster controller"])
def test_every_server_answers_an_unknown_path_by_the_table(server):
    r = asgi(_servers()[server], "GET", "/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "no route for '/nothing-here'"}


def test_the_cluster_controller_refuses_a_poke_without_a_function_by_the_table():
    r = asgi(_servers()["cluster controller"], "POST", "/poke")
    assert r.status_code == 400 and r.json() == {"error": "POST /poke needs ?function=NAME (and &held=N)"}
