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
    ends, rows, share, free, left, at, _ = serve_routed(times, [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], SECONDS)
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
    ends, rows, share, after, left, _, _ = serve_routed(times, [free], [-math.inf], [speed], SECONDS)
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
    _, rows, _, free, left, at, _ = serve_routed([0.95], [1.05, 1.2], [0.0, 0.0], [1.0, 1.0], SECONDS, until=1.0)
    assert rows == [0] and left == [0] and at == [0] and free == [1.05, 1.2]
    ends, rows, _, _, left, _, _ = serve_routed([0.95, 1.01], [1.05, 1.2], [0.0, 0.0], [1.0, 1.0], SECONDS,
                                             until=2.0, pinned=[0, -1])
    assert ends == pytest.approx([1.09, 1.24]) and rows == [1, 1] and left == []


def test_a_replica_not_ready_gets_nothing_while_another_is():
    """Both free at 0, the second ready only at 0.5 s: a request at 0.1 s goes to the first, and
    one at 0.11 s too, though the second has none outstanding; it waits there (done at 0.18 s),
    where the second could have run it only at 0.5 s. The second stays free at 0."""
    ends, rows, _, free, *_ = serve_routed([0.1, 0.11], [0.0, 0.0], [0.0, 0.5], [1.0, 1.0], SECONDS)
    assert ends == pytest.approx([0.14, 0.18]) and rows == [1, 1] and free == pytest.approx([0.18, 0.0])


def test_a_replica_busy_from_before_counts_its_batch():
    """The first replica runs a batch of 8 begun before (free at 0.2 s), the second one of 1
    (free at 0.3 s): a request at 0.1 s goes to the second, which has fewer outstanding, and waits
    for it. Counted as one each, it would go to the first, which frees first."""
    ends, *_ = serve_routed([0.1], [0.2, 0.3], [0.0, 0.0], [1.0, 1.0], SECONDS, busy_rows=[8, 1])
    assert ends == pytest.approx([0.34])
    ends, *_ = serve_routed([0.1], [0.2, 0.3], [0.0, 0.0], [1.0, 1.0], SECONDS)
    assert ends == pytest.approx([0.24])


def test_a_replica_counts_once_ready_and_a_batch_once_it_ends():
    """The first replica ready from the start, the second from 0.05 s. At 0, 10, 20 and 30 ms
    every request goes to the first (none other ready): one alone, done at 40 ms, then the three
    as one batch, 40 + 2 x 80 / 7 ms, done at 102.9 ms. At 60 ms the second is ready with none
    outstanding against three: it runs that request alone (to 100 ms), and the one at 70 ms waits
    for it there (one outstanding against three; done at 140 ms). At 110 ms the first's batch has
    ended, so it has none outstanding against the second's one: the request runs there, done
    at 150 ms. Were the ended batch still counted, it would wait at the second."""
    times = [0.0, 0.01, 0.02, 0.03, 0.06, 0.07, 0.11]
    ends, rows, _, free, left, _, running = serve_routed(times, [0.0, 0.0], [0.0, 0.05], [1.0, 1.0], SECONDS)
    three = 0.04 + 0.04 + 2 * 0.08 / 7
    assert ends == pytest.approx([0.04, three, three, three, 0.10, 0.14, 0.15])
    assert rows == [1, 3, 3, 3, 1, 1, 1] and left == [] and free == pytest.approx([0.15, 0.14])
    assert running == [1, 1]


def test_requests_pinned_before_the_tick_wait_at_their_replicas_in_order():
    """Requests at 0.1, 0.2 and 0.3 s routed in an earlier tick, to the second replica, the first
    and the second, and no batch before 0.5 s: at 0.5 s the second runs its two as one batch
    (40 + 80 / 7 ms, done at 551.4 ms) and the first its one (done at 540 ms). A request at
    0.52 s, not routed yet, finds one outstanding at the first and two at the second: it waits
    at the first and runs alone from 540 ms."""
    two = 0.5 + 0.04 + 0.08 / 7
    ends, rows, _, free, left, _, running = serve_routed(
        [0.1, 0.2, 0.3, 0.52], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], SECONDS, pinned=[1, 0, 1, -1], not_before=0.5)
    assert ends == pytest.approx([two, 0.54, two, 0.58]) and rows == [2, 1, 2, 1]
    assert free == pytest.approx([0.58, two]) and left == [] and running == [1, 2]


def test_an_unknown_routing_is_refused():
    with pytest.raises(ValueError, match="routing"):
        SimConfig(routing="random")


def _two_replicas(times: np.ndarray, routing: str, duration_s: float = 3.0) -> tuple[dict, list[float]]:
    """One function kept at two replicas, ready from the start, on ((1, 40), (8, 120)) ms, exact
    batcher, no path: the run's record and the latencies its requests got, sorted."""
    profile = Profile("two", ((1, 40.0), (8, 120.0)), 0.25, 0.25, cold_start_s=2.0, slo_ms=200.0,
                      memory_mib=1024)
    trace = Trace(kind="csv", duration_s=duration_s, functions=("f0",), times=times,
                  fids=np.zeros(len(times), np.int32), params={})
    policy = S._Reactive("two", lambda snapshot, spec, state, now: (ScaleDecision(2, "KEEP"), state), lambda: None)
    latencies: list[float] = []

    class Watch(Simulation):
        def _account(self, f, latency, s, n_f):
            latencies.extend(latency.tolist())
            return super()._account(f, latency, s, n_f)

    record = Watch(trace, [profile], policy, SimConfig(gpus=1, batcher="exact", routing=routing),
                   initial={0: 2}).run()
    return record, sorted(latencies)


def test_the_simulation_routes_as_configured():
    """The four requests of the first test, at 0.1 s, through a Simulation: routed, each in a
    batch of one (40, 40, 70, 60 ms from their arrivals); one queue, the first two as a batch of
    2."""
    times = np.array([0.1, 0.1, 0.11, 0.12])
    assert _two_replicas(times, "fewest")[1] == pytest.approx(sorted([0.04, 0.04, 0.07, 0.06]))
    assert _two_replicas(times, "queue")[1] == pytest.approx(sorted([0.04 + 0.08 / 7] * 2 + [0.04, 0.07]))


def test_a_request_left_at_a_tick_s_end_is_run_by_its_replica_in_the_next():
    """Two replicas, each kept, requests every 10 ms from 0.9 s to 1.1 s: those of 0.97 and
    0.99 s go to the second replica, busy until 1.0014 s, so their batch starts after the tick's
    end (1 s) and they wait there into the next tick, pinned (_queued_at), while the next tick's
    requests are routed against the replicas' running batches (_batch_rows). Every request is
    answered once, and the latencies are those of serve_routed over the whole run at once: the
    tick's cut changes nothing."""
    times = np.round(np.arange(0.9, 1.1001, 0.01), 6)
    record, latencies = _two_replicas(times, "fewest")
    assert record["served"] == len(times)
    early = times[times < 1.0].tolist()
    *_, left, at, _ = serve_routed(early, [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], SECONDS, until=1.0)
    assert (left, at) == ([7, 9], [1, 1])  # the cut leaves two waiting at the second replica
    ends, *_ = serve_routed(times.tolist(), [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], SECONDS)
    assert latencies == pytest.approx(sorted((np.array(ends) - times).tolist()))
