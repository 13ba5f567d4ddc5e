"""Shared fixtures: the digits ONNX model, and real replica processes on loopback."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "functions" / "examples"


@pytest.fixture(scope="session")
def digits_onnx(tmp_path_factory) -> Path:
    from functions.examples.digits import build_digits_onnx

    return build_digits_onnx(tmp_path_factory.mktemp("models") / "digits.onnx")


def emulated_profile(latency_ms: float, memory_mib: int, load_s: float | None = None) -> str:
    """An emulated device profile with the input and output of functions/examples/emulated_resnet.yaml
    and one service time for any batch (slept, not computed: it burns no CPU)."""
    text = f"""kind: profile
inputs:
  - {{name: image, datatype: FP32, shape: [-1, 3, 8, 8]}}
outputs:
  - {{name: logits, datatype: FP32, shape: [-1, 10]}}
latency_ms: {{1: {latency_ms}}}
memory_mib: {memory_mib}
"""
    return text + (f"load_s: {load_s}\n" if load_s is not None else "")


def stop_process(proc: subprocess.Popen, sig: int, timeout: float) -> int:
    """Signal a process, wait for it, kill it if it takes longer than `timeout`."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


@dataclass
class Replica:
    proc: subprocess.Popen
    url: str
    banner: str
    stderr_path: Path
    _stderr_kept: str | None = None

    def stderr_text(self) -> str:
        if self._stderr_kept is not None:
            return self._stderr_kept
        return self.stderr_path.read_text(errors="replace")

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop the process; its stderr stays readable (stderr_text) but its file is removed."""
        code = stop_process(self.proc, sig, timeout)
        if self._stderr_kept is None:
            self._stderr_kept = _take(self.stderr_path)
        return code


def _take(path: Path) -> str:
    """A file's text, removing the file."""
    try:
        text = path.read_text(errors="replace")
        path.unlink()
    except FileNotFoundError:
        return ""
    return text


def start_replica(artifact: Path | str, *args: str, ready_timeout: float = 60.0, wait_ready: bool = True) -> Replica:
    """Start `python -m serving.replica` on a free loopback port; wait until ready. Its stderr
    file is removed by `Replica.stop()`, or here when it fails to start."""
    # stderr goes to a file, not a pipe nobody drains (a full pipe would block the replica)
    fd, name = tempfile.mkstemp(prefix="replica-", suffix=".err")
    stderr_path = Path(name)
    with os.fdopen(fd, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving.replica", str(artifact), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    banner = _readline(proc, 60)
    if "listening on" not in banner:
        stop_process(proc, signal.SIGKILL, 30)
        raise RuntimeError(f"replica did not start (rc={proc.returncode}): {banner}{_take(stderr_path)}")
    url = banner.split("listening on ", 1)[1].split()[0]
    replica = Replica(proc, url, banner, stderr_path)
    if not url.startswith("http://127.0.0.1:"):
        replica.stop(signal.SIGKILL)
        raise AssertionError(f"a replica must bind loopback by default: {banner}")
    if wait_ready:
        _wait_ready(replica, ready_timeout)
    return replica


def _wait_ready(replica: Replica, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if replica.proc.poll() is not None:
            replica.stop()
            raise RuntimeError(f"replica exited rc={replica.proc.returncode}: {replica.stderr_text()}")
        try:
            if httpx.get(f"{replica.url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    replica.stop(signal.SIGKILL)
    raise RuntimeError("replica did not become ready in time")


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """The first stdout line, or "" if none comes within `timeout` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


@pytest.fixture
def replica_factory():
    started: list[Replica] = []

    def factory(artifact, *args, **kwargs) -> Replica:
        r = start_replica(artifact, *args, **kwargs)
        started.append(r)
        return r

    yield factory
    for r in started:
        r.stop(timeout=10)


@dataclass
class Plane:
    """A `shoal up` process on a free loopback port."""

    proc: subprocess.Popen
    url: str
    state_dir: Path

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    def client(self):
        from deploy.cli.client import Shoal

        return Shoal(self.url, state_dir=self.state_dir)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        return stop_process(self.proc, sig, timeout)


def start_plane(state_dir: Path, *args: str) -> Plane:
    state_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = state_dir.parent / f"{state_dir.name}-up.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "up", "--port", "0", "--state-dir", str(state_dir), "--tick-s", "0.2",
         "--log-level", "warning", *args],
        stdout=subprocess.PIPE, stderr=open(stderr_path, "a"), text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    banner = _readline(proc, 60)
    if "endpoint" not in banner:
        proc.kill()
        raise RuntimeError(f"shoal up did not start: {banner}{stderr_path.read_text()}")
    url = banner.split("endpoint ", 1)[1].split()[0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return Plane(proc, url, state_dir)
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("shoal up not ready in 60 s")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05, detail=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f": {detail()}" if detail else ""))
