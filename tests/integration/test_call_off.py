"""A replica taken back while it loads its model, with real processes: `shoal up`'s local backend
(deploy.local, its zygote and a replica process of an emulated profile whose model load takes
LOAD_S) and the scaler that takes it back (`ReplicaScaler._take` of a replica still starting: its
start called off). The process is stopped at once, not after its load, its wait for ready ends,
its bring-up finishes the stop, and its slice is free for the taker before the load would have
ended; and the scaler's own tick lending a quiet function's replica still loading (a pre-warm) to
a function whose request is held. The device is emulated; no GPU figure."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.loop import Target
from autoscaler.placement import Device, Inventory, Unplaceable
from autoscaler.policy import ScaleDecision
from autoscaler.replicas import ControllerConfig, ReplicaScaler
from deploy.local.backend import LocalBackend
from functions.spec import FunctionSpec, ScalingSpec, SliceRequest
from tests.unit.test_lending import _Router

pytestmark = pytest.mark.integration

LOAD_S = 20.0  # the emulated model load the call-off cuts short
PROFILE = f"""kind: profile
inputs:
  - {{name: x, datatype: FP32, shape: [-1, 4]}}
outputs:
  - {{name: y, datatype: FP32, shape: [-1, 4]}}
latency_ms: {{1: 5.0}}
load_s: {LOAD_S}
"""


def _spec(name: str) -> FunctionSpec:
    return FunctionSpec(name, "sha256:" + "0" * 64 + "/p.yaml", slice=SliceRequest(Fraction(1), None),
                        scaling=ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0))


async def _loading(scaler: ReplicaScaler, backend: LocalBackend):
    """f's one replica started, its process spawned and well into its load: (the start, the replica)."""
    first = asyncio.ensure_future(scaler.start_replica("f", _spec("f"), 1))
    t0 = time.monotonic()
    while not scaler.replicas or next(iter(scaler.replicas.values())).handle is None:
        assert time.monotonic() - t0 < 30, "the replica process was not spawned"
        await asyncio.sleep(0.01)
    (victim,) = scaler.replicas.values()
    await asyncio.sleep(0.5)  # well into its load
    assert victim.state == "starting" and backend.exited(victim.handle) is None
    return first, victim


def test_a_replica_taken_back_while_it_loads_stops_at_once_and_frees_its_slice(tmp_path: Path):
    profile = tmp_path / "slow.yaml"
    profile.write_text(PROFILE)
    events: list[tuple] = []
    router = _Router({})

    async def run():
        backend = LocalBackend(tmp_path / "state", lambda ref: profile)
        await backend.start()
        try:
            scaler = ReplicaScaler(backend, router, Inventory((Device("emulated:0", "emulated", 81920),)),
                                   lambda *a, **k: events.append((a, k)), CollectorRegistry(), ControllerConfig())
            first, victim = await _loading(scaler, backend)
            w = scaler.demand_for(_spec("w"), "w-1")
            assert isinstance(scaler.cluster.place(w), Unplaceable)  # the one device is f's
            t0 = time.monotonic()
            await asyncio.wait_for(scaler._take(victim, w, "headroom, still starting", "a test takes it", {}), LOAD_S / 2)
            called_off_s = time.monotonic() - t0
            assert not isinstance(scaler.cluster.place(w), Unplaceable)  # free for the taker
            started = await asyncio.wait_for(first, 5)
            return scaler, backend, victim, started, called_off_s
        finally:
            await backend.close()

    scaler, backend, victim, started, called_off_s = asyncio.run(run())
    assert started is None and victim.state == "stopped" and victim.stopped.is_set()
    assert backend.exited(victim.handle) is not None
    assert called_off_s < 5.0, called_off_s  # SIGTERM to a process loading for 20 s: stopped now
    assert victim.id not in scaler.replicas
    reasons = [k["data"]["reason"] for a, k in events if a[0] == "replica_stopped"]
    assert reasons == ["its start called off: slice taken back by w"]
    assert not [a for a, _ in events if a[0] in ("replica_failed", "replica_ready")]
    assert router.added == [] and router.failed == []  # never routed to; no request failed for it


FAST = PROFILE.replace(f"load_s: {LOAD_S}", "load_s: 0.0")


def test_a_quiet_functions_replica_still_loading_is_lent_to_a_waiting_function(tmp_path: Path):
    # f's replica loads ahead of any request (a pre-warm) on the one device when w's first request
    # is held: the scaler's tick finds f quiet, takes its starting replica (idle, cost 0: f never
    # had a request), stops its process at once and starts w's on its slice, ready long before
    # f's load would have ended
    slow, fast = tmp_path / "slow.yaml", tmp_path / "fast.yaml"
    slow.write_text(PROFILE)
    fast.write_text(FAST)
    events: list[tuple] = []
    router = _Router({"w": 1})
    w_spec = FunctionSpec("w", "sha256:" + "1" * 64 + "/q.yaml", slice=SliceRequest(Fraction(1), None),
                          scaling=ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0))

    async def run():
        backend = LocalBackend(tmp_path / "state", lambda ref: fast if ref.endswith("q.yaml") else slow)
        await backend.start()
        try:
            scaler = ReplicaScaler(backend, router, Inventory((Device("emulated:0", "emulated", 81920),)),
                                   lambda *a, **k: events.append((a, k)), CollectorRegistry(),
                                   ControllerConfig(time_share_busy=0.0))
            first, victim = await _loading(scaler, backend)
            t0 = time.monotonic()
            await scaler.apply({"w": Target(w_spec, 1, 1, ScaleDecision(1, "COLD_START"))})
            await asyncio.wait_for(asyncio.gather(first, *scaler._tasks), LOAD_S / 2)
            w_ready_s = time.monotonic() - t0
            return scaler, backend, victim, first.result(), w_ready_s
        finally:
            await backend.close()

    scaler, backend, victim, started, w_ready_s = asyncio.run(run())
    assert started is None and victim.state == "stopped" and backend.exited(victim.handle) is not None
    (took,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert took[1]["data"]["from"] == "f" and took[1]["data"]["cost"] == 0.0 and took[1]["function"] == "w"
    assert "no request yet, still starting" in took[0][1]
    (w,) = scaler.live("w")
    assert w.state == "ready" and router.added == [w.id]
    assert w_ready_s < 5.0, w_ready_s  # f's 20 s load cut short: w did not wait for it
    assert not scaler.live("f") and not [a for a, _ in events if a[0] in ("replica_failed", "held_short")]
