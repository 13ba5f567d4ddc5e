"""Peers for `shoal loadtest --peer`: the same ONNX model served by another system on loopback,
`kserve` (KServe's ModelServer, one static replica, kserve_onnx.py in this venv) or `ray` (Ray
Serve autoscaling from zero, ray_serve_app.py in the venv of `make ray-venv`, since Ray Serve
wants protobuf 7, which KServe cannot take; its replica count is read from the status file the
app keeps). `start(kind, model, name)` returns a running `Peer`, or raises `PeerUnavailable`
saying what is missing; `Peer.sample()` stands in for Shoal's status in the runner's samples.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS = {"kserve": "KServe ModelServer (1 static replica)", "ray": "Ray Serve (autoscaling, min replicas 0)"}


class PeerUnavailable(Exception):
    pass


@dataclass
class Peer:
    kind: str
    url: str
    proc: subprocess.Popen
    replicas: Callable[[], int]
    stop_extra: list[list[str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return PEERS[self.kind]

    def sample(self, function: str) -> dict[str, Any]:
        """One sample shaped like Shoal's /api/v1/status entry: a whole replica is a slice of 1."""
        n = self.replicas()
        views = [{"id": f"{self.kind}-{i + 1}", "state": "ready", "slice": "1", "device": "cpu:0", "duty": None}
                 for i in range(n)]
        return {function: {"ready": n, "starting": 0, "held": 0, "desired": n, "slice": "1", "replicas": views}}

    def warm(self, function: str, body, from_zero: bool, timeout_s: float = 120.0) -> None:
        """One request answered (the peer's router and model are up), then, with `from_zero`, wait
        for an autoscaling peer to let its replicas go, as Shoal's run waited for zero."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = httpx.post(f"{self.url}/v2/models/{function}/infer", content=body.data, headers=body.headers,
                               timeout=timeout_s)
                if r.status_code == 200:
                    break
                problem = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as exc:
                problem = str(exc)
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"{self.label} did not answer a request within {timeout_s:g} s: {problem}")
            time.sleep(0.5)
        zero_since = None  # Ray's status can read 0 for a moment in a transition: zero must hold 3 s
        while from_zero and self.kind == "ray":
            now = time.monotonic()
            if self.replicas() > 0:
                zero_since = None
            elif zero_since is None:
                zero_since = now
            elif now - zero_since >= 3.0:
                break
            if now > deadline:
                raise PeerUnavailable(f"{self.label} kept its replicas for {timeout_s:g} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for cmd in self.stop_extra:
            subprocess.run(cmd, capture_output=True, timeout=60)

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(kind: str, model: Path, name: str, *, ray_venv: Path = ROOT / ".venv-ray", timeout_s: float = 120.0) -> Peer:
    if kind not in PEERS:
        raise PeerUnavailable(f"unknown peer {kind!r}; allowed: {', '.join(PEERS)}")
    if not model.is_file() or model.suffix != ".onnx":
        raise PeerUnavailable(f"--model {model}: the peers serve an ONNX file; give the function's .onnx")
    if kind == "kserve":
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "loadtests.peers.kserve_onnx", str(model), "--name", name,
                                 "--http_port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=ROOT, start_new_session=True)
        peer = Peer(kind, f"http://127.0.0.1:{port}", proc, lambda: 1 if proc.poll() is None else 0)
        _wait_ready(peer, f"/v2/models/{name}/ready", timeout_s)
        return peer
    python = ray_venv / "bin" / "python"
    if not python.exists():
        raise PeerUnavailable(f"Ray Serve needs its own venv: {python} is missing (make ray-venv)")
    proc = subprocess.Popen([str(python), str(HERE / "ray_serve_app.py"), str(model), "--route",
                             f"/v2/models/{name}/infer", "--max-replicas", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    stop_ray = [[str(ray_venv / "bin" / "ray"), "stop", "--force"]]  # its daemons outlive the driver otherwise
    banner = proc.stdout.readline()
    if "ray serve ready" not in banner:
        Peer(kind, "", proc, lambda: 0, stop_ray).stop()
        raise PeerUnavailable(f"Ray Serve did not start: {banner.strip() or 'no output'}")
    status_file, port = Path(banner.split()[-2]), int(banner.split()[-1])

    def replicas() -> int:
        try:
            return int(status_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    return Peer(kind, f"http://127.0.0.1:{port}", proc, replicas, stop_ray)


def _wait_ready(peer: Peer, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if peer.proc.poll() is not None:
            raise PeerUnavailable(f"{peer.label} exited with {peer.proc.returncode} before it was ready")
        try:
            if httpx.get(peer.url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    peer.stop()
    raise PeerUnavailable(f"{peer.label} was not ready within {timeout_s:g} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
