"""An emulated device's compute shared by the replicas on it (serving.executor.EmulatedCompute):
replicas whose slices fit the device never wait for each other; replicas beyond it do, as
time-sliced GPU contexts. Each holder here is a process of its own (record locks are per process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from deploy.local.backend import replica_env
from autoscaler.placement import Device, Placement
from functions.spec import SliceRequest
from serving.executor import EMULATED_COMPUTE_ENV, EmulatedCompute, SliceExecutor, bind_slice

# holds `fraction` of the device in a process of its own for `hold_s`: says "ready" before it
# asks, then how long it waited and whether it found every range held
_HOLDER = """
import sys, time
from fractions import Fraction
from serving.executor import EmulatedCompute
compute = EmulatedCompute(sys.argv[1], Fraction(sys.argv[2]))
print("ready", flush=True)
start = time.monotonic()
with compute.hold():
    print(f"{time.monotonic() - start:.3f} {compute.waits}", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(path: Path, fraction: str, hold_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), fraction, str(hold_s)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("fraction, waits", [("1/2", False), ("1", True)])
def test_a_call_waits_only_when_the_device_is_all_held(tmp_path, fraction, waits):
    # this process holds the first half (or all) of the device for 0.6 s; another process asks
    # for the same share: with 1/2 it takes the other half at once, with 1 it waits for the release
    path = tmp_path / "emulated-0.compute"
    mine = EmulatedCompute(str(path), Fraction(fraction))
    with mine.hold():
        other = _holder(path, fraction, 0.0)
        assert other.stdout.readline().strip() == "ready"
        time.sleep(0.6)
    waited, found_all_held = other.stdout.readline().split()
    other.wait(30)
    assert (int(found_all_held) == 1) is waits and (float(waited) >= 0.3) is waits, (waited, found_all_held)
    mine.close()


def test_smaller_slices_pack_so_a_larger_one_finds_room(tmp_path):
    # first fit from the lowest range: six 1/8 holders take ranges 0-5, so the 1/4 range of 6-7 is free
    path = tmp_path / "emulated-0.compute"
    holders = [_holder(path, "1/8", 30.0) for _ in range(6)]
    try:
        for h in holders:
            assert h.stdout.readline().strip() == "ready"
            assert h.stdout.readline().split()[1] == "0"  # got a range without waiting
        quarter = EmulatedCompute(str(path), Fraction(1, 4))
        with quarter.hold():
            assert quarter.waits == 0
        quarter.close()
    finally:
        for h in holders:
            h.kill()
            h.wait(10)


def test_a_dead_holder_frees_its_share(tmp_path):
    path = tmp_path / "emulated-0.compute"
    holder = _holder(path, "1", 60.0)
    assert holder.stdout.readline().strip() == "ready"
    assert holder.stdout.readline().split()[1] == "0"  # it holds the whole device
    holder.kill()
    holder.wait(10)
    mine = EmulatedCompute(str(path), Fraction(1))
    start = time.monotonic()
    with mine.hold():
        assert time.monotonic() - start < 1.0 and mine.waits == 0
    mine.close()


def test_the_executor_holds_the_share_for_timed_calls_only(tmp_path):
    path = tmp_path / "emulated-0.compute"
    binding = bind_slice(SliceRequest.parse("1"), "emulated:0", None, 2)
    executor = SliceExecutor(binding, EmulatedCompute(str(path), Fraction(1)))
    holder = _holder(path, "1", 0.5)
    assert holder.stdout.readline().strip() == "ready"
    assert holder.stdout.readline().split()[1] == "0"  # it holds the whole device for 0.5 s

    async def calls():
        start = time.monotonic()
        await executor.run_untimed(lambda: None)  # a model load: not held, no wait
        untimed = time.monotonic() - start
        await executor.run(lambda: None)  # a model call: waits for the other process's 0.5 s
        return untimed, time.monotonic() - start

    untimed, timed = asyncio.run(calls())
    holder.wait(10)
    executor.shutdown()
    assert untimed < 0.3 <= timed and executor.compute.waits == 1
    assert executor.busy_seconds() >= 0.2  # the wait counts as busy, as on a time-sliced GPU


def test_the_local_backend_names_one_compute_file_per_emulated_device(tmp_path, monkeypatch):
    placement = Placement("f-1", Device("emulated:2", "emulated", 81920), Fraction(1, 8), 1024, ())
    env = replica_env(placement, tmp_path)
    assert env[EMULATED_COMPUTE_ENV] == str(tmp_path / "emulated-2.compute")
    gpu = Placement("f-1", Device("gpu:0", "gpu", 81920), Fraction(1, 8), 1024, ())
    assert EMULATED_COMPUTE_ENV not in replica_env(gpu, tmp_path)
    monkeypatch.setenv(EMULATED_COMPUTE_ENV, str(tmp_path / "emulated-2.compute"))
    assert EmulatedCompute.from_env(bind_slice(SliceRequest.parse("1/8"), "emulated:2", None, 2)) is not None
    assert EmulatedCompute.from_env(bind_slice(SliceRequest.parse("1/8"), "cpu", None, 2)) is None
