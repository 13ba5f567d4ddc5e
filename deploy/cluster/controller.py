"""The controller on a cluster: the control loop of `shoal up` (autoscaler.loop) with functions from
ConfigMaps, metrics from Prometheus (`FunctionQueries`: PromQL by function) and the Kubernetes
backend as its scaler, run while this controller holds the Lease. A follower does nothing but try
for the Lease, and forgets what it learned: a new leader starts from what it measures.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from autoscaler.coldstarts import ColdStarts
from autoscaler.loop import Loop
from autoscaler.policies import Shoal
from autoscaler.policy import DEFAULT_CONFIG, PolicyState, ScaleDecision
from autoscaler.sources.promql import FunctionQueries, Query
from deploy.cluster.backend import KubernetesBackend, KubernetesScaler, Observed, quiet_client_retries
from deploy.cluster.configmaps import ConfigMapFunctions, ConfigMapRegistry
from functions.spec import FunctionSpec

log = logging.getLogger("shoal.k8s.controller")


@dataclass
class TickResult:
    leader: bool
    decisions: dict[str, ScaleDecision] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)  # functions whose metrics could not be read
    applied: list[str] = field(default_factory=list)


def log_event(kind: str, message: str, function: str | None = None, data: dict | None = None) -> None:
    log.info("%s %s: %s", kind, function or "-", message)


class ClusterController:
    def __init__(self, backend: KubernetesBackend, functions: ConfigMapFunctions, query: Query,
                 artifact: Callable[[FunctionSpec], Any], clock: Callable[[], float], lease: str = "shoal-controller",
                 lease_s: float = 15.0, registry: CollectorRegistry | None = None):
        """`query(promql)` returns (or awaits to) the `data.result` of an instant query or raises;
        `artifact(spec)` says where a function's artifact is (deploy.cluster.render.artifact_for)."""
        self.backend, self.functions, self.clock = backend, functions, clock
        self.lease, self.lease_s = lease, lease_s
        self.source = FunctionQueries(query)
        self.scaler = KubernetesScaler(backend, artifact, lease, lease_s)
        # a Deployment's replicas all run its slice (a new slice is a new revision): the policy asks
        # for none, so no decision says it starts one on a slice it will not get; named as the
        # simulator names Shoal without resizing, so its metric and events say which runs
        self.loop = Loop(functions, self.source, self.scaler, log_event, registry or CollectorRegistry(),
                         Shoal(replace(DEFAULT_CONFIG, slice_hints=False), name="shoal-fixed"))
        self.is_leader = False
        self.last_decisions: dict[str, ScaleDecision] = {}
        self._runner: asyncio.AbstractEventLoop | None = None  # the ticks' own, in whichever thread ticks

    @property
    def state(self) -> dict[str, PolicyState]:
        return self.loop.memory.policy

    @property
    def batch_latency(self) -> dict[str, Any]:
        return self.loop.memory.batch

    @property
    def cold_starts(self) -> ColdStarts:
        return self.loop.memory.cold

    @property
    def pokes(self) -> dict[str, tuple[float, int]]:
        return self.source.pokes

    @property
    def last_observed(self) -> dict[str, Observed]:
        return self.scaler.observed

    def poke(self, function: str, held: int) -> None:
        """A gateway holds `held` requests for `function`: the next tick counts them at once
        (Prometheus would see the queue only after its next scrape)."""
        self.source.poke(function, held, self.clock())

    def tick(self) -> TickResult:
        self.is_leader = self.backend.lead(self.lease, self.lease_s)
        if not self.is_leader:
            self.loop.memory.clear()  # a new leader starts from what it measures, not from stale windows
            return TickResult(leader=False)
        if self._runner is None:
            self._runner = asyncio.new_event_loop()
        done = self._runner.run_until_complete(self.loop.tick(self.clock()))
        result = TickResult(True, done.decisions, done.unread, self.scaler.applied)
        if self.scaler.lost_lease:
            self.is_leader = False
            return result
        self.last_decisions = dict(result.decisions)
        return result


def _unreachable(exc: BaseException) -> bool:
    """The API server is away (refused, reset, timed out) or failing (5xx), not a bug of ours."""
    import urllib3

    status = int(getattr(exc, "status", 0) or 0)
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)) or status >= 500


def build_parser():
    import argparse

    from deploy.cluster.manifests.gpus import GPUS, HAMI_POLICIES, MODES
    from deploy.cluster.manifests.render import ARTIFACT_SOURCES, Cluster

    p = argparse.ArgumentParser(prog="shoal controller", description="the controller on a Kubernetes cluster")
    p.add_argument("--backend", choices=("kubernetes",), default="kubernetes")
    p.add_argument("--namespace", default="shoal")
    p.add_argument("--leader-elect", action="store_true", help="hold the Lease before acting (always on)")
    p.add_argument("--lease", default="shoal-controller")
    p.add_argument("--lease-s", type=float, default=15.0)
    p.add_argument("--metrics-source", choices=("prometheus",), default="prometheus")
    p.add_argument("--prometheus-url", default="http://prometheus-operated.monitoring.svc:9090")
    p.add_argument("--gpu-sharing", choices=MODES, default="hami")
    p.add_argument("--gpu", choices=sorted(GPUS), default="A100-80GB")
    p.add_argument("--ways", type=int, default=4, help="timeslice/mps: replicas per GPU")
    p.add_argument("--hami-policy", choices=HAMI_POLICIES, default="binpack")
    p.add_argument("--vgpu-label", default="nvidia.com/gpu.product")
    p.add_argument("--image", default=Cluster().image, help="the image of the replicas")
    p.add_argument("--artifacts-pvc", default=Cluster().artifacts_pvc)
    p.add_argument("--artifact-source", choices=ARTIFACT_SOURCES, default="pvc")
    p.add_argument("--artifact-base", default="")
    p.add_argument("--tick-s", type=float, default=2.0)
    p.add_argument("--host", default="127.0.0.1", help="for /healthz and /metrics (0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--token-file", default="/var/run/shoal/token", help="the control API's bearer token")
    p.add_argument("--artifacts-dir", default="/artifacts", help="where the artifacts PVC is mounted")
    return p


def status_view(ctl: ClusterController) -> dict[str, Any]:
    """`GET /api/v1/status` on a cluster: what the last tick saw and decided, per function."""
    out = {}
    for name, (spec, revision) in ctl.functions.functions().items():
        seen = ctl.last_observed.get(name)
        decision = ctl.last_decisions.get(name)
        out[name] = {"revision": revision, "slice": spec.slice.name, "slo_p95_ms": spec.scaling.slo_p95_ms,
                     "ready": seen.ready if seen else 0,
                     "starting": max(0, seen.replicas - seen.ready) if seen else 0,
                     "desired": decision.desired if decision else None, "reason": decision.reason if decision else None,
                     "detail": decision.detail if decision else None, "replicas": []}
    return {"functions": out, "devices": [], "leader": ctl.is_leader}


def controller_app(ctl: ClusterController, api: Any, wake: Any, alive: Callable[[], bool]):
    """One ASGI app: the control API (/api/v1, bearer token), POST /poke from gateways, /healthz, /metrics."""
    from urllib.parse import parse_qs

    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    from serving.asgi import send_error, send_response
    from serving.protocol.errors import InvalidInput, RouteNotFound

    async def send(send_, status: int, body: bytes, ctype: bytes = b"text/plain") -> None:
        await send_response(send_, status, body, ctype)

    async def app(scope, receive, send_):
        if scope["type"] != "http":
            return await api(scope, receive, send_) if scope["type"] == "lifespan" else None
        path = scope["path"]
        if path.startswith("/api/"):
            return await api(scope, receive, send_)
        if path == "/healthz":
            ok = alive()
            return await send(send_, 200 if ok else 503, b"ok" if ok else b"stalled")
        if path == "/readyz":  # only the Lease holder is ready, so the Service sends API calls and pokes to it
            return await send(send_, 200 if ctl.is_leader else 503, b"leader" if ctl.is_leader else b"follower")
        if path == "/metrics":
            return await send(send_, 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST.encode())
        if path == "/poke" and scope["method"] == "POST":
            q = parse_qs(scope.get("query_string", b"").decode())
            function = (q.get("function") or [""])[0]
            if not function:
                await send_error(send_, InvalidInput("POST /poke needs ?function=NAME (and &held=N)"))
                return
            try:
                held = int((q.get("held") or ["1"])[0])
            except ValueError:
                held = 1
            ctl.poke(function, held)
            wake.set()
            return await send(send_, 202, b"poked")
        await send_error(send_, RouteNotFound(f"no route for {path!r}"))

    return app


def main(argv: list[str] | None = None) -> int:
    """`shoal controller`: the tick loop in a thread; the API, /poke, /healthz and /metrics on one port."""
    import os
    import threading
    import time
    from pathlib import Path

    import uvicorn
    from kubernetes import client
    from prometheus_client import REGISTRY, Gauge

    from autoscaler.sources.promql import PromQL
    from deploy.api import create_api
    from deploy.cluster.render import artifact_for
    from deploy.cluster.plane import ClusterPlane
    from deploy.cluster.manifests.gpus import Sharing
    from deploy.cluster.manifests.render import Cluster
    from functions.artifacts import ArtifactStore

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_client_retries()
    cluster = Cluster(namespace=args.namespace, image=args.image, artifacts_pvc=args.artifacts_pvc,
                      sharing=Sharing(mode=args.gpu_sharing, gpu=args.gpu, ways=args.ways,
                                      hami_policy=args.hami_policy, vgpu_label=args.vgpu_label))
    identity = os.environ.get("POD_NAME") or f"shoal-controller-{os.getpid()}"
    backend = KubernetesBackend.from_kubeconfig(cluster, identity)
    core = client.CoreV1Api()
    ctl = ClusterController(backend, ConfigMapFunctions(core, args.namespace),
                            PromQL(args.prometheus_url, timeout_s=5.0).vector,
                            lambda spec: artifact_for(spec, args.artifact_source, args.artifact_base), time.time,
                            lease=args.lease, lease_s=args.lease_s, registry=REGISTRY)
    token = Path(args.token_file).read_text().strip()
    wake, stop = threading.Event(), threading.Event()
    plane = ClusterPlane(ConfigMapRegistry(core, args.namespace, time.time), ArtifactStore(args.artifacts_dir), token,
                         lambda: status_view(ctl), lambda: {"devices": [], "sharing": args.gpu_sharing,
                                                            "gpu": args.gpu},
                         lambda name: wake.set(), cluster)
    leader = Gauge("shoal_controller_leader", "1 while this controller holds the Lease")
    last_tick = [time.monotonic()]

    def loop() -> None:
        while not stop.is_set():
            try:
                result = ctl.tick()
                leader.set(1 if result.leader else 0)
            except Exception as exc:  # noqa: BLE001 - one bad tick must not end the controller
                if _unreachable(exc):
                    backend.outage.failed(exc)  # one line for the outage, not a traceback a tick
                else:
                    log.exception("tick failed")
            last_tick[0] = time.monotonic()
            wake.wait(args.tick_s)  # a poke from a gateway, or a deploy, starts the next tick at once
            wake.clear()

    worker = threading.Thread(target=loop, name="ticks", daemon=True)
    worker.start()
    log.info("controller %s on namespace %s, %s sharing, Prometheus %s", identity, args.namespace,
             args.gpu_sharing, args.prometheus_url)
    app = controller_app(ctl, create_api(plane), wake,
                         lambda: time.monotonic() - last_tick[0] < max(30.0, 10 * args.tick_s))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")  # returns on SIGTERM
    stop.set()
    wake.set()
    worker.join(30)
    return 0
