"""How `shoal up`'s replicas share a real GPU: as clients of an MPS control daemon, so that a slice
is at most its share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and a memory limit the driver
enforces (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), or time-sliced, where a replica at 1/4 takes every
SM it can while it runs. Time-sliced, the slices of one GPU are no partition: on an H200 four
replicas at 1/4 served what one served alone, and a busy neighbour made a function's p50 2.2-2.6x
(docs/gpu.md). `--mps auto` (the default) uses the daemon that answers at CUDA_MPS_PIPE_DIRECTORY
or at CUDA's default pipe directory, else starts one of its own (pipe and log under the state
directory; quit when shoal up stops, and one a killed shoal up left is quit at the next start),
else says why the GPUs are time-sliced; `--mps on` fails where it cannot; `--mps off` starts none,
and its replicas are pointed at an empty pipe directory so that no daemon takes them. `choose` is
pure; `MpsDaemon` runs nvidia-cuda-mps-control. Stdlib only.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

log = logging.getLogger("shoal.mps")

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE = "/tmp/nvidia-mps"  # where a CUDA client looks when PIPE_ENV is unset
MODES = ("auto", "on", "off")
ASK_TIMEOUT_S = 30.0  # one command to the daemon, or its start
GONE_WITHIN_S = 10.0  # a daemon told to quit has closed its control socket


@dataclass(frozen=True)
class GpuSharing:
    """How the GPU replicas share their devices: `mode` "mps", "time-sliced", or "none" (no GPU),
    why, and the environment every GPU replica gets for it (the daemon's pipe and log directories;
    when time-sliced, an empty pipe directory)."""

    mode: str
    why: str
    env: Mapping[str, str] = field(default_factory=dict)


def answers(pipe_dir: str | Path) -> bool:
    """Whether an MPS control daemon listens at `pipe_dir`: its control socket (a Unix
    SOCK_SEQPACKET one, seen on driver 580) accepts; a listener of another type answers
    EPROTOTYPE, a socket file nobody listens on (a killed daemon's) ECONNREFUSED."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(str(Path(pipe_dir) / "control"))
        except OSError as exc:
            return exc.errno == errno.EPROTOTYPE
    return True


def choose(mode: str, has_gpus: bool, environ: Mapping[str, str], control: str | None,
           running: Callable[[str], bool]) -> tuple[str, str]:
    """What to do for `--mps mode`: ("none", why) with no GPU, ("inherit", pipe directory) for a
    daemon that answers there (`running`), ("start", why) or ("time-sliced", why). ValueError for
    `on` where MPS cannot be had, or an invalid mode. Pure: `running` is asked, not probed here."""
    if mode not in MODES:
        raise ValueError(f"--mps {mode!r} is invalid: expected one of {', '.join(MODES)}")
    if not has_gpus:
        if mode == "on":
            raise ValueError("--mps on needs an NVIDIA GPU among --devices (NVML found none, or none was asked for)")
        return "none", "no GPU"
    if mode == "off":
        return "time-sliced", "--mps off"
    named = environ.get(PIPE_ENV)
    if named:
        if running(named):
            return "inherit", named
        if mode == "on":
            raise ValueError(f"--mps on: no MPS daemon answers at {PIPE_ENV}={named}")
        return "time-sliced", f"no MPS daemon answers at {PIPE_ENV}={named}"
    if running(DEFAULT_PIPE):
        return "inherit", DEFAULT_PIPE
    if control is None:
        if mode == "on":
            raise ValueError(f"--mps on: no {CONTROL} on PATH (it comes with the NVIDIA driver)")
        return "time-sliced", f"no {CONTROL} on PATH"
    return "start", "an MPS daemon of shoal up's own"


class MpsDaemon:
    """An MPS control daemon started by shoal up, its pipe and log directories under `directory`."""

    def __init__(self, control: str, directory: Path, run: Callable = subprocess.run,
                 running: Callable[[str], bool] = answers):
        self.control = control
        self.pipe = directory / "pipe"
        self.logs = directory / "log"
        self._run = run
        self._running = running

    @property
    def env(self) -> dict[str, str]:
        return {PIPE_ENV: str(self.pipe), LOG_ENV: str(self.logs)}

    def _ask(self, command: str) -> subprocess.CompletedProcess:
        return self._run([self.control], input=f"{command}\n", env={**os.environ, **self.env}, text=True,
                         capture_output=True, timeout=ASK_TIMEOUT_S)

    def quit_left(self) -> bool:
        """Quit a daemon left on these directories (a shoal up killed before it could), and wait
        until it has gone; whether there was one."""
        if not self._running(str(self.pipe)):
            return False
        log.warning("quitting the MPS daemon a stopped shoal up left on %s", self.pipe)
        self.quit()
        deadline = time.monotonic() + GONE_WITHIN_S
        while self._running(str(self.pipe)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return True

    def start(self) -> None:
        """Start the daemon (`-d`: it runs on as a daemon, and starts an MPS server at its first
        client) on fresh directories, one left there quit first (gpu_sharing: quit_left). The
        daemon appends to its logs (control.log, server.log): the last run's are kept as
        *.log.1, so the directory holds two runs, not every run since the first.
        RuntimeError with its words where it does not start."""
        try:
            shutil.rmtree(self.pipe, ignore_errors=True)
            self.pipe.mkdir(mode=0o700, parents=True)
            self.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
            for old in self.logs.glob("*.log"):
                old.replace(old.with_name(f"{old.name}.1"))
        except OSError as exc:
            raise RuntimeError(f"cannot prepare {self.pipe}: {exc}") from None
        try:
            started = self._run([self.control, "-d"], env={**os.environ, **self.env}, text=True,
                                capture_output=True, timeout=ASK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{CONTROL} -d: {exc}") from None
        if started.returncode != 0:
            words = (started.stderr or started.stdout or "").strip() or f"status {started.returncode}"
            raise RuntimeError(f"{CONTROL} -d: {words}")

    def quit(self) -> None:
        """Quit the daemon and the MPS server it started (after the replicas, its clients, stop)."""
        try:
            done = self._ask("quit")
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("the MPS daemon on %s did not quit: %s", self.pipe, exc)
            return
        if done.returncode != 0:
            log.warning("the MPS daemon on %s did not quit: %s", self.pipe,
                        (done.stderr or done.stdout or "").strip() or f"status {done.returncode}")


def gpu_sharing(mode: str, has_gpus: bool, directory: Path, environ: Mapping[str, str] = os.environ,
                which: Callable[[str], str | None] = shutil.which, run: Callable = subprocess.run,
                running: Callable[[str], bool] = answers) -> tuple[GpuSharing, MpsDaemon | None]:
    """The sharing for `--mps mode` and the daemon started for it (None where none was), after
    quitting one a killed shoal up left under `directory` whatever the mode. `auto` falls back to
    time-slicing where the daemon does not start, saying why; `on` raises ValueError."""
    control = which(CONTROL)
    daemon = MpsDaemon(control, directory, run, running) if has_gpus and control is not None else None
    if daemon is not None:
        daemon.quit_left()
    action, why = choose(mode, has_gpus, environ, control, running)
    if action == "none":
        return GpuSharing("none", why), None
    if action == "inherit":
        logs = environ.get(LOG_ENV)
        return GpuSharing("mps", f"the MPS daemon at {why}", {PIPE_ENV: why, **({LOG_ENV: logs} if logs else {})}), None
    if action == "start":  # `control` was found: `daemon` is one
        try:
            daemon.start()
        except RuntimeError as exc:
            if mode == "on":
                raise ValueError(f"--mps on: {exc}") from None
            why = f"the MPS daemon did not start ({exc})"
        else:
            return GpuSharing("mps", f"{why}, pipe {daemon.pipe}", daemon.env), daemon
    # time-sliced: an empty pipe directory, so that no daemon (CUDA's default one) takes the replicas
    empty = directory / "none"
    try:
        empty.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot make %s (%s): a daemon at %s would take the replicas", empty, exc, DEFAULT_PIPE)
        return GpuSharing("time-sliced", why), None
    return GpuSharing("time-sliced", why, {PIPE_ENV: str(empty)}), None
