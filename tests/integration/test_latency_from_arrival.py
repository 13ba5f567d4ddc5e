"""The controller counts latency from the request's arrival at the gateway, as the load-test
report and the simulator do: a request held through a cold start longer than the SLO is a miss
to shoal up's loop (`deploy.local.server.control_loop`), although the replica served it in
milliseconds. A real `Gateway` and a replica on loopback; the replica's start is the only time
that passes, on a fake clock the gateway and the loop share."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.metrics import ReplicaStat
from autoscaler.placement import Device, Inventory
from deploy.local.server import control_loop
from functions.spec import spec_from_dict
from serving.gateway import Gateway
from tests.integration.test_gateway import Scope, fake_replica

pytestmark = pytest.mark.integration

SLO_MS = 200.0
START_S = 2.0  # the replica's start: 10x the SLO
SPEC = spec_from_dict({"name": "f", "artifact": f"sha256:{'a' * 64}/f.onnx", "slice": "1/4",
                       "scaling": {"slo_p95_ms": SLO_MS, "target_concurrency": 2}})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _Functions:
    broken = frozenset()

    def functions(self):
        return {"f": (SPEC, 1)}


class _SlowStart:
    """A backend whose replica (the loopback server) takes START_S of the fake clock to be ready."""

    def __init__(self, clock: Clock, port: int) -> None:
        self.clock, self.port = clock, port

    async def create(self, replica_id, spec, placement):
        return SimpleNamespace(host="127.0.0.1", port=self.port)

    async def wait_ready(self, handle, timeout_s):
        self.clock.t += START_S
        return 0.5, START_S

    async def stop(self, handle, grace_s):
        pass

    def exited(self, handle):
        return None


class _FastReplica:
    """The replica's own page: the request took 5 ms inside it (no miss, seen from there)."""

    probes = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def scrape(self, replica, host, port, at):
        return ReplicaStat(replica, self.clock(), completed=1.0,
                           latency_buckets=((0.005, 1.0), (0.25, 1.0), (float("inf"), 1.0)))


def _plane(clock: Clock, poked: asyncio.Event, port: int):
    """A real Gateway and shoal up's loop on the fake clock, the replica at `port` slow to start."""
    gateway = Gateway(CollectorRegistry(), poke=lambda f: poked.set(), known=lambda n: n == "f", clock=clock)
    cpus = Inventory((Device("cpu:0", "cpu", 16384, cpus=(0, 1)),))
    loop = control_loop(_Functions(), _SlowStart(clock, port), gateway, cpus, _FastReplica(clock),
                        lambda *a, **k: None, CollectorRegistry())
    loop.scaler.clock = clock
    return gateway, loop


def test_a_request_held_through_a_cold_start_is_a_miss_to_the_controller():
    async def scenario():
        clock, poked = Clock(), asyncio.Event()
        server, port, served = await fake_replica()
        gateway, loop = _plane(clock, poked, port)
        try:
            call = asyncio.ensure_future(Scope(gateway).call())
            await poked.wait()  # held: the function is at zero
            cold = (await loop.tick(clock())).decisions["f"]
            await asyncio.gather(*loop.scaler._tasks)  # the replica starts (2 s) and the held request goes
            status, headers, _ = await call
            await loop.tick(clock())
        finally:
            server.close()
        return cold, status, headers, served, loop.snapshots["f"]

    cold, status, headers, served, snapshot = asyncio.run(scenario())
    assert (cold.reason, cold.desired) == ("COLD_START", 1)
    assert status == 200 and served == [1] and b"queue_wait=2.0000" in headers[b"shoal-cold-start"]
    # one request, 2 s from arrival to answer: all of it over the 0.2 s SLO; its p95 interpolated in
    # the (1, 2.5] s bucket: 1 + 1.5 x 0.95 = 2.425 s
    assert snapshot.ready == 1
    assert snapshot.over_slo == 1.0
    # the replica has been scraped once: no rate of its own yet; the gateway answered the one
    # request in the 2 s since the last tick, which the error budget counts (0.5/s x 2 s = 1)
    assert snapshot.rps == 0.0 and snapshot.answered_rps == pytest.approx(0.5)
    assert snapshot.p95_s == pytest.approx(2.425) and snapshot.p95_s > SLO_MS / 1000.0


def test_the_next_reading_counts_only_the_requests_answered_since():
    """Each reading is the window since the last one: the held request is not read twice."""
    async def scenario():
        clock, poked = Clock(), asyncio.Event()
        server, port, _ = await fake_replica()
        gateway, loop = _plane(clock, poked, port)
        try:
            call = asyncio.ensure_future(Scope(gateway).call())
            await poked.wait()
            await loop.tick(clock())
            await asyncio.gather(*loop.scaler._tasks)
            await call
            await loop.tick(clock())
            held = loop.snapshots["f"]
            await asyncio.gather(*(Scope(gateway).call() for _ in range(3)))  # warm: no time passes
            await loop.tick(clock())
        finally:
            server.close()
        return held, loop.snapshots["f"]

    held, warm = asyncio.run(scenario())
    assert held.over_slo == 1.0
    # 3 requests at 0 s on the fake clock, all in the first bucket (0.5 ms): none over, p95 within it
    assert warm.over_slo == 0.0 and warm.p95_s is not None and warm.p95_s <= 0.0005


def test_a_metadata_get_is_not_an_inference_latency():
    """The histogram the controller and the SLO alerts read holds inference requests only."""
    async def scenario():
        server, port, _ = await fake_replica()
        gateway = Gateway(CollectorRegistry(), poke=lambda f: None, known=lambda n: n == "f")
        gateway.add_endpoint("f", "r1", "127.0.0.1", port)
        try:
            await Scope(gateway).call()
            await Scope(gateway, "/v2/models/f", method="GET").call()  # model metadata
        finally:
            server.close()
        return gateway

    gateway = asyncio.run(scenario())
    assert gateway.metrics.requests.labels("f", "200")._value.get() == 2  # both answered and counted
    assert gateway.latencies()["f"][-1] == (float("inf"), 1.0)  # one latency: the inference


def test_a_refused_request_is_a_miss_and_a_client_error_no_latency():
    """A 503 answered at once (no slice, overloaded) never met its SLO: it is counted past every
    finite bound (REFUSED_S, 60 s), so the share over a 200 ms SLO reads it; a 400 (the client's
    error) is no latency of the platform's."""
    from autoscaler.metrics import fraction_over
    from serving.gateway import REFUSED_S, GatewayMetrics

    metrics = GatewayMetrics(CollectorRegistry())
    metrics.count("f", 200, 0.010)
    metrics.count("f", 200, 0.020)
    metrics.count("f", 503, 0.001)
    metrics.count("f", 400, 0.001)
    served = metrics.latencies()["f"]
    assert served[-1] == (float("inf"), 3.0)  # the 400 left out
    assert dict(served)[30.0] == 2.0 and REFUSED_S == 60.0  # the 503 only in +Inf
    assert fraction_over(served, SLO_MS / 1000.0) == pytest.approx(1 / 3)
