"""`shoal up`: the whole control plane in one process, on the embedded default.

    shoal up [--host 127.0.0.1] [--port 8080] [--state-dir .shoal] [--devices auto|cpu|emulated:4x80GiB]
             [--auth-inference] [--no-take-back] [--time-share-busy 0.5] [--metrics-source direct|prometheus --prometheus-url URL]
             [--policy shoal|kpa|ray] [--mps auto|on|off] [--no-move-to-slice] [--slice-window-s 300]

One uvicorn server on one port carries the gateway (`/v2/...`, `/v1/...`), the
control API (`/api/v1/...`, bearer token) and `/metrics`; beside it run the
controller loop, the local backend (zygote + replica processes) and the SQLite
registry in STATE_DIR. The controller reads replica metrics from each replica's
/metrics (direct, the default) or, with `--metrics-source prometheus`, through the
PromQL API of a Prometheus that scrapes the replicas; p95 and the share over the SLO come from
the gateway's own histogram (from arrival). `--policy kpa|ray` runs a baseline's policy instead
of Shoal's (autoscaler.policies), to compare them live. On a real GPU the replicas are clients of
an MPS daemon, so that each slice is its share of the SMs (`--mps`, deploy.local.mps). The token
is made on first start (STATE_DIR/token, mode 0600). After a restart every registered function is
back, scaled to zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from autoscaler.loop import EventSink, FunctionSource, Loop, Policy
from autoscaler.placement import Inventory, parse_devices
from autoscaler.policies import POLICIES, Shoal, policy_named
from autoscaler.replicas import ControllerConfig, ReplicaBackend, ReplicaScaler, Router
from autoscaler.sources.direct import HttpScraper, Latencies, ReplicaScrapes, Scraper
from autoscaler.sources.promql import PrometheusSource
from deploy.api import check_token, create_api, write_artifact
from deploy.local.backend import LocalBackend, short_dir
from deploy.local.mps import CONTROL, MODES, GpuSharing, MpsDaemon, answers, choose, gpu_sharing
from deploy.local.inventory import discover_gpus, memory_mib, usable_cpus
from functions.artifacts import DEFAULT_MAX_ARTIFACT_BYTES, ArtifactStore
from functions.registry import FunctionRecord, Registry
from functions.spec import LIMITS, FunctionSpec
from serving import __version__
from serving.gateway import Gateway, GatewayConfig
from serving.models import LoadError, detect_loader
from serving.asgi import send_error, send_response
from serving.protocol.codec import dumps
from serving.protocol.errors import InferenceError, NotFound, RouteNotFound

log = logging.getLogger("shoal.up")


def ensure_token(state_dir: Path) -> str:
    """The control API's bearer token: read, or made once with mode 0600."""
    path = state_dir / "token"
    if path.exists():
        os.chmod(path, 0o600)
        token = path.read_text().strip()
        if len(token) >= 16:
            return token
        path.unlink()  # empty or too short to be a secret: make a real one
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def lock_state_dir(state_dir: Path):
    """One control plane per state directory: a second `shoal up` on it is refused."""
    import fcntl

    handle = open(state_dir / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ValueError(f"{state_dir} is in use by another shoal up (its lock file is held)") from None
    return handle


class RegistrySource:
    """The controller's view of the registry (cached; refreshed on every change)."""

    broken: frozenset[str] = frozenset()  # a registry row always parses

    def __init__(self, registry: Registry):
        self.registry = registry
        self._cache: dict[str, tuple[FunctionSpec, int]] | None = None

    def functions(self) -> dict[str, tuple[FunctionSpec, int]]:
        if self._cache is None:
            self._cache = {r.spec.name: (r.spec, r.revision) for r in self.registry.list_functions()}
        return self._cache

    def changed(self) -> None:
        self._cache = None


class LocalGateway(Router, Latencies, Protocol):
    """What shoal up's loop needs of its gateway: routing, and the latencies it measured."""


def control_loop(source: FunctionSource, backend: ReplicaBackend, gateway: LocalGateway, inventory: Inventory,
                 scraper: Scraper, events: EventSink, registry: CollectorRegistry,
                 config: ControllerConfig = ControllerConfig(), policy: Policy = Shoal()) -> Loop:
    """shoal up's control loop: replicas it starts itself, metrics scraped from each of them and
    latencies from the gateway, decided by `policy`."""
    scaler = ReplicaScaler(backend, gateway, inventory, events, registry, config)
    return Loop(source, ReplicaScrapes(scaler, scraper, gateway), scaler, events, registry, policy)


class ControlPlane:
    def __init__(self, state_dir: Path, devices: str = "auto", auth_inference: bool = False,
                 gateway_config: GatewayConfig = GatewayConfig(), controller_config: ControllerConfig = ControllerConfig(),
                 max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES, prometheus_url: str | None = None,
                 policy: Policy = Shoal(), mps: str = "auto"):
        self.state_dir = Path(state_dir)
        if not self.state_dir.exists():
            self.state_dir.mkdir(parents=True)
            os.chmod(self.state_dir, 0o700)
        self._lock = lock_state_dir(self.state_dir)
        self.token = ensure_token(self.state_dir)
        self.registry = Registry(self.state_dir / "registry.db")
        self.store = ArtifactStore(self.state_dir / "artifacts", max_artifact_bytes)
        self.metrics = CollectorRegistry(auto_describe=True)
        self.source = RegistrySource(self.registry)
        self.devices = parse_devices(devices, usable_cpus(), memory_mib(), discover_gpus())
        self._mps_mode = mps
        choose(mps, self._has_gpus, os.environ, shutil.which(CONTROL), answers)  # a bad --mps fails here
        self.sharing = GpuSharing("none", "not started")
        self._mps: MpsDaemon | None = None
        self.gateway = Gateway(
            self.metrics, poke=self._poke, known=lambda n: n in self.source.functions(),
            config=gateway_config, authorize=self._authorize_inference if auth_inference else None,
            timeout_of=self._timeout_of,
        )
        self.backend = LocalBackend(self.state_dir, self.store.path)
        # direct scrapes, or the same numbers through a Prometheus that scrapes the replicas
        self.scraper = PrometheusSource(prometheus_url) if prometheus_url else HttpScraper()
        self.loop = control_loop(self.source, self.backend, self.gateway, Inventory(self.devices), self.scraper,
                                 self.event, self.metrics, controller_config, policy)
        self.scaler: ReplicaScaler = self.loop.scaler
        self.api = create_api(self)
        self._loop_task: asyncio.Task | None = None

    def _timeout_of(self, function: str) -> float:
        found = self.source.functions().get(function)
        return found[0].timeout_s if found else LIMITS.request_timeout_s

    # ------------------------------------------------------------------ lifecycle

    @property
    def _has_gpus(self) -> bool:
        return any(d.kind == "gpu" for d in self.devices)

    async def start(self) -> None:
        self.sharing, self._mps = await asyncio.to_thread(
            gpu_sharing, self._mps_mode, self._has_gpus, short_dir(self.state_dir, "mps"))
        if self.sharing.mode == "time-sliced":
            log.log(logging.INFO if self._mps_mode == "off" else logging.WARNING,
                    "GPU slices are time-sliced (%s): a replica's compute is not held to its slice", self.sharing.why)
        try:
            await self.backend.start(self.sharing.env)
        except BaseException:
            await self._quit_mps()
            raise
        functions = self.source.functions()
        gpus = "" if self.sharing.mode == "none" else f", GPUs {self.sharing.mode} ({self.sharing.why})"
        self.event("up", f"control plane up, {len(functions)} function(s) restored scaled to zero, "
                         f"policy {self.loop.policy.name}{gpus}",
                   data={"functions": sorted(functions), "devices": [d.id for d in self.devices],
                         "policy": self.loop.policy.name, "gpu_sharing": self.sharing.mode})
        self._loop_task = asyncio.get_running_loop().create_task(
            self.loop.run(self.scaler.config.tick_s, self.scaler.clock))

    async def stop(self) -> None:
        self.loop.stop()
        await self.scaler.shutdown()
        if self._loop_task is not None:
            self._loop_task.cancel()
        try:
            await self.backend.close()
        finally:
            await self._quit_mps()  # after its clients, the replicas
        await self.scraper.close()
        self.event("down", "control plane stopped")
        self.registry.close()

    async def _quit_mps(self) -> None:
        if self._mps is not None:
            await asyncio.to_thread(self._mps.quit)
            self._mps = None

    def _poke(self, function: str) -> None:
        self.loop.poke(function)

    def _authorize_inference(self, headers: dict[bytes, bytes]) -> InferenceError | None:
        return check_token(headers.get(b"authorization", b"").decode("latin-1") or None, self.token)

    # ------------------------------------------------------------------ registry operations

    def event(self, kind: str, message: str, function: str | None = None, data: dict | None = None) -> None:
        self.registry.add_event(time.time(), kind, message, function, data)
        log.info("%s %s: %s", kind, function or "-", message)

    async def store_artifact(self, stream, filename: str):
        artifact = await write_artifact(self.store, stream, filename)
        self.registry.add_artifact(artifact, time.time())
        return artifact

    def put_function(self, spec: FunctionSpec) -> FunctionRecord:
        record = self.registry.put_function(spec, time.time())
        self.source.changed()
        self.gateway.invalidate(spec.name)
        self.event("deploy", f"{spec.name} revision {record.revision} ({spec.artifact.rsplit('/', 1)[-1]}, "
                   f"slice {spec.slice.name}, min {spec.scaling.min_replicas} max {spec.scaling.max_replicas})",
                   function=spec.name, data={"revision": record.revision})
        self.loop.poke(spec.name)
        return record

    def delete_function(self, name: str) -> None:
        self.registry.delete_function(name)
        self.source.changed()
        self.gateway.invalidate(name)
        self.event("delete", f"{name} removed", function=name)
        self.loop.poke(name)

    # ------------------------------------------------------------------ views

    def model_metadata(self, record: FunctionRecord) -> dict[str, Any]:
        """The function's V2 model metadata off the data path, so that reading it never cold-starts
        a function at zero (a load test reads it before its load): what a replica of this revision
        answered through the gateway, or what its emulated profile declares."""
        name = record.spec.name
        cached = self.gateway.metadata(name)
        if cached is not None:
            return json.loads(cached)
        path = str(self.store.path(record.spec.artifact))
        try:
            loader = record.spec.loader or detect_loader(path)
        except LoadError:
            loader = None
        if loader == "profile":
            from serving.models.profile import declared_metadata  # numpy and yaml: only when asked

            return declared_metadata(path, name)
        raise NotFound(f"the model metadata of {name!r} (a {loader or 'model'}) is known only once a replica of "
                       f"revision {record.revision} has answered GET /v2/models/{name}")

    def function_view(self, record: FunctionRecord) -> dict[str, Any]:
        return {**record.to_json(), "endpoints": {
            "v2": f"/v2/models/{record.spec.name}/infer", "v1": f"/v1/models/{record.spec.name}:predict"}}

    def status(self) -> dict[str, Any]:
        live = self.scaler.status(self.loop.snapshots, self.loop.decisions)
        use = self.scaler.slice_use()
        # the controller's last full tick on the wall clock (its own clock is monotonic): when the
        # live loop looks, for a replay's tick phase (loadtests.bench.simlive.live_tick_timing)
        ticked = self.loop.ticked_at
        ticked_at = None if ticked is None else round(time.time() - (self.scaler.clock() - ticked), 4)
        functions = {}
        for name, (spec, revision) in self.source.functions().items():
            slice_s, held = use.get(name, (0.0, 0.0))
            functions[name] = {"revision": revision, "slice": spec.slice.name, "slo_p95_ms": spec.scaling.slo_p95_ms,
                               "ready": 0, "starting": 0, "replicas": [], **live.get(name, {}),
                               **self.loop.explain(name),
                               "cold_starts": self.loop.exported.cold_starts.get(name, 0),
                               "slice_seconds": slice_s, "slices_held": held, "ticked_at": ticked_at}
        return {"functions": functions, "devices": self.inventory_view()["devices"], "version": __version__,
                "policy": self.loop.policy.name, "gpu_sharing": {"mode": self.sharing.mode, "why": self.sharing.why}}

    def inventory_view(self) -> dict[str, Any]:
        inv = self.scaler.cluster
        return {"devices": [
            {"id": d.id, "kind": d.kind, "emulated": d.emulated, "memory_mib": d.memory_mib, "name": d.name,
             "allocated": inv.allocated_ratio(d.id), "memory_used_mib": inv.used(d.id)[1],
             **({"sharing": self.sharing.mode} if d.kind == "gpu" else {})}
            for d in inv.devices
        ]}

    # ------------------------------------------------------------------ HTTP

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith("/api/"):
            return await self.api(scope, receive, send)
        if path.startswith(("/v2/models/", "/v1/models/")):
            return await self.gateway.handle(scope, receive, send)
        if path == "/metrics":
            return await send_response(send, 200, generate_latest(self.metrics), CONTENT_TYPE_LATEST.encode())
        if path == "/v2/health/live":
            return await send_response(send, 200, dumps({"live": True}))
        if path == "/v2/health/ready":
            return await send_response(send, 200, dumps({"ready": True}))
        if path in ("/v2", "/v2/"):
            return await send_response(send, 200, dumps({"name": "shoal", "version": __version__,
                                                         "extensions": ["binary_tensor_data"]}))
        if path == "/v1/models":
            denied = self.gateway.denied(dict(scope["headers"]))
            if denied is not None:  # with --auth-inference the list of functions is not public either
                await send_error(send, denied)
                return
            return await send_response(send, 200, dumps({"models": sorted(self.source.functions())}))
        await send_error(send, RouteNotFound(f"no route for {path!r}"))

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    log.error("shoal up did not start: %s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal up", description="Run the control plane: gateway, API, controller, local backend.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--state-dir", default=".shoal", help="registry, artifacts, token and logs (default .shoal)")
    p.add_argument("--devices", default="auto", help="auto (NVML GPUs, else the CPU), cpu, or emulated:4x80GiB")
    p.add_argument("--auth-inference", action="store_true", help="require the bearer token on inference endpoints too")
    p.add_argument("--hold-timeout-s", type=float, default=30.0, help="how long a request may wait for a cold start")
    p.add_argument("--tick-s", type=float, default=1.0, help="controller tick (default 1 s)")
    p.add_argument("--no-take-back", action="store_true",
                   help="a replica that cannot be placed does not take slices back from other functions' "
                        "replicas, idle or busy (for comparison; requests waiting for it are refused)")
    p.add_argument("--no-move-to-slice", action="store_true",
                   help="keep a running replica on its slice when the policy asks a smaller one for its function "
                        "(default: a replica on the asked slice starts and takes over)")
    p.add_argument("--slice-window-s", type=float, default=None,
                   help="how long the shoal policy averages a replica's duty before it asks a larger or smaller "
                        "slice, and spaces its slice changes by (default 300 s)")
    p.add_argument("--time-share-busy", type=float, default=ControllerConfig().time_share_busy,
                   help="a function's first replica that no free or lent slice can take time-shares a device "
                        "whose replicas are busy at most this share of its compute (default 0.5; 0: never, "
                        "its requests wait for a slice)")
    p.add_argument("--max-artifact-mib", type=float, default=DEFAULT_MAX_ARTIFACT_BYTES / 2**20,
                   help="largest artifact accepted (default 1024 MiB)")
    p.add_argument("--metrics-source", choices=("direct", "prometheus"), default="direct",
                   help="where the controller reads replica metrics: each replica's /metrics (default), "
                        "or PromQL on --prometheus-url")
    p.add_argument("--prometheus-url", default=None,
                   help="Prometheus HTTP API base URL for --metrics-source prometheus, e.g. http://127.0.0.1:9090")
    p.add_argument("--policy", choices=tuple(POLICIES), default="shoal",
                   help="the scaling policy: shoal (default), or a baseline to compare it with: kpa (Knative), "
                        "ray (Ray Serve)")
    p.add_argument("--mps", choices=MODES, default="auto",
                   help="on a real GPU, run the replicas as MPS clients so that a slice is its share of the SMs "
                        "and a memory limit: auto (default: the daemon that answers at CUDA_MPS_PIPE_DIRECTORY or "
                        "/tmp/nvidia-mps, else one started for shoal up, else time-sliced, saying why), on (fail "
                        "without it), off (time-sliced)")
    p.add_argument("--log-level", default="info")
    return p


def metrics_source_url(source: str, prometheus_url: str | None) -> str | None:
    """The Prometheus URL the controller reads through, or None for direct scrapes."""
    if source == "prometheus" and not prometheus_url:
        raise ValueError("--metrics-source prometheus needs --prometheus-url (e.g. http://127.0.0.1:9090)")
    if source == "direct" and prometheus_url:
        raise ValueError(f"--prometheus-url ({prometheus_url}) is only read with --metrics-source prometheus")
    if prometheus_url and not prometheus_url.startswith(("http://", "https://")):
        raise ValueError(f"--prometheus-url ({prometheus_url}) must start with http:// or https://")
    return prometheus_url


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        prometheus_url = metrics_source_url(args.metrics_source, args.prometheus_url)
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2, as argparse does for a bad option
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # readiness polls would flood the log
    try:
        plane = ControlPlane(
            Path(args.state_dir), args.devices, args.auth_inference,
            GatewayConfig(hold_timeout_s=args.hold_timeout_s),
            ControllerConfig(tick_s=args.tick_s, take_back=not args.no_take_back,
                             time_share_busy=args.time_share_busy, move_to_slice=not args.no_move_to_slice),
            int(args.max_artifact_mib * 2**20), prometheus_url, policy_named(args.policy, args.slice_window_s), args.mps,
        )
    except ValueError as exc:
        print(f"shoal up: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.auth_inference:
        print(f"shoal up: WARNING: listening on {args.host} with no auth on inference endpoints "
              "(anyone who reaches this address can call every function); add --auth-inference", file=sys.stderr)
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"shoal up: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    devices = ", ".join(f"{d.id}{' (emulated)' if d.emulated else ''}" for d in plane.devices)
    print(f"shoal up: endpoint http://{host}:{port}  token {Path(args.state_dir).resolve() / 'token'}  devices {devices}",
          flush=True)
    config = uvicorn.Config(plane, http="httptools", ws="none", lifespan="on", log_level="warning",
                            access_log=False, server_header=False,
                            timeout_graceful_shutdown=int(LIMITS.graceful_shutdown_s),
                            # a client's idle connection is closed by the server after this; at
                            # uvicorn's 5 s a client that reused one just then saw it closed under
                            # its request (6 of 12,093 in one run: docs/benchmarks.md).
                            # 75 s, nginx's keepalive_timeout, outlasts the usual 60 s client idle
                            timeout_keep_alive=75, proxy_headers=False)
    server = uvicorn.Server(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    from serving.replica import event_loop_factory

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))
    return 0 if server.started else 1  # its startup failed (e.g. --mps on and no daemon started): logged


if __name__ == "__main__":
    sys.exit(main())
