"""The local backend: replicas as processes on this machine, forked from a zygote.

The zygote (deploy/local/zygote.py) imports the runtime once; each replica
is a fork that loads its own model, bound to its slice (CPU affinity and
threads, or CUDA_VISIBLE_DEVICES, MPS limits and the framework's memory limit
on a GPU). Replicas die with the control plane, even on `kill -9`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Mapping

import httpx

from autoscaler.placement import Placement
from deploy.local.mps import LOG_ENV, PIPE_ENV
from functions.spec import LIMITS, FunctionSpec
from serving.executor import EMULATED_COMPUTE_ENV

log = logging.getLogger("shoal.local")


class ReplicaStartError(RuntimeError):
    pass


@dataclass(eq=False)
class LocalReplica:
    id: str
    host: str
    port: int
    log_path: Path
    created_at: float
    uds: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)


def short_dir(state_dir: Path, name: str) -> Path:
    """`name` under the state directory, unless that path is too long to hold Unix sockets
    (sun_path: 108 bytes with the socket's name), then a temp dir named after it, so that the
    next start finds what a killed control plane left there."""
    path = state_dir.resolve() / name
    if len(str(path)) > 70:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"shoal-{digest}"
    return path


def _socket_dir(state_dir: Path) -> Path:
    """Where replicas' Unix sockets live (short_dir), cleared of what a killed control plane left."""
    path = short_dir(state_dir, "sockets")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True)
    return path


# replicas' TCP ports are drawn, not taken from bind(0): the kernel hands a port just closed out
# again, and once gave two replicas starting together the same one (docs/benchmarks.md, "Many
# small functions, live": "Address already in use"); and a port from bind(0) lies in the
# kernel's ephemeral range, where any outgoing connection (a load test's, the gateway's) can
# take it before the replica binds it. So: below that range where it can be read, and apart
# from the ports of replicas still starting (LocalBackend.create).
# From 10000 up: under it lie the ports services are commonly configured on (5432, 6379, 8080,
# 9090, ...); with Linux's default range that leaves 22,768 to draw from
PORT_FLOOR = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections (Linux's ip_local_port_range, e.g.
    32768-60999); None where it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(host: str, ephemeral: tuple[int, int] | None = None, rng: random.Random | None = None,
              taken: Collection[int] = ()) -> int:
    """A TCP port on `host` free now, for a replica to bind: one drawn at random below the
    ephemeral range (`ephemeral`, else the kernel's), not in `taken` (the ports of replicas still
    starting, which have not bound theirs yet), bound once to check, so that no outgoing
    connection can take it before the replica binds it (another listener still could). Where the
    range is unknown or leaves under 1,024 ports above PORT_FLOOR (too few to draw apart), or 32
    draws are all taken (a range nearly full: something else is wrong), the port the kernel
    gives, as before. E.g. 32768-60999: a port in 10000-32767."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as the replica binds it (serving.replica)
    span = ephemeral if ephemeral is not None else ephemeral_ports()
    draw = rng or random
    if span is not None and span[0] - PORT_FLOOR >= 1024:
        for _ in range(32):
            port = draw.randrange(PORT_FLOOR, span[0])
            if port in taken:
                continue
            try:
                with socket.socket(family) as s:
                    s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def replica_env(placement: Placement, compute_dir: Path | None = None,
                gpu_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """How the slice is enforced from outside the replica process; on an emulated device, the file
    its replicas share the device's compute through (serving.executor.EmulatedCompute), one per
    device under `compute_dir`; on a GPU, `gpu_env` too (the MPS daemon's directories, where the
    replicas are its clients: deploy.local.mps), under which the MPS limits hold."""
    env = {"PYTHONUNBUFFERED": "1"}
    device = placement.device
    if device.emulated and compute_dir is not None:
        env[EMULATED_COMPUTE_ENV] = str(compute_dir / f"{device.id.replace(':', '-')}.compute")
    if device.kind == "gpu":
        env.update(gpu_env or {})
        env["CUDA_VISIBLE_DEVICES"] = device.id.split(":", 1)[1]
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(float(placement.fraction) * 100)))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={placement.memory_mib}M"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def replica_argv(spec: FunctionSpec, placement: Placement, artifact: Path, host: str, port: int,
                 uds: str | None = None) -> list[str]:
    device = placement.device
    # Inside the replica a GPU is always index 0: CUDA_VISIBLE_DEVICES exposes only its own.
    device_arg = {"gpu": "gpu:0", "cpu": "cpu"}.get(device.kind, device.id)
    f = placement.fraction
    argv = [
        str(artifact), "--name", spec.name, "--version", spec.version, "--host", host, "--port", str(port),
        "--slice", f"{f.numerator}/{f.denominator}:{placement.memory_mib}" if placement.memory_mib else f"{f.numerator}/{f.denominator}",
        "--device", device_arg,
        "--max-batch-size", str(spec.batching.max_batch_size),
        "--max-queue-delay-ms", str(spec.batching.max_queue_delay_ms),
        "--max-queue", str(spec.batching.max_queue_requests),
        "--log-level", "warning",
    ]
    if spec.timeout_s != LIMITS.request_timeout_s:
        argv += ["--request-timeout-s", f"{spec.timeout_s:g}"]
    if spec.batching.preferred_batch_sizes:
        argv += ["--preferred-batch-sizes", ",".join(map(str, spec.batching.preferred_batch_sizes))]
    # resized: an emulated profile's latencies hold on the deployed slice (other models ignore it)
    if f != spec.slice.fraction:
        argv += ["--profile-slice", spec.slice.name]
    if placement.cpus:
        argv += ["--cpus", ",".join(map(str, placement.cpus))]
    if spec.loader:
        argv += ["--loader", spec.loader]
    if spec.trust:
        argv.append("--trust")
    if uds:
        argv += ["--uds", uds]
    return argv


class LocalBackend:
    def __init__(self, state_dir: Path, artifact_path, host: str = "127.0.0.1",
                 clock=time.monotonic):
        self.state_dir = Path(state_dir)
        self.log_dir = self.state_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.artifact_path = artifact_path  # ref -> Path
        self.host = host
        self.clock = clock
        self._zygote: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._spawned: dict[str, asyncio.Future] = {}
        self._by_pid: dict[int, LocalReplica] = {}
        self._created: dict[str, LocalReplica] = {}  # replicas not seen exited: their ports are taken
        self._early_exits: dict[int, int] = {}
        self._http: httpx.AsyncClient | None = None
        self._closing = False
        self.socket_dir = _socket_dir(self.state_dir)
        self.compute_dir = self.state_dir / "emulated"  # the emulated devices' compute, shared by their replicas
        self.compute_dir.mkdir(parents=True, exist_ok=True)
        self.gpu_env: dict[str, str] = {}  # what a GPU replica's sharing needs (deploy.local.mps)

    async def start(self, gpu_env: Mapping[str, str] | None = None) -> None:
        """Start the zygote; GPU replicas get `gpu_env` (their sharing: deploy.local.mps)."""
        self.gpu_env = dict(gpu_env or {})
        self._http = httpx.AsyncClient(timeout=2.0)
        await self._start_zygote()

    async def _start_zygote(self) -> None:
        # its own session: a Ctrl-C in the terminal reaches shoal up alone, which drains
        # replicas before it stops them, instead of killing every replica at once
        with open(self.log_dir / "zygote.log", "ab") as log_file:
            self._zygote = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "deploy.local.zygote",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_file,
                # an MPS daemon is a GPU replica's only where its sharing says (gpu_env)
                env={**{k: v for k, v in os.environ.items() if k not in (PIPE_ENV, LOG_ENV)},
                     "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            )
        hello = json.loads(await asyncio.wait_for(self._zygote.stdout.readline(), 60))
        assert hello["op"] == "hello", hello
        self._reader = asyncio.get_running_loop().create_task(self._read_zygote())

    async def _read_zygote(self) -> None:
        assert self._zygote is not None
        while line := await self._zygote.stdout.readline():
            message = json.loads(line)
            if message["op"] == "spawned":
                future = self._spawned.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message["pid"])
            elif message["op"] == "exited":
                replica = self._by_pid.pop(message["pid"], None)
                if replica is None:
                    self._early_exits[message["pid"]] = message["code"]
                else:
                    replica.exit_code = message["code"]
                    replica.exited.set()
        # its replicas died with it (PR_SET_PDEATHSIG): say so, so that the controller replaces them
        for replica in list(self._by_pid.values()):
            replica.exit_code = -9
            replica.exited.set()
        self._by_pid.clear()
        for future in self._spawned.values():
            if not future.done():
                future.set_exception(ReplicaStartError("the zygote exited"))
        self._spawned.clear()
        if not self._closing:
            log.error("the zygote exited unexpectedly; starting a new one")
            asyncio.get_running_loop().create_task(self._start_zygote())

    def _command(self, message: dict) -> None:
        assert self._zygote is not None and self._zygote.stdin is not None
        self._zygote.stdin.write((json.dumps(message) + "\n").encode())

    async def create(self, replica_id: str, spec: FunctionSpec, placement: Placement) -> LocalReplica:
        for gone in [k for k, r in self._created.items() if r.exited.is_set()]:
            del self._created[gone]
        # replicas starting at once draw apart: one still loading has not bound its port yet
        port = free_port(self.host, taken={r.port for r in self._created.values()})
        replica = LocalReplica(replica_id, self.host, port, self.log_dir / f"{replica_id}.log", self.clock(),
                               uds=str(self.socket_dir / f"{replica_id}.sock"))
        self._created[replica_id] = replica
        future = asyncio.get_running_loop().create_future()
        self._spawned[replica_id] = future
        artifact = self.artifact_path(spec.artifact)
        self._command({
            "op": "spawn", "id": replica_id, "log": str(replica.log_path),
            "argv": replica_argv(spec, placement, artifact, self.host, port, replica.uds),
            "env": replica_env(placement, self.compute_dir, self.gpu_env),
        })
        try:
            replica.pid = await asyncio.wait_for(future, 30)
        except BaseException:
            self._created.pop(replica_id, None)
            raise
        self._by_pid[replica.pid] = replica
        if replica.pid in self._early_exits:
            replica.exit_code = self._early_exits.pop(replica.pid)
            replica.exited.set()
        return replica

    async def wait_ready(self, replica: LocalReplica, timeout_s: float) -> tuple[float, float]:
        """Poll the replica's readiness every few ms: (seconds to live, seconds to ready)."""
        url = f"http://{replica.host}:{replica.port}/v2/health/ready"
        live_s = None
        deadline = replica.created_at + timeout_s
        while self.clock() < deadline:
            if replica.exited.is_set():
                raise ReplicaStartError(f"exited with status {replica.exit_code}: {self.log_tail(replica)}")
            # every 3 ms at first (most replicas are ready in tens of ms), backing off to
            # 50 ms so a slow model load is not slowed further by the polling
            pause = min(0.05, 0.003 + 0.01 * (self.clock() - replica.created_at))
            try:
                response = await self._http.get(url)
            except httpx.TransportError:
                await asyncio.sleep(pause)
                continue
            now = self.clock() - replica.created_at
            live_s = now if live_s is None else live_s
            if response.status_code == 200:
                return live_s, now
            await asyncio.sleep(pause)
        raise ReplicaStartError(f"not ready within {timeout_s:g} s: {self.log_tail(replica)}")

    async def stop(self, replica: LocalReplica, grace_s: float) -> None:
        """SIGTERM (the replica finishes in-flight requests), then SIGKILL after grace_s."""
        if replica.pid is None or replica.exited.is_set():
            return
        self._command({"op": "signal", "pid": replica.pid, "signal": int(signal.SIGTERM)})
        try:
            await asyncio.wait_for(replica.exited.wait(), grace_s)
        except asyncio.TimeoutError:
            self._command({"op": "signal", "pid": replica.pid, "signal": int(signal.SIGKILL)})
            await asyncio.wait_for(replica.exited.wait(), 10)

    def exited(self, replica: LocalReplica) -> int | None:
        return replica.exit_code if replica.exited.is_set() else None

    def log_tail(self, replica: LocalReplica, lines: int = 5) -> str:
        try:
            text = replica.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    async def close(self) -> None:
        self._closing = True
        if self._http is not None:
            await self._http.aclose()
        if self._zygote is not None and self._zygote.returncode is None:
            self._zygote.stdin.close()
            try:
                await asyncio.wait_for(self._zygote.wait(), 10)
            except asyncio.TimeoutError:
                self._zygote.kill()
        if self._reader is not None:
            self._reader.cancel()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
