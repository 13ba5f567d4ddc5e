"""The gateway role on a cluster, without a cluster: EndpointSync fed by the fake API server, routing
to a real replica process on loopback. A request for a function at zero is held and pokes the
controller; it is answered once an EndpointSlice shows a ready replica."""

from __future__ import annotations

import asyncio
import json

import httpx
from prometheus_client import CollectorRegistry

from deploy.cluster.configmaps import ConfigMapFunctions
from deploy.cluster.gateway import EndpointSync, build_app
from serving.gateway import Gateway, GatewayConfig
from tests.fakes.kube import FakeKube
from tests.unit.test_k8s_gateway import endpoint_slice

BODY = {"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


def test_hold_poke_route_drain_and_forget(replica_factory, digits_onnx):
    replica = replica_factory(digits_onnx, "--name", "digits")
    host, port = replica.hostport.split(":")
    kube = FakeKube()
    kube.create_namespaced_config_map("shoal", ConfigMapFunctions.config_map(
        {"name": "digits", "artifact": f"sha256:{'a' * 64}/digits.onnx"}, 1, "shoal"))
    pokes: list[str] = []
    registry = CollectorRegistry()
    gateway = Gateway(registry, pokes.append, lambda f: sync.known(f), GatewayConfig(hold_timeout_s=10))
    sync = EndpointSync(gateway, kube, kube, "shoal", drain_s=5)
    app = build_app(gateway, registry, sync)

    async def scenario() -> None:
        await sync.sync_once()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            assert (await client.post("/v2/models/nope/infer", json=BODY)).status_code == 404  # not a function
            held = asyncio.create_task(client.post("/v2/models/digits/infer", json=BODY))
            await asyncio.sleep(0.3)
            assert not held.done() and pokes == ["digits"] and gateway.held("digits") == 1
            kube.endpoint_slices[("shoal", "fn-digits-1")] = endpoint_slice("digits", ("pod-1", host, True, False),
                                                                            port=int(port))
            assert [v for v, _ in await sync.sync_once()] == ["add"]
            r = await asyncio.wait_for(held, 10)
            assert r.status_code == 200 and len(r.json()["outputs"][0]["data"]) == 1
            assert (await client.post("/v2/models/digits/infer", json=BODY)).status_code == 200  # routed directly
            assert (await client.get("/v1/models")).json() == {"models": ["digits"]}
            metrics = (await client.get("/metrics")).text
            assert 'shoal_gateway_requests_total{code="200",function="digits"} 2.0' in metrics
            # the pod terminates: drained and removed, so the next request is held again
            kube.endpoint_slices[("shoal", "fn-digits-1")] = endpoint_slice("digits", ("pod-1", host, False, True),
                                                                            port=int(port))
            assert [v for v, _ in await sync.sync_once()] == ["drain"]
            await sync.drained()
            assert gateway.route("digits").endpoints == []
            again = asyncio.create_task(client.post("/v2/models/digits/infer", json=BODY))
            await asyncio.sleep(0.3)
            assert not again.done() and pokes == ["digits", "digits"]
            # the function is removed: its held request is answered 404, not left hanging
            kube.delete_namespaced_config_map("function-digits", "shoal")
            await sync.sync_once()
            r = await asyncio.wait_for(again, 10)
            assert r.status_code == 404 and "error" in json.loads(r.text)

    asyncio.run(scenario())


def test_each_functions_own_timeout_comes_from_its_config_map():
    kube = FakeKube()
    artifact = f"sha256:{'a' * 64}/m.onnx"
    for doc in ({"name": "slow", "artifact": artifact, "timeout_s": 300.0},
                {"name": "plain", "artifact": artifact},
                {"name": "odd", "artifact": artifact, "timeout_s": "soon"}):
        kube.create_namespaced_config_map("shoal", ConfigMapFunctions.config_map(doc, 1, "shoal"))
    gateway = Gateway(CollectorRegistry(), lambda f: None, lambda f: sync.known(f))
    sync = EndpointSync(gateway, kube, kube, "shoal")
    asyncio.run(sync.sync_once())
    # 300 s for the one that asks; the platform's 60 s where absent or unreadable
    assert (sync.timeout_of("slow"), sync.timeout_of("plain"), sync.timeout_of("odd")) == (300.0, 60.0, 60.0)
