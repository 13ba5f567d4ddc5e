"""`shoal gateway`: the gateway on a cluster. It is the same `serving.gateway.Gateway` as in
`shoal up`, fed from Kubernetes instead of a local controller.

- **Where replicas are.** The EndpointSlices of each function's Service, re-read every
  `--sync-s`:
  - a ready endpoint is routed to;
  - a terminating one is drained: no new requests, in-flight ones finish;
  - one that is gone is removed.
- **Which functions exist.** The function ConfigMaps. A request for an unknown function is a
  404 at once, not a held request.
- **Scale from zero.** A request for a function with no ready replica is held by the activator,
  and the gateway pokes the controller (`POST /poke?function=NAME&held=N` on its Service). The
  controller starts a replica at once instead of waiting for Prometheus to see the queue.

Endpoint bookkeeping is pure (`endpoints_from_slices`, `sync_actions`); the loop only lists and applies.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from deploy.cluster.backend import Outage, as_dict, items_of, quiet_client_retries
from deploy.cluster.configmaps import FUNCTION_KIND_LABEL
from deploy.cluster.manifests.render import FUNCTION_LABEL
from functions.spec import LIMITS, MAX_TIMEOUT_S
from serving.asgi import send_error, send_response
from serving.protocol.errors import RouteNotFound, Unavailable

log = logging.getLogger("shoal.k8s.gateway")

SLICE_SELECTOR = "app.kubernetes.io/component=replica"


@dataclass(frozen=True)
class EndpointView:
    function: str
    replica: str  # the pod's name
    host: str
    port: int
    ready: bool
    terminating: bool


def endpoints_from_slices(slices: list[dict[str, Any]]) -> dict[tuple[str, str], EndpointView]:
    """Every endpoint of the functions' EndpointSlices, by (function, replica)."""
    out: dict[tuple[str, str], EndpointView] = {}
    for s in slices:
        labels = (s.get("metadata") or {}).get("labels") or {}
        function = labels.get(FUNCTION_LABEL) or labels.get("kubernetes.io/service-name", "").removeprefix("fn-")
        port = next((p.get("port") for p in s.get("ports") or [] if p.get("name") == "http"), None)
        if not function or port is None:
            continue
        for e in s.get("endpoints") or []:
            addresses = e.get("addresses") or []
            if not addresses:
                continue
            conditions = e.get("conditions") or {}
            replica = (e.get("targetRef") or {}).get("name") or addresses[0]
            out[(function, replica)] = EndpointView(
                function, replica, addresses[0], int(port), ready=conditions.get("ready") is True,
                terminating=conditions.get("terminating") is True)
    return out


def sync_actions(routed: dict[tuple[str, str], EndpointView],
                 seen: dict[tuple[str, str], EndpointView]) -> list[tuple[str, EndpointView]]:
    """("add" | "drain" | "remove", endpoint): what the gateway must do so that it routes to
    exactly the ready, non-terminating endpoints seen (pure)."""
    actions = []
    for key, e in sorted(seen.items()):
        if e.ready and not e.terminating and key not in routed:
            actions.append(("add", e))
        elif key in routed and (e.terminating or not e.ready):
            actions.append(("drain", routed[key]))
    for key, e in sorted(routed.items()):
        if key not in seen:
            actions.append(("remove", e))
    return actions


def _timeout_in(config_map: dict[str, Any]) -> float | None:
    """A function's `timeout_s` from its ConfigMap's spec.json; None when absent or unreadable
    (the platform's default then applies)."""
    try:
        value = json.loads((config_map.get("data") or {}).get("spec.json", "{}")).get("timeout_s")
    except (ValueError, AttributeError):
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_TIMEOUT_S
    return float(value) if ok else None


class EndpointSync:
    """Keeps a Gateway's endpoints equal to the cluster's ready replicas."""

    def __init__(self, gateway: Any, discovery: Any, core: Any, namespace: str, drain_s: float = 30.0):
        self.gateway, self.discovery, self.core, self.namespace, self.drain_s = (gateway, discovery, core, namespace,
                                                                                 drain_s)
        self.routed: dict[tuple[str, str], EndpointView] = {}
        self.functions: set[str] = set()
        self.timeouts: dict[str, float] = {}  # each function's own request timeout, from its spec
        self._draining: set[asyncio.Task] = set()

    async def _drain(self, e: EndpointView) -> None:
        # a drain outlasts the longest request the function allows
        await self.gateway.drain_endpoint(e.function, e.replica, max(self.drain_s, self.timeout_of(e.function) + 5))
        self.gateway.remove_endpoint(e.function, e.replica)

    def timeout_of(self, function: str) -> float:
        return self.timeouts.get(function, LIMITS.request_timeout_s)

    async def drained(self) -> None:
        """Wait for the drains under way (tests, shutdown)."""
        if self._draining:
            await asyncio.gather(*list(self._draining))

    def known(self, function: str) -> bool:
        return function in self.functions

    async def sync_once(self) -> list[tuple[str, EndpointView]]:

        # the client blocks: in a thread, so an API server that hangs (etcd stopped) never stalls
        # the requests this event loop serves
        listing = await asyncio.to_thread(self.core.list_namespaced_config_map, self.namespace,
                                          label_selector=FUNCTION_KIND_LABEL)
        maps = [as_dict(c) for c in items_of(listing)]
        names = {(c["metadata"].get("labels") or {}).get(FUNCTION_LABEL) for c in maps}
        for gone in self.functions - names:
            self.gateway.forget(gone)  # held requests of a removed function get their 404
        self.functions = {n for n in names if n}
        self.timeouts = {n: t for c in maps if (n := (c["metadata"].get("labels") or {}).get(FUNCTION_LABEL))
                         and (t := _timeout_in(c)) is not None}
        slices = [as_dict(s) for s in items_of(await asyncio.to_thread(
            self.discovery.list_namespaced_endpoint_slice, self.namespace, label_selector=SLICE_SELECTOR))]
        actions = sync_actions(self.routed, endpoints_from_slices(slices))
        for verb, e in actions:
            key = (e.function, e.replica)
            if verb == "add":
                self.gateway.add_endpoint(e.function, e.replica, e.host, e.port)
                self.routed[key] = e
            elif verb == "drain":  # in the background: a busy replica's drain must not delay the next sync
                del self.routed[key]
                task = asyncio.get_running_loop().create_task(self._drain(e))
                self._draining.add(task)
                task.add_done_callback(self._draining.discard)
            else:
                del self.routed[key]
                self.gateway.remove_endpoint(e.function, e.replica)
        return actions


def controller_poke(url: str, held: Callable[[str], int]) -> Callable[[str], None]:
    """The gateway's poke: tell the controller that requests wait for `function` (fire and forget)."""
    import httpx

    client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=2.0)
    pending: set[asyncio.Task] = set()

    async def send(function: str) -> None:
        try:
            await client.post("/poke", params={"function": function, "held": held(function)})
        except httpx.HTTPError as exc:  # the controller will see the queue in Prometheus anyway
            log.info("poke %s: %s", function, exc)

    def poke(function: str) -> None:
        task = asyncio.get_running_loop().create_task(send(function))
        pending.add(task)
        task.add_done_callback(pending.discard)

    return poke


def api_proxy(controller_url: str):
    """Forward `/api/...` to the controller, streaming the body both ways (artifact uploads are large)."""
    import httpx

    client = httpx.AsyncClient(base_url=controller_url.rstrip("/"), timeout=httpx.Timeout(60.0, connect=5.0))
    hop = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-authorization"}

    async def proxy(scope, receive, send) -> None:
        async def body():
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.lower() not in hop]
        target = scope["path"] + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        try:
            request = client.build_request(scope["method"], target, headers=headers, content=body())
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await send_error(send, Unavailable(f"the control API (controller) is unreachable: {exc}"))
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()
                                    if k.lower().encode() not in hop]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return proxy


def build_app(gateway: Any, registry: Any, sync: EndpointSync, api: Any = None):
    """The ASGI app: inference paths to the gateway; `/api/` to the controller (`api`);
    health, /v1/models and /metrics here."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def app(scope, receive, send_):
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith(("/v2/models/", "/v1/models/")):
            return await gateway.handle(scope, receive, send_)
        if path.startswith("/api/") and api is not None:
            return await api(scope, receive, send_)
        if path == "/metrics":
            return await send_response(send_, 200, generate_latest(registry), CONTENT_TYPE_LATEST.encode())
        if path == "/v2/health/live":
            return await send_response(send_, 200, b'{"live": true}')
        if path == "/v2/health/ready":
            return await send_response(send_, 200, b'{"ready": true}')
        if path == "/v1/models":
            return await send_response(send_, 200, json.dumps({"models": sorted(sync.functions)}).encode())
        await send_error(send_, RouteNotFound(f"no route for {path!r}"))

    return app


def build_parser():
    import argparse

    p = argparse.ArgumentParser(prog="shoal gateway", description="the gateway on a Kubernetes cluster")
    p.add_argument("--backend", choices=("kubernetes",), default="kubernetes")
    p.add_argument("--namespace", default="shoal")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a pod")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--controller-url", default="http://shoal-controller:8081")
    p.add_argument("--sync-s", type=float, default=1.0)
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from kubernetes import client, config
    from prometheus_client import CollectorRegistry

    from serving.gateway import Gateway

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_client_retries()
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    registry = CollectorRegistry()
    # the callbacks name `gateway` and `sync`, bound below, before any request can call them
    gateway = Gateway(registry, controller_poke(args.controller_url, lambda f: gateway.held(f)),
                      lambda f: sync.known(f), timeout_of=lambda f: sync.timeout_of(f))
    sync = EndpointSync(gateway, client.DiscoveryV1Api(), client.CoreV1Api(), args.namespace)

    async def serve() -> None:
        outage = Outage("endpoint sync", log)  # one warning for an outage, one line when it ends

        async def loop() -> None:
            while True:
                try:
                    await sync.sync_once()
                    outage.ok()
                except Exception as exc:  # noqa: BLE001 - the API may be briefly away; keep routing what we have
                    outage.failed(exc)
                await asyncio.sleep(args.sync_s)

        task = asyncio.create_task(loop())
        app = build_app(gateway, registry, sync, api_proxy(args.controller_url))
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                               log_level="warning", lifespan="off"))
        try:
            await server.serve()
        finally:
            task.cancel()

    asyncio.run(serve())
    return 0
