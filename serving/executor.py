"""The executor: runs a replica's model calls one after another on one thread (a slice is one
stream of work) and adds up their time in the model as `busy_seconds`, whose rate, the slice's
duty cycle, is what the autoscaler scales on; NVML's whole-GPU utilization reads 100 % for one
busy request on a shared device (DESIGN.md section 5). It also binds the slice (DESIGN.md
section 7): on cpu, CPU affinity and the framework's intra-op threads; on gpu,
CUDA_VISIBLE_DEVICES (set by whoever starts the replica), MPS active-thread percentage and
pinned memory limit (effective under an MPS daemon) and the framework's own memory limit (ONNX
Runtime gpu_mem_limit, torch memory fraction) passed to the loader; on an emulated device, the
device's compute shared with the other replicas on it (`EmulatedCompute`), so replicas placed
beyond its compute (time-shared) wait for each other as a GPU's time-sliced contexts do.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterator

from functions.spec import SliceRequest


@dataclass(frozen=True, slots=True)
class SliceBinding:
    """Where a replica runs: a slice of one device, and how it is enforced."""

    slice: SliceRequest
    device: str  # "cpu", "gpu:N" or "emulated:N"
    cpus: tuple[int, ...] | None
    threads: int

    @property
    def kind(self) -> str:
        return self.device.partition(":")[0]

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"

    def labels(self) -> dict[str, str]:
        return {
            "slice": self.slice.name,
            "device": self.device,
            "emulated": "true" if self.emulated else "false",
        }


def parse_cpus(text: str | None) -> tuple[int, ...] | None:
    """"0-3,6" -> (0, 1, 2, 3, 6)."""
    if not text:
        return None
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"--cpus {text!r} is invalid: expected a list like '0-3,6'") from None
    return tuple(sorted(set(cpus)))


def bind_slice(request: SliceRequest, device: str, cpus: tuple[int, ...] | None, cpu_count: int) -> SliceBinding:
    """The binding for a slice request; threads follow the CPUs given, else the
    slice's share of this machine's cores (1/4 of 2 cores rounds up to 1 thread)."""
    kind, _, index = device.partition(":")
    if not (device == "cpu" or (kind in ("gpu", "emulated") and (index or "0").isdigit())):
        raise ValueError(f"device {device!r} is invalid: expected cpu, gpu:N or emulated:N")
    threads = len(cpus) if cpus else max(1, math.ceil(float(request.fraction) * cpu_count - 1e-9))
    return SliceBinding(slice=request, device=device, cpus=cpus, threads=threads)


def slice_env(binding: SliceBinding) -> dict[str, str]:
    """Environment that enforces the slice for the frameworks loaded after it is set."""
    env = {
        "OMP_NUM_THREADS": str(binding.threads),
        "MKL_NUM_THREADS": str(binding.threads),
        "OPENBLAS_NUM_THREADS": str(binding.threads),
    }
    if binding.kind == "gpu":
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(binding.slice.compute_pct)))
        if binding.slice.memory_mib:
            index = binding.device.partition(":")[2] or "0"
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{index}={binding.slice.memory_mib}M"
    return env


def apply_binding(binding: SliceBinding) -> None:
    """Pin this process to the slice's CPUs and set its environment (before any
    framework starts its thread pools, so that they inherit both)."""
    for key, value in slice_env(binding).items():
        os.environ.setdefault(key, value)
    if binding.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, binding.cpus)


# The emulated device's compute as byte positions of its file: lcm(1..16), so 1/2 .. 1/16 of it
# are whole ranges and slices of those sizes line up (a 1/4 range covers two 1/8 ones).
_SPAN = 720720
EMULATED_COMPUTE_ENV = "SHOAL_EMULATED_COMPUTE"  # the file of the emulated device a replica runs on


# The CUDA runtime's sticky errors (cudaGetErrorString's words): after one, every later call of
# the process fails the same way, and under MPS a fatal one reaches every client of the GPU's
# server, which takes no new client until they have all exited. Out of memory is not one.
_STICKY_CUDA = (
    "an illegal memory access was encountered",  # cudaErrorIllegalAddress, 700
    "device-side assert triggered",  # cudaErrorAssert, 710
    "unspecified launch failure",  # cudaErrorLaunchFailure, 719
    "an illegal instruction was encountered",  # 715
    "misaligned address",  # 716
    "invalid program counter",  # 718
    "hardware stack error",  # 714
    "the launch timed out and was terminated",  # 702
    "uncorrectable ecc error encountered",  # 214
    "mps client terminated",  # cudaErrorMpsClientTerminated, 810
    "terminated by the server",  # the same, in its longer words
    "procedural call between the mps server and the mps client failed",  # cudaErrorMpsRpcFailure, 806
)


def device_lost(exc: BaseException) -> str | None:
    """The sticky CUDA error `exc` reports (its first line), or None: a replica that met one cannot
    serve again, and exits to be replaced (serving.replica)."""
    text = str(exc)
    low = text.lower()
    if "cuda" in low and any(words in low for words in _STICKY_CUDA):
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return None


class EmulatedCompute:
    """An emulated device's compute, shared by the replicas on it. A model call holds its slice's
    share of the device (a range of `_SPAN` byte positions of one file, locked with fcntl) while it
    runs, and waits while every range of its size is held. Replicas of one slice size that add up
    to at most the device never wait; replicas placed beyond it (time-shared, autoscaler.replicas)
    wait for each other, reserved or not, as contexts time-sliced on one GPU do. Record locks
    belong to the process and go with it, so a replica that dies frees its share. E.g. a 1/8
    slice: ranges of 720720 / 8 = 90090 positions, 8 of them; a call takes the first free one
    (lowest first, so mixed powers of two pack: six 1/8 calls leave a 1/4 range free), and when
    all 8 are held waits on the one it last held (not the first to free: a wait can outlast a
    free range by the call holding its own). Sizes that do not line up (3/8 beside 5/8) can
    wait below the device's compute."""

    def __init__(self, path: str, fraction: Fraction):
        self.size = math.ceil(Fraction(fraction) * _SPAN)
        if not 0 < self.size <= _SPAN:
            raise ValueError(f"slice fraction ({fraction}) must be within (0, 1]")
        self.count = _SPAN // self.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._last = 0  # the range it last held: where it waits when all are held
        self.waits = 0  # calls that found every range held

    @classmethod
    def from_env(cls, binding: SliceBinding) -> "EmulatedCompute | None":
        """The shared compute of the emulated device `binding` is on, where whoever started the
        replica named its file (deploy.local); none on other devices or without it."""
        path = os.environ.get(EMULATED_COMPUTE_ENV)
        return cls(path, binding.slice.fraction) if binding.emulated and path else None

    @contextmanager
    def hold(self) -> Iterator[None]:
        taken = None
        for k in range(self.count):
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.size, k * self.size)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                continue
            taken = k
            break
        if taken is None:
            self.waits += 1
            taken = self._last
            fcntl.lockf(self._fd, fcntl.LOCK_EX, self.size, taken * self.size)
        self._last = taken
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, self.size, taken * self.size)

    def close(self) -> None:
        os.close(self._fd)


class SliceExecutor:
    """Runs callables one at a time on the slice's thread; counts their busy time.

    `busy_seconds()` includes the call running now, so a scrape in the middle of a
    long batch sees the slice busy instead of idle-then-a-burst. With `compute` (an
    emulated device's), a timed call holds the slice's share of it; a wait for it counts
    as busy, as a time-sliced GPU's does."""

    def __init__(self, binding: SliceBinding, compute: EmulatedCompute | None = None):
        self.binding = binding
        self.compute = compute
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"slice-{binding.device}")
        self._lock = threading.Lock()
        self._busy_done = 0.0
        self._started: float | None = None  # perf_counter() of the timed call running now
        self.running = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the slice's thread; its time counts as busy."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._call, fn, args, True)

    async def run_untimed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run on the slice's thread without counting busy time (model load: the
        duty cycle measures serving, and a load would read as a burst of it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._call, fn, args, False)

    def _call(self, fn: Callable[..., Any], args: tuple, timed: bool) -> Any:
        start = time.perf_counter()
        with self._lock:
            self.running = True
            self._started = start if timed else None
        try:
            if timed and self.compute is not None:
                with self.compute.hold():
                    return fn(*args)
            return fn(*args)
        finally:
            with self._lock:
                if timed:
                    self._busy_done += time.perf_counter() - start
                self.running = False
                self._started = None

    def busy_seconds(self) -> float:
        with self._lock:
            running = time.perf_counter() - self._started if self._started is not None else 0.0
            return self._busy_done + running

    def stalled_s(self) -> float:
        """How long the timed call running now has run; 0 when idle or loading."""
        with self._lock:
            return time.perf_counter() - self._started if self._started is not None else 0.0

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
