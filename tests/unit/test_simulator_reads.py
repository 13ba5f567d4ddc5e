"""What the simulator's policy reads, as the live controller reads it (issue 19, sim against
live): requests wait at the gateway until a replica is ready (the snapshot's activator_queue,
not in flight), in flight counts only time inside replicas, each tick its overlap with it
(the gateway's integral, as the live look reads it), a replica's work before its
first scrape is in no window, and p95 and the share over the SLO
are interpolated in the gateway's latency histogram (autoscaler.metrics.quantiles), as
`autoscaler/sources/direct.py` reads them. Unless a case says otherwise: one function with a
batch-1 latency of 40 ms on its 1/4 slice (no batching), SLO 200 ms, a 2.5 s cold start, at
zero; a stub policy that wants one replica once a request came records every snapshot it is shown."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaler.metrics import LATENCY_BUCKETS_S, fraction_over, fractions_over, quantile, quantiles
from autoscaler.policy import ScaleDecision
from autoscaler.simulator import Profile, SimConfig, Simulation, _Reactive
from autoscaler.traces import Trace

P40 = Profile("p40", ((1, 40.0),), 0.25, 0.25, cold_start_s=2.5, slo_ms=200.0)


class OneReplica(_Reactive):
    """One replica from the first request on; every snapshot kept, by the time it was taken."""

    def __init__(self):
        self.seen: dict[float, object] = {}
        super().__init__("one", self._one, lambda: None)

    def _one(self, snapshot, spec, state, now):
        self.seen[now] = snapshot
        wanted = 1 if snapshot.activator_queue or snapshot.ready or snapshot.starting else 0
        return ScaleDecision(wanted, "STUB"), state


def run(times, profile=P40, duration=4.0):
    trace = Trace(kind="csv", duration_s=duration, functions=("f0",), times=np.asarray(times, float),
                  fids=np.zeros(len(times), np.int32), params={})
    policy = OneReplica()
    record = Simulation(trace, [profile], policy, SimConfig(gpus=1)).run()
    return policy.seen, record


def test_requests_wait_at_the_gateway_until_the_replica_is_ready():
    # 10 requests at 0.2 .. 0.65 s; the first starts a replica at 0.2, ready at 0.2 + 2.5 = 2.7
    seen, record = run([0.2 + 0.05 * k for k in range(10)])
    for now in (1.0, 2.0):  # held: at the gateway, not in a replica, nothing answered yet
        s = seen[now]
        assert (s.ready, s.starting, s.activator_queue, s.inflight, s.rps, s.p95_s) == (0, 1, 10, 0.0, 0.0, None)
    s = seen[3.0]  # released in the tick the replica is ready (2.7): served one by one from 2.7
    # before the replica's first scrape (this look): no rate or duty read yet, the gateway saw them
    assert (s.ready, s.activator_queue, s.rps, s.duty) == (1, 0, 0.0, (0.0,))
    assert s.p95_s is not None and s.over_slo == 1.0  # all waited 2 s and more
    # in flight, as the gateway's integral grows: the k-th (k = 0..9) is sent at 2.7 and answered at
    # 2.7 + 0.04 (k + 1); the tick to 3.0 holds 0.04 x (1 + ... + 7) = 1.12 request-seconds of the
    # first 7 and 0.3 of each of the last 3 (answered at 3.02, 3.06, 3.10): 2.02 in the 1-s tick.
    # From arrival it would add their held time inside the tick, 2.0-2.7 s: 10 x 0.7 = 7.0 more
    assert s.inflight == pytest.approx(2.02)
    # the rest in the next tick's: 0.02 + 0.06 + 0.10
    assert seen[4.0].inflight == pytest.approx(0.18)
    assert (record["served"], record["cold_starts"]) == (10, 1)


def test_in_flight_is_each_requests_overlap_with_the_tick_not_its_whole_time_where_it_came():
    # a slow model (2.0 s at batch 1, SLO 5 s): the request at 0 starts a replica, ready at 2.5, and
    # is in it 2.5-4.5; the one at 5.0 is in it 5.0-7.0. Each tick reads its overlap: 0.5, 1.0, 0.5,
    # then 1.0 and 1.0. Little's law on the tick each came in would read 2.0 at 3 and at 6, 0 between
    slow = Profile("p2000", ((1, 2000.0),), 0.25, 0.25, cold_start_s=2.5, slo_ms=5000.0)
    seen, _ = run([0.0, 5.0], profile=slow, duration=9.0)
    assert [seen[t].inflight for t in (3.0, 4.0, 5.0, 6.0, 7.0, 8.0)] == pytest.approx([0.5, 1.0, 0.5, 1.0, 1.0, 0.0])


def test_a_request_past_the_timeout_leaves_flight_at_its_504():
    # 4.0 s at batch 1, a hold timeout of 3 s: the request at 0 waits for the replica (ready at
    # 2.5), goes in at 2.5 and would be answered at 6.5; the gateway answers 504 at 0 + 3 = 3.0,
    # so it is in flight 2.5-3.0: 0.5 at the look at 3 s and nothing after, though its replica
    # runs it on to 6.5
    slow = Profile("p4000", ((1, 4000.0),), 0.25, 0.25, cold_start_s=2.5, slo_ms=5000.0)
    trace = Trace(kind="csv", duration_s=8.0, functions=("f0",), times=np.zeros(1),
                  fids=np.zeros(1, np.int32), params={})
    policy = OneReplica()
    record = Simulation(trace, [slow], policy, SimConfig(gpus=1, timeout_s=3.0)).run()
    seen = policy.seen
    assert [seen[t].inflight for t in (3.0, 4.0, 5.0, 6.0, 7.0)] == pytest.approx([0.5, 0.0, 0.0, 0.0, 0.0])
    assert record["timed_out"] == 1


def test_p95_and_the_share_over_the_slo_come_from_the_gateway_histogram():
    # a replica ready at 2.5 (the first request, at 0, starts it); then 10 requests a tick, 0.1 s
    # apart, each alone: 40 ms, in the bucket (0.025, 0.05]: rank 0.95 x 10 = 9.5 of 10 in it:
    # 0.025 + 0.025 x 9.5 / 10 = 0.04875 s (exactly 0.04 s), none over 200 ms
    seen, _ = run([0.0] + [3.0 + 0.1 * k for k in range(10)] + [4.0 + 0.1 * k for k in range(10)], duration=6.0)
    assert seen[4.0].p95_s == pytest.approx(0.04875)
    assert seen[4.0].over_slo == 0.0
    # the first request waited 2.5 s + 40 ms: alone in its tick, in the bucket (2.5, 5]:
    # p95 2.5 + 2.5 x 0.95 = 4.875 s; all of it over the SLO
    assert seen[3.0].p95_s == pytest.approx(4.875)
    assert seen[3.0].over_slo == 1.0


QUANTILE_CASES = [
    # id, bounds, cumulative counts, q, expected
    # rank 0.95 x 9 = 8.55 in (0.1, 0.25]: 0.1 + 0.15 x (8.55 - 8) / (9 - 8) = 0.1825
    ("inside-a-bucket", (0.1, 0.25, math.inf), (8, 9, 9), 0.95, 0.1825),
    # rank 0.5 x 4 = 2 in (0, 0.1]: 0 + 0.1 x 2 / 4 = 0.05
    ("first-bucket-from-zero", (0.1, 0.25, math.inf), (4, 4, 4), 0.5, 0.05),
    # rank 0.95 x 10 = 9.5 in the +Inf bucket: the highest finite bound, 0.25
    ("in-the-inf-bucket", (0.1, 0.25, math.inf), (5, 6, 10), 0.95, 0.25),
    ("no-observation", (0.1, 0.25, math.inf), (0, 0, 0), 0.95, None),
]


@pytest.mark.parametrize("bounds,counts,q,expected", [c[1:] for c in QUANTILE_CASES],
                         ids=[c[0] for c in QUANTILE_CASES])
def test_quantiles_row_by_row_as_quantile(bounds, counts, q, expected):
    got = quantiles(np.array(bounds), np.array([counts], float), q)[0]
    one = quantile(tuple(zip(bounds, counts)), q)
    if expected is None:
        assert math.isnan(got) and one is None
    else:
        assert got == pytest.approx(expected) and one == pytest.approx(expected)


def test_fractions_over_per_row_bound():
    bounds = np.array((0.1, 0.25, math.inf))
    counts = np.array([(90, 99, 100), (90, 99, 100), (0, 0, 0)], float)
    # bound 0.2: 90 + 9 x (0.1 / 0.15) = 96 at or under -> 0.04; bound 0.05: 90 x 0.5 = 45 -> 0.55
    got = fractions_over(bounds, counts, np.array([0.2, 0.05, 0.2]))
    assert got.tolist() == pytest.approx([0.04, 0.55, 0.0])
    assert fraction_over(((0.1, 90), (0.25, 99), (math.inf, 100)), 0.2) == pytest.approx(0.04)


def test_the_gateway_and_the_simulator_share_the_bounds():
    from serving.metrics import LATENCY_BUCKETS_S as SERVED

    assert SERVED is LATENCY_BUCKETS_S


def test_a_request_is_read_once_answered_and_its_busy_time_as_it_runs():
    # the replica is ready at 2.5 (the first request, at 0, starts it); one request at 3.98 runs
    # 3.98-4.02 s. Live, the look at 4 s sees it in flight, not answered: no rate, no latency, and
    # the replica's busy counter holds the 0.02 s it has run (serving/executor.py counts the call
    # running); the look at 5 s reads it answered, with the other 0.02 s
    seen, record = run([0.0, 3.98], duration=6.0)
    at4, at5 = seen[4.0], seen[5.0]
    assert (at4.rps, at4.p95_s, at4.over_slo) == (0.0, None, 0.0)
    assert at4.duty == pytest.approx((0.02,))
    assert at5.rps == 1.0
    assert at5.p95_s == pytest.approx(0.04875)  # 40 ms in (0.025, 0.05]: 0.025 + 0.025 x 0.95
    assert at5.duty == pytest.approx((0.02,))
    assert record["served"] == 2  # counted as served in the tick it came, whatever the looks read


def test_a_request_past_the_timeout_is_read_at_the_timeout():
    # 40 requests at 3.0 s on one replica ready at 2.5 (the first request, at 0, starts it), each
    # alone, 40 ms: the last is answered at 3.0 + 40 x 0.04 = 4.6 s. With a timeout of 1 s the
    # ones answered after 4.0 s (the 25th on) are answered 504 at 4.0 s, their latency 1 s, and
    # read by the look at 4 s with the 24 answered in time: 40 answered at that look
    trace = Trace(kind="csv", duration_s=6.0, functions=("f0",), times=np.asarray([0.0] + [3.0] * 40),
                  fids=np.zeros(41, np.int32), params={})
    policy = OneReplica()
    Simulation(trace, [P40], policy, SimConfig(gpus=1, timeout_s=1.0)).run()
    at4, at5 = policy.seen[4.0], policy.seen[5.0]
    assert at4.rps == 40.0  # without the timeout: 24, and 16 more at 5 s
    assert at4.p95_s is not None and at4.p95_s <= 1.0  # none read slower than the timeout
    assert at5.rps == 0.0  # nothing left to read, though the replica ran to 4.6 s
    assert at5.duty == pytest.approx((0.6,))  # 4.0-4.6 s busy
