"""Liveness and lightweight updates, on a fake clock: a replica stuck in its model past
the function's timeout, or silent past `unresponsive_s`, is failed and replaced; a
scaling-only change keeps the running replicas; a function's own timeout is validated."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.replicas import ControllerConfig, Replica, ReplicaScaler
from autoscaler.sources.direct import ReplicaScrapes
from autoscaler.metrics import ReplicaStat, parse_replica_metrics
from autoscaler.placement import Inventory
from functions.spec import (
    FunctionSpec,
    ScalingSpec,
    SliceRequest,
    SpecError,
    same_runtime,
    spec_from_dict,
    spec_to_dict,
)
from serving.dataplane import DataPlane
from serving.executor import SliceExecutor, bind_slice

SPEC = FunctionSpec("f", "sha256:" + "0" * 64 + "/m.onnx", timeout_s=2.0)


class _Source:
    """Answers one stat (or None: the replica did not answer) per scrape."""

    def __init__(self, probes: bool, stat: ReplicaStat | None):
        self.probes = probes
        self.stat = stat

    async def scrape(self, replica, host, port, at):
        return self.stat


class _Router:
    def __init__(self):
        self.removed: list[str] = []

    def outstanding(self, function):
        return 0

    def inflight_seconds(self, function):
        return 0.0, 0.0  # no integral: the reading takes the count now (outstanding)

    def held(self, function):
        return 0

    def remove_endpoint(self, function, replica):
        self.removed.append(replica)

    def latencies(self):
        return {}  # nothing answered at the gateway: liveness is judged by the replica's own page


class _Backend:
    def __init__(self):
        self.stopped: list[object] = []

    def exited(self, handle):
        return None

    async def stop(self, handle, grace_s):
        self.stopped.append(handle)


def _snapshot_with(stat: ReplicaStat | None, probes: bool, seen_at: float, now: float, spec: FunctionSpec = SPEC):
    events: list[tuple] = []
    router, backend = _Router(), _Backend()
    controller = ReplicaScaler(backend=backend, router=router, inventory=Inventory(()),
                               events=lambda *a, **k: events.append(a), registry=CollectorRegistry(),
                               config=ControllerConfig(unresponsive_s=10.0))
    source = ReplicaScrapes(controller, _Source(probes, stat), router)
    controller.replicas["f-1"] = Replica("f-1", "f", 1, placement=None, state="ready", spec=spec, seen_at=seen_at,
                                         handle=SimpleNamespace(host="127.0.0.1", port=1))

    async def run():
        snap = await source.snapshot("f", now, spec)
        await asyncio.gather(*controller._tasks)
        return snap

    snap = asyncio.run(run())
    return snap, events, router.removed, controller


@pytest.mark.parametrize("stat, probes, seen_at, now, failed, fragment", [
    # inside one call for 1.5 s, under the function's 2 s timeout: live
    pytest.param(ReplicaStat("f-1", 100.0, stalled_s=1.5), True, 99.0, 100.0, False, None, id="busy under timeout"),
    # 2.5 s > 2 s: not live, replaced
    pytest.param(ReplicaStat("f-1", 100.0, stalled_s=2.5), True, 99.0, 100.0, True,
                 "inside one call for 2.5 s (timeout 2 s)", id="stuck past timeout"),
    # last answered at 91, now 100: 9 s <= 10 s of silence is tolerated
    pytest.param(None, True, 91.0, 100.0, False, None, id="silent 9 s"),
    # last answered at 89: 11 s > 10 s
    pytest.param(None, True, 89.0, 100.0, True, "answered no scrape for 11.0 s", id="silent 11 s"),
    # through Prometheus, no sample says nothing about the replica
    pytest.param(None, False, 0.0, 100.0, False, None, id="prometheus has no sample"),
])
def test_a_replica_is_failed_when_stuck_or_silent(stat, probes, seen_at, now, failed, fragment):
    snap, events, removed, controller = _snapshot_with(stat, probes, seen_at, now)
    if failed:
        # not counted as ready in the snapshot that failed it: the policy replaces it this tick
        assert removed == ["f-1"] and "f-1" not in controller.replicas and snap.ready == 0
        (kind, message), = [e for e in events if e[0] == "replica_failed"]
        assert "f-1 is not live: " in message and fragment in message
    else:
        assert removed == [] and controller.replicas["f-1"].state == "ready" and not events
    if stat is not None and not failed:
        assert controller.replicas["f-1"].seen_at == now  # an answer resets the silence


def test_a_busy_replica_gets_its_functions_timeout_before_silence_fails_it():
    # timeout 30 s > unresponsive_s 10 s: 11 s of silence is tolerated, 31 s is not
    slow = replace(SPEC, timeout_s=30.0)
    assert _snapshot_with(None, True, 89.0, 100.0, slow)[2] == []
    _, events, removed, _ = _snapshot_with(None, True, 69.0, 100.0, slow)
    assert removed == ["f-1"] and "answered no scrape for 31.0 s" in events[0][1]


def test_stalled_seconds_come_from_the_replica_metrics():
    text = ('# TYPE shoal_replica_stalled_seconds gauge\n'
            'shoal_replica_stalled_seconds{function="f"} 3.25\n')
    assert parse_replica_metrics(text, "f-1", 5.0).stalled_s == 3.25
    assert parse_replica_metrics("", "f-1", 5.0).stalled_s == 0.0


def test_the_executor_reports_how_long_the_running_call_has_run_and_the_dataplane_judges_it():
    executor = SliceExecutor(bind_slice(SliceRequest.parse("1/4"), "cpu", None, 2))
    release = threading.Event()

    async def run():
        call = asyncio.ensure_future(executor.run(release.wait, 10))
        await asyncio.sleep(0.5)
        stalled = executor.stalled_s()
        plane = SimpleNamespace(executor=executor, request_timeout_s=0.2, lost=None)
        hung = DataPlane.hung(plane)
        plane.request_timeout_s = 5.0
        fine = DataPlane.hung(plane)
        release.set()
        await call
        return stalled, hung, fine

    stalled, hung, fine = asyncio.run(run())
    executor.shutdown()
    assert 0.2 < stalled < 5 and fine is None
    assert hung.startswith("the model has been inside one call for 0.") and "request timeout (0.2 s)" in hung
    assert executor.stalled_s() == 0.0  # idle


# ---------------------------------------------------------------------- spec


@pytest.mark.parametrize("value, fragment", [
    (0, "timeout_s (0.0) must be within (0, 600]"),
    (601, "timeout_s (601.0) must be within (0, 600]"),
    ("5", "timeout_s must be a number, got '5'"),
    (True, "timeout_s must be a number, got True"),
])
def test_a_function_timeout_is_validated(value, fragment):
    with pytest.raises(SpecError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        spec_from_dict({"name": "f", "artifact": SPEC.artifact, "timeout_s": value})


def test_a_function_timeout_round_trips_and_defaults_to_the_platform_limit():
    assert spec_from_dict(spec_to_dict(SPEC)) == SPEC
    assert spec_from_dict({"name": "f", "artifact": SPEC.artifact}).timeout_s == 60.0


@pytest.mark.parametrize("change, same", [
    pytest.param({"scaling": ScalingSpec(min_replicas=3, max_replicas=5)}, True, id="scaling only"),
    pytest.param({"timeout_s": 5.0}, False, id="timeout"),
    pytest.param({"artifact": "sha256:" + "1" * 64 + "/m.onnx"}, False, id="artifact"),
    pytest.param({"slice": SliceRequest.parse("1/2")}, False, id="slice"),
    pytest.param({"version": "2"}, False, id="version"),
])
def test_only_scaling_changes_keep_running_replicas(change, same):
    assert same_runtime(SPEC, replace(SPEC, **change)) is same


def test_a_scaling_only_revision_keeps_the_replica_and_adopts_the_new_revision():
    controller = ReplicaScaler(backend=_Backend(), router=_Router(), inventory=Inventory(()),
                               events=lambda *a, **k: None, registry=CollectorRegistry())
    replica = Replica("f-1", "f", 1, placement=None, state="ready", spec=SPEC)
    controller.replicas["f-1"] = replica
    scaled = replace(SPEC, scaling=ScalingSpec(min_replicas=2, max_replicas=2))
    assert controller._keeps(replica, {"f": (scaled, 2)}) and (replica.revision, replica.spec) == (2, scaled)
    assert not controller._keeps(replica, {"f": (replace(scaled, timeout_s=9.0), 3)}) and replica.revision == 2

