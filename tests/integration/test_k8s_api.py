"""`shoal deploy` / `ls` / `rm` against the cluster roles, without a cluster: the controller's app
(the control API over ConfigMaps and an artifact store) and the gateway's app (forwarding
`/api/` to it) run on loopback; the fake API server stands in for Kubernetes. The SDK talks to
the gateway's URL only, as it would to a cluster's gateway Service."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from deploy.api import create_api
from deploy.cluster.backend import KubernetesBackend
from deploy.cli.client import Shoal, ShoalError
from deploy.cluster.render import artifact_for
from deploy.cluster.configmaps import ConfigMapFunctions, ConfigMapRegistry
from deploy.cluster.controller import ClusterController, controller_app, status_view
from deploy.cluster.plane import ClusterPlane
from deploy.cluster.gateway import EndpointSync, api_proxy, build_app
from deploy.cluster.manifests.render import Cluster
from functions.artifacts import ArtifactStore
from serving.gateway import Gateway
from tests.fakes.kube import FakeKube

TOKEN = "s3cret-token-for-tests"


def _serve(app) -> tuple[str, uvicorn.Server]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server


@pytest.fixture
def cluster_roles(tmp_path):
    kube = FakeKube()
    store = ArtifactStore(tmp_path / "artifacts")
    backend = KubernetesBackend(Cluster(), kube, kube, kube, clock=time.time, identity="c1")
    ctl = ClusterController(backend, ConfigMapFunctions(kube, "shoal"), lambda q: [],
                            lambda spec: artifact_for(spec, "pvc", ""), time.time)
    wake = threading.Event()
    plane = ClusterPlane(ConfigMapRegistry(kube, "shoal", time.time), store, TOKEN, lambda: status_view(ctl),
                         lambda: {"devices": []}, lambda name: wake.set())
    controller_url, controller = _serve(controller_app(ctl, create_api(plane), wake, lambda: True))
    registry = CollectorRegistry()
    gateway = Gateway(registry, lambda f: None, lambda f: sync.known(f))
    sync = EndpointSync(gateway, kube, kube, "shoal")
    gateway_url, gateway_server = _serve(build_app(gateway, registry, sync, api_proxy(controller_url)))
    yield kube, store, ctl, wake, gateway_url, controller_url
    gateway_server.should_exit = controller.should_exit = True


def test_deploy_ls_rm_through_the_gateway(cluster_roles, digits_onnx):
    kube, store, ctl, wake, url, _ = cluster_roles
    with Shoal(url, token=TOKEN) as shoal:
        function = shoal.deploy(digits_onnx, "digits", slice="1/4", max_replicas=3)
        assert function["revision"] == 1 and function["endpoints"]["v2"] == "/v2/models/digits/infer"
        assert wake.is_set()  # the controller ticks at once for the new function
        cm = kube.config_maps[("shoal", "function-digits")]
        assert cm["metadata"]["labels"] == {"shoal.dev/kind": "function", "shoal.dev/function": "digits"}
        spec = json.loads(cm["data"]["spec.json"])
        assert spec["slice"] == "1/4" and cm["data"]["revision"] == "1"
        # the artifact is in the store, where the replicas' PVC mount will find it
        assert store.path(spec["artifact"]).read_bytes() == digits_onnx.read_bytes()
        assert artifact_for(ConfigMapFunctions(kube, "shoal").functions()["digits"][0], "pvc", "").path == \
            str(store.path(spec["artifact"]).relative_to(store.root))
        # the same spec again: no new revision; a changed one: revision 2
        assert shoal.deploy(digits_onnx, "digits", slice="1/4", max_replicas=3)["revision"] == 1
        assert shoal.deploy(digits_onnx, "digits", slice="1/2", max_replicas=3)["revision"] == 2
        assert [f["name"] for f in shoal.functions()] == ["digits"]
        # the controller's next tick creates the Deployment from the ConfigMap
        assert ctl.tick().applied == ["create digits to 0"]
        assert kube.deployments[("shoal", "fn-digits")]["metadata"]["labels"]["shoal.dev/revision"] == "2"
        assert shoal.status()["functions"]["digits"]["revision"] == 2
        assert [e["kind"] for e in shoal.events("digits")] == ["deploy", "deploy"]
        shoal.delete("digits")
        # what rm leaves: a marker of the last revision, in no listing of functions
        left = kube.config_maps[("shoal", "function-digits")]
        assert left["metadata"]["labels"]["shoal.dev/kind"] == "function-removed" and left["data"] == {"revision": "2"}
        assert ConfigMapFunctions(kube, "shoal").functions() == {} and shoal.functions() == []
        assert ctl.tick().applied == ["delete digits"]
        # deployed again under the name: the next revision, never one a Deployment may still carry
        assert shoal.deploy(digits_onnx, "digits", slice="1/4", max_replicas=3)["revision"] == 3
        assert ctl.tick().applied == ["create digits to 0"]
        assert kube.deployments[("shoal", "fn-digits")]["metadata"]["labels"]["shoal.dev/revision"] == "3"


def test_what_the_cluster_cannot_run_is_refused_at_deploy(cluster_roles, digits_onnx):
    kube, *_ , url, _ = cluster_roles
    with Shoal(url, token=TOKEN) as shoal:
        with pytest.raises(ShoalError, match=r"400.*whole percents"):  # HAMi (the default mode): 1/3 = 33.3 %
            shoal.deploy(digits_onnx, "thirds", slice="1/3")
        with pytest.raises(ShoalError, match=r"400.*allows 63"):
            shoal.deploy(digits_onnx, "f" * 61)
    assert kube.config_maps == {}  # nothing stored


def test_the_api_through_the_gateway_needs_the_token(cluster_roles):
    *_, url, _ = cluster_roles
    assert httpx.get(f"{url}/api/v1/functions").status_code == 401
    assert httpx.get(f"{url}/api/v1/functions", headers={"authorization": "Bearer wrong"}).status_code == 403
    with Shoal(url, token="wrong") as shoal, pytest.raises(ShoalError, match="403"):
        shoal.functions()


def test_a_pickle_without_trust_is_refused_on_the_cluster_too(cluster_roles, tmp_path):
    *_, url, _ = cluster_roles
    pickle = tmp_path / "model.joblib"
    pickle.write_bytes(b"\x80\x04not really a pickle")
    with Shoal(url, token=TOKEN) as shoal, pytest.raises(ShoalError, match="refused without --trust"):
        shoal.deploy(pickle, "model")


def test_gateway_answers_503_when_the_controller_is_away(tmp_path):
    registry = CollectorRegistry()
    gateway = Gateway(registry, lambda f: None, lambda f: False)
    url, server = _serve(build_app(gateway, registry, EndpointSync(gateway, None, None, "shoal"),
                                   api_proxy("http://127.0.0.1:9")))  # nothing listens on port 9
    try:
        r = httpx.get(f"{url}/api/v1/functions")
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and "unreachable" in r.json()["error"]
    finally:
        server.should_exit = True


@pytest.mark.parametrize("app, path, method, status", [
    # the gateway's /api proxy with the controller away: 503, as the table says
    ("proxy", "/api/v1/functions", "GET", 503),
    # the controller's /poke without a function: 400
    ("controller", "/poke", "POST", 400),
], ids=["gateway-api-proxy", "controller-poke"])
def test_an_error_answer_returns_none_to_the_asgi_server(app, path, method, status):
    # an ASGI callable must return None: one that returned send_error's status made uvicorn log
    # "ASGI callable should return None, but returned '503'" on every such answer
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    if app == "proxy":
        asgi = api_proxy("http://127.0.0.1:9")  # nothing listens on port 9
    else:
        ctl = SimpleNamespace(is_leader=True, poke=lambda f, h: None)
        asgi = controller_app(ctl, None, SimpleNamespace(set=lambda: None), lambda: True)
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": []}
    assert asyncio.run(asgi(scope, receive, send)) is None
    assert sent[0]["status"] == status
