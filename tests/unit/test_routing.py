"""How the simulator's exact batcher reaches a function's replicas (SimConfig.routing): one queue
per function (serve_batched) against shoal up's gateway, which routes each request at its arrival
to the ready replica with the fewest outstanding (serve_routed; serving/gateway.py _pick)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler import simulator as S
from autoscaler.policy import ScaleDecision
from autoscaler.simulator import Profile, SimConfig, Simulation, batch_seconds, serve_batched, serve_routed
from autoscaler.traces import Trace

# batches (1, 40 ms) and (8, 120 ms), as the emulated code profile: a batch of b rows 40 + (b - 1) x 80 / 7 ms
SECONDS = batch_seconds(((1, 40.0), (8, 120.0)), 8)


def test_each_request_goes_to_the_replica_with_the_fewest_outstanding():
    """Two replicas free at 0, arrivals at 0, 0, 10 and 20 ms: the two at 0 ms go one to each
    and run alone (done at 40 ms); at 10 ms both have one outstanding and the first frees no
    later, so it queues there; at 20 ms the second has fewer. Each runs alone from 40 ms, done at
    80 ms. One queue runs the first two as one batch of 2 (51.4 ms) and the others alone on the
    second replica as it frees (50 and 90 ms)."""
    times = [0.0, 0.0, 0.01, 0.02]
    ends, rows, share, free, left, at = serve_routed(times, [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], SECONDS)
    assert ends == pytest.approx([0.04, 0.04, 0.08, 0.08]) and rows == [1, 1, 1, 1]
    assert share == pytest.approx([0.04] * 4) and free == pytest.approx([0.08, 0.08]) and left == at == []
    sizes, batch_ends, _, _ = serve_batched(times, [0.0, 0.0], [1.0, 1.0], SECONDS)
    assert sizes == [2, 1, 1]
    assert np.repeat(batch_ends, sizes).tolist() == pytest.approx([0.04 + 0.08 / 7, 0.04 + 0.08 / 7, 0.05, 0.09])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40), st.floats(-1.0, 1.0), st.floats(0.5, 2.0))
def test_with_one_replica_routing_is_one_queue(raw, free, speed):
    """A function with one replica: where a request goes is no choice, so each request ends when
    serve_batched's batch of it ends, with the same rows."""
    times = sorted(raw)
    ends, rows, share, after, left, _ = serve_routed(times, [free], [-math.inf], [speed], SECONDS)
    sizes, batch_ends, busy, frees = serve_batched(times, [free], [speed], SECONDS)
    assert ends == pytest.approx(np.repeat(batch_ends, sizes).tolist())
    assert rows == np.repeat(sizes, sizes).tolist() and left == []
    assert after == pytest.approx(frees)
    assert sum(share) == pytest.approx(sum(busy))


def test_a_request_not_run_by_the_tick_s_end_waits_at_its_replica():
    """Both replicas busy, the first until 1.05 s, the second until 1.2 s: a request at 0.95 s
    goes to the first (one outstanding each, it frees first) and, its batch starting after the
    tick's end (1.0 s), waits there. Next tick, pinned to it, a request at 1.01 s goes to the
    second (one outstanding against two), and each runs alone: at 1.05 s and 1.2 s."""
    _, rows, _, free, left, at = serve_routed([0.95], [1.05, 1.2], [0.0, 0.0], [1.0, 1.0], SECONDS, until=1.0)
    assert rows == [0] and left == [0] and at == [0] and free == [1.05, 1.2]
    ends, rows, _, _, left, _ = serve_routed([0.95, 1.01], [1.05, 1.2], [0.0, 0.0], [1.0, 1.0], SECONDS,
                                             until=2.0, pinned=[0, -1])
    assert ends == pytest.approx([1.09, 1.24]) and rows == [1, 1] and left == []


def test_a_replica_not_ready_gets_nothing_while_another_is():
    """The second replica is ready at 0.5 s: requests at 0.1 and 0.2 s both go to the first; one
    at 0.6 s goes to the second, now ready and idle."""
    ends, rows, *_ = serve_routed([0.1, 0.2, 0.6], [0.0, 0.5], [0.0, 0.5], [1.0, 1.0], SECONDS)
    assert ends == pytest.approx([0.14, 0.24, 0.64]) and rows == [1, 1, 1]


def test_an_unknown_routing_is_refused():
    with pytest.raises(ValueError, match="routing"):
        SimConfig(routing="random")


def _two_replicas(routing: str) -> list[float]:
    """One function kept at two replicas, ready from the start, the four arrivals of the first
    test at 0.1 s, exact batcher, no path: the latencies its requests got."""
    profile = Profile("two", ((1, 40.0), (8, 120.0)), 0.25, 0.25, cold_start_s=2.0, slo_ms=200.0,
                      memory_mib=1024)
    times = np.array([0.1, 0.1, 0.11, 0.12])
    trace = Trace(kind="csv", duration_s=2.0, functions=("f0",), times=times, fids=np.zeros(4, np.int32), params={})
    policy = S._Reactive("two", lambda snapshot, spec, state, now: (ScaleDecision(2, "KEEP"), state), lambda: None)
    latencies: list[float] = []

    class Watch(Simulation):
        def _account(self, f, latency, s, n_f):
            latencies.extend(latency.tolist())
            return super()._account(f, latency, s, n_f)

    Watch(trace, [profile], policy, SimConfig(gpus=1, batcher="exact", routing=routing), initial={0: 2}).run()
    return sorted(latencies)


def test_the_simulation_routes_as_configured():
    """The same four requests through a Simulation: routed, each in a batch of one (40, 40, 70,
    60 ms from their arrivals); one queue, the first two as a batch of 2."""
    assert _two_replicas("fewest") == pytest.approx(sorted([0.04, 0.04, 0.07, 0.06]))
    assert _two_replicas("queue") == pytest.approx(sorted([0.04 + 0.08 / 7] * 2 + [0.04, 0.07]))
