"""The controller on a cluster: functions from ConfigMaps, metrics from Prometheus (PromQL), the
same `decide()` as `shoal up`, and the Kubernetes backend to make it so.

One tick, while this controller holds the Lease:
1. read the functions (ConfigMaps labelled `shoal.dev/kind=function`: the spec as JSON and its
   revision, written by the control API);
2. observe their Deployments (desired and ready replicas);
3. ask Prometheus, per function, for what the policy needs (`cluster_queries`): request rate,
   the duty cycle of each replica's slice, p95 latency and the latency histogram (the share of
   requests over the function's SLO, for the error budget), requests inside replicas and held
   at the gateway's activator, executor seconds per request, batches run (the batch latencies
   the controller learns, as `shoal up` does), and the cold start last measured on the cluster
   (`ColdStarts`, from the Deployments' ready counts); build the `MetricsSnapshot`
   (`snapshot_from_results`, pure), whose rates were measured over the query window (the
   burst view compares rates of windows that do not overlap);
4. `decide()`, then `KubernetesBackend.reconcile()` with every function's desired count.

A follower does nothing but try for the Lease. Prometheus being unreachable is not zero load: a
function whose metrics cannot be read keeps its replica count this tick.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from autoscaler.metrics import (
    MetricsSnapshot,
    batch_window,
    cumulative_histogram,
    fraction_over,
    learn_batch_latency,
)
from autoscaler.policy import PolicyState, ScaleDecision, decide
from deploy.cluster.configmaps import ConfigMapFunctions, ConfigMapRegistry
from deploy.cluster.backend import Desired, KubernetesBackend, Observed
from functions.spec import FunctionSpec

log = logging.getLogger("shoal.k8s.controller")

WINDOW_S = 30.0  # what the rates of a snapshot are measured over
WINDOW = f"{WINDOW_S:g}s"  # the same in PromQL: "30s"
POKE_TTL_S = 5.0  # a gateway's poke counts this long (then Prometheus has seen the queue)


def cluster_queries(window: str = WINDOW) -> dict[str, str]:
    """PromQL for every function's snapshot at once: nine queries a tick, whatever the number of
    functions (one per function would make a tick outlast the Lease on a large cluster)."""
    by = "by (function)"
    return {
        "rps": f"sum {by} (rate(shoal_replica_requests_total[{window}]))",
        "duty": f"sum by (function, pod) (rate(shoal_replica_busy_seconds_total[{window}]))",
        "p95_s": f"histogram_quantile(0.95, sum by (function, le) "
                 f"(rate(shoal_replica_request_duration_seconds_bucket[{window}])))",
        "inflight": f"sum {by} (shoal_replica_inflight)",
        "queued": f"sum {by} (shoal_replica_queued)",
        "held": f"sum {by} (shoal_activator_queue_depth)",
        "busy": f"sum {by} (rate(shoal_replica_busy_seconds_total[{window}]))",
        "buckets": f"sum by (function, le) (rate(shoal_replica_request_duration_seconds_bucket[{window}]))",
        "batches": f"sum {by} (rate(shoal_replica_batch_size_count[{window}]))",
    }


def by_function(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The vectors of `cluster_queries`, split by their `function` label (pure)."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for key, vector in results.items():
        for sample in vector:
            function = (sample.get("metric") or {}).get("function")
            if function:
                out.setdefault(function, {}).setdefault(key, []).append(sample)
    return out


def _scalar(result: list[dict[str, Any]]) -> float | None:
    """The value of a one-sample vector (None: no sample, or NaN such as a quantile of nothing)."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


def latency_buckets(result: list[dict[str, Any]]) -> tuple[tuple[float, float], ...]:
    """The cumulative histogram ((le, requests per second), ...) of a `buckets` vector
    (metrics.cumulative_histogram; pure); a sample without a numeric bound is left out."""
    pairs = []
    for sample in result:
        try:
            pairs.append((float((sample.get("metric") or {})["le"]), float(sample["value"][1])))
        except (KeyError, ValueError):
            continue
    return cumulative_histogram(pairs)


def snapshot_from_results(function: str, now: float, observed: Observed | None, results: dict[str, list],
                          slice_fraction: float | None = None, slo_s: float | None = None,
                          batch_latency: tuple[tuple[float, float], ...] = (),
                          window_s: float = WINDOW_S, cold_start_s: float | None = None) -> MetricsSnapshot:
    """A MetricsSnapshot from the `data.result` vectors of `cluster_queries` (pure): with the
    function's SLO, the share of the window's requests over it; with the batch latencies
    learned so far (`learn_batch`), the table the policy sizes a batching model on."""
    rps = _scalar(results.get("rps", [])) or 0.0
    busy = _scalar(results.get("busy", [])) or 0.0
    # the busiest `ready` pods: a pod still starting, or gone within the window, shows little work and
    # must not stand in for a ready one
    duties = tuple(sorted((min(1.0, max(0.0, float(s["value"][1]))) for s in results.get("duty", [])
                           if math.isfinite(float(s["value"][1]))), reverse=True))
    ready = observed.ready if observed else 0
    current = observed.replicas if observed else 0
    return MetricsSnapshot(
        function=function, at=now, ready=ready, starting=max(0, current - ready),
        inflight=_scalar(results.get("inflight", [])) or 0.0, queued=_scalar(results.get("queued", [])) or 0.0,
        activator_queue=int(_scalar(results.get("held", [])) or 0), duty=tuple(sorted(duties[:ready])),
        rps=rps, p95_s=_scalar(results.get("p95_s", [])), slice_fraction=slice_fraction,
        service_s=busy / rps if rps > 0 else None, cold_start_s=cold_start_s,
        batch_latency_s=batch_latency if len(batch_latency) > 1 else (),
        over_slo=fraction_over(latency_buckets(results.get("buckets", [])), slo_s) if slo_s is not None else 0.0,
        window_s=window_s,
    )


def learn_batch(table: tuple[tuple[float, float], ...], results: dict[str, list]) -> tuple[tuple[float, float], ...]:
    """The function's batch latencies after this window (metrics.learn_batch_latency): its
    batches, requests answered and busy seconds, all as rates over the window, give the
    requests per batch and the seconds per batch (pure). E.g. 8 batches/s, 38 requests/s,
    0.04 busy s/s: 4.75 requests in 5 ms."""
    window = batch_window(_scalar(results.get("batches", [])) or 0.0, _scalar(results.get("rps", [])) or 0.0,
                          _scalar(results.get("busy", [])) or 0.0)
    return table if window is None else learn_batch_latency(table, *window)


def forget_others(keep: set[str], *tables: dict[str, Any]) -> None:
    """Drop every entry whose function is not in `keep`, from each table, in place."""
    for table in tables:
        for name in [n for n in table if n not in keep]:
            del table[name]


@dataclass
class ColdStarts:
    """Cold starts measured on the cluster, per function: from the tick that raised the
    Deployment's replicas to the first tick that sees that many ready (the pods' scheduling,
    image pull, start and model load; to within a tick). Each raise is measured on its own, so
    a second one while the first is starting reads its own time. The latest is what the policy
    reads as the function's cold start (its forecast looks that far ahead), as `shoal up` reads
    the latest replica's. Fewer ready than asked without a raise (a pod restarting, a readiness
    probe failing, a Deployment a new leader finds mid-scale) is no cold start; a wait longer
    than MAX_S is a wait for capacity (pods Pending on a full cluster), not one either. Pure:
    the caller gives the times."""

    MAX_S = 900.0

    pending: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # function -> [(asked at, replicas)]
    latest: dict[str, float] = field(default_factory=dict)

    def observe(self, function: str, now: float, ready: int) -> None:
        """A tick saw `ready` replicas ready: the raises they complete are measured."""
        steps = self.pending.get(function)
        if not steps:
            return
        for asked_at, target in steps:
            if ready >= target and 0.0 <= now - asked_at <= self.MAX_S:
                self.latest[function] = now - asked_at
        left = [(at, target) for at, target in steps if ready < target and now - at <= self.MAX_S]
        if left:
            self.pending[function] = left
        else:
            del self.pending[function]

    def ask(self, function: str, now: float, desired: int, replicas: int, ready: int) -> None:
        """This tick asks for `desired` replicas where the Deployment has `replicas`, `ready` of
        them ready: a raise starts a measurement; asking for fewer caps the running ones (they
        wait for what is still asked), and for no more than are ready ends them."""
        steps = [(at, min(target, desired)) for at, target in self.pending.get(function, []) if desired > ready]
        if desired > replicas and desired > ready:
            steps.append((now, desired))
        if steps:
            self.pending[function] = steps
        else:
            self.pending.pop(function, None)

    def keep_only(self, functions: set[str]) -> None:
        """Forget functions that are gone (a name deployed again later starts afresh)."""
        forget_others(functions, self.pending, self.latest)

    def clear(self) -> None:
        self.pending.clear()
        self.latest.clear()


@dataclass
class TickResult:
    leader: bool
    decisions: dict[str, ScaleDecision] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)  # functions whose metrics could not be read
    applied: list[str] = field(default_factory=list)


class ClusterController:
    def __init__(self, backend: KubernetesBackend, functions: ConfigMapFunctions,
                 query: Callable[[str], list[dict[str, Any]]], artifact: Callable[[FunctionSpec], Any],
                 clock: Callable[[], float], lease: str = "shoal-controller", lease_s: float = 15.0):
        """`query(promql)` returns the `data.result` of an instant query or raises; `artifact(spec)`
        says where a function's artifact is (deploy.cluster.render.artifact_for)."""
        self.backend, self.functions, self.query, self.artifact, self.clock = (backend, functions, query, artifact,
                                                                               clock)
        self.lease, self.lease_s = lease, lease_s
        self.state: dict[str, PolicyState] = {}
        self.batch_latency: dict[str, tuple[tuple[float, float], ...]] = {}  # learned per function (learn_batch)
        self.cold_starts = ColdStarts()
        self.pokes: dict[str, tuple[float, int]] = {}  # function -> (when, requests held) from a gateway
        self.is_leader = False
        self.last_observed: dict[str, Observed] = {}
        self.last_decisions: dict[str, ScaleDecision] = {}

    def poke(self, function: str, held: int) -> None:
        """A gateway holds `held` requests for `function`: the next tick counts them at once
        (Prometheus would see the queue only after its next scrape)."""
        self.pokes[function] = (self.clock(), max(0, held))

    def tick(self) -> TickResult:
        self.is_leader = self.backend.lead(self.lease, self.lease_s)
        if not self.is_leader:
            self.state.clear()  # a new leader starts from what it measures, not from stale windows
            self.batch_latency.clear()
            self.cold_starts.clear()
            return TickResult(leader=False)
        now = self.clock()
        # a poke counts POKE_TTL_S: older ones are dropped, so names poked once are not kept forever
        self.pokes = {f: p for f, p in self.pokes.items() if now - p[0] <= POKE_TTL_S}
        result = TickResult(leader=True)
        observed = self.last_observed = self.backend.observe()
        desired: dict[str, Desired] = {}
        try:
            per_function = by_function({key: self.query(q) for key, q in cluster_queries().items()})
        except Exception as exc:  # noqa: BLE001 - Prometheus down is not zero load
            log.warning("metrics unavailable (%s); every function keeps its replica count", exc)
            per_function = None
        functions = self.functions.functions()
        names = set(functions) | getattr(self.functions, "broken", set())
        forget_others(names, self.state, self.batch_latency)  # functions that are gone are forgotten
        self.cold_starts.keep_only(names)
        for name, (spec, revision) in sorted(functions.items()):
            have = observed.get(name)
            ready = have.ready if have else 0
            self.cold_starts.observe(name, now, ready)  # also while Prometheus is down
            if per_function is None:
                result.unread.append(name)
                keep = have.replicas if have else spec.scaling.min_replicas
                desired[name] = Desired(spec, revision, keep, self.artifact(spec))
                continue
            results = per_function.get(name, {})
            learned = self.batch_latency[name] = learn_batch(self.batch_latency.get(name, ()), results)
            snapshot = snapshot_from_results(name, now, have, results, float(spec.slice.fraction),
                                             spec.scaling.slo_p95_ms / 1000.0, learned,
                                             cold_start_s=self.cold_starts.latest.get(name))
            poked_at, held = self.pokes.get(name, (0.0, 0))
            if now - poked_at <= POKE_TTL_S and held > snapshot.activator_queue:
                snapshot = snapshot._replace(activator_queue=held)
            decision, self.state[name] = decide(snapshot, spec.scaling, self.state.get(name, PolicyState()), now)
            result.decisions[name] = decision
            self.cold_starts.ask(name, now, decision.desired, have.replicas if have else 0, ready)
            desired[name] = Desired(spec, revision, decision.desired, self.artifact(spec))
        if not self.backend.lead(self.lease, self.lease_s):  # a slow tick may have lost the Lease meanwhile
            self.is_leader = False
            return result
        keep = frozenset(getattr(self.functions, "broken", set()))
        result.applied = self.backend.reconcile(desired, keep).applied
        self.last_decisions = dict(result.decisions)
        return result


def prometheus_query(url: str, timeout_s: float = 5.0) -> Callable[[str], list[dict[str, Any]]]:
    """An instant-query function against Prometheus's HTTP API."""
    import httpx

    client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)

    def query(promql: str) -> list[dict[str, Any]]:
        r = client.get("/api/v1/query", params={"query": promql})
        r.raise_for_status()
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus: {body.get('error', body)}")
        return body["data"]["result"]

    return query


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
                     "replicas": []}
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
                return await send_error(send_, InvalidInput("POST /poke needs ?function=NAME (and &held=N)"))
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
    from prometheus_client import Counter, Gauge

    from deploy.api import create_api
    from deploy.cluster.render import artifact_for
    from deploy.cluster.plane import ClusterPlane
    from deploy.cluster.manifests.gpus import Sharing
    from deploy.cluster.manifests.render import Cluster
    from functions.artifacts import ArtifactStore

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cluster = Cluster(namespace=args.namespace, image=args.image, artifacts_pvc=args.artifacts_pvc,
                      sharing=Sharing(mode=args.gpu_sharing, gpu=args.gpu, ways=args.ways,
                                      hami_policy=args.hami_policy, vgpu_label=args.vgpu_label))
    identity = os.environ.get("POD_NAME") or f"shoal-controller-{os.getpid()}"
    backend = KubernetesBackend.from_kubeconfig(cluster, identity)
    core = client.CoreV1Api()
    ctl = ClusterController(backend, ConfigMapFunctions(core, args.namespace), prometheus_query(args.prometheus_url),
                            lambda spec: artifact_for(spec, args.artifact_source, args.artifact_base), time.time,
                            lease=args.lease, lease_s=args.lease_s)
    token = Path(args.token_file).read_text().strip()
    wake, stop = threading.Event(), threading.Event()
    plane = ClusterPlane(ConfigMapRegistry(core, args.namespace, time.time), ArtifactStore(args.artifacts_dir), token,
                         lambda: status_view(ctl), lambda: {"devices": [], "sharing": args.gpu_sharing,
                                                            "gpu": args.gpu},
                         lambda name: wake.set(), cluster)
    leader = Gauge("shoal_controller_leader", "1 while this controller holds the Lease")
    decisions = Counter("shoal_scale_decisions", "Scale decisions that changed the replica count",
                        ["function", "reason"])
    replicas = Gauge("shoal_function_replicas", "Replicas by state", ["function", "state"])
    last_tick = [time.monotonic()]

    def loop() -> None:
        while not stop.is_set():
            try:
                result = ctl.tick()
                leader.set(1 if result.leader else 0)
                for name, seen in ctl.last_observed.items():
                    replicas.labels(name, "ready").set(seen.ready)
                    replicas.labels(name, "starting").set(max(0, seen.replicas - seen.ready))
                for name, d in result.decisions.items():
                    if any(a.startswith(("scale " + name, "create " + name)) for a in result.applied):
                        decisions.labels(name, d.reason).inc()
            except Exception:  # noqa: BLE001 - one bad tick must not end the controller
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
