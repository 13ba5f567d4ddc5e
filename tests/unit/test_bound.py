"""loadtests.bench.bound: what no policy without foresight can serve, on a trace of the bench."""

from __future__ import annotations

import numpy as np

from autoscaler.simulator import Profile, SimConfig
from autoscaler.traces import make_trace
from loadtests.bench import bound

SLOW = Profile("slow", ((1, 20.0), (4, 40.0)), 0.25, 0.25, cold_start_s=4.0, slo_ms=200.0)


def test_a_spike_larger_than_anything_before_is_missed_even_holding_every_past_need():
    """A 10x spike for 20 s into two functions warm for their calm: held-max holds the spike's
    count only from the second after each new one, and those replicas come 4 s later; after it
    it holds them to the end. Nothing is forced cold (both start warm)."""
    trace = make_trace("spike", functions=2, seconds=120, seed=3, rate=40.0, spike_x=10.0, spike_s=20.0,
                       spike_at_s=60.0)
    r = bound.bound(trace, [SLOW, SLOW], SimConfig(gpus=8, warmup_s=10.0))
    h = r["held_max"]
    assert r["forced_cold"] == 0 and h["fits"] and h["timed_out"] == 0
    # most requests come in the spike, and its first seconds queue behind replicas 4 s away
    assert 0.3 < h["slo"] < 0.9
    # holding more than any past need does better, at more slice-seconds, until a factor does not
    # fit on the 8 GPUs (x4): the search stops there, none having met 99.9 %
    tried = r["tried"]
    assert [t["factor"] for t in tried] == [1.5, 2.0, 3.0, 4.0] and r["enough"] is None
    assert [t["fits"] for t in tried] == [True, True, True, False]
    slos, costs = [h["slo"]] + [t["slo"] for t in tried[:3]], [h["slice_s"]] + [t["slice_s"] for t in tried[:3]]
    assert slos == sorted(slos) and costs == sorted(costs) and slos[-1] < 0.999
    assert "held-max" in bound.describe("spike", 3, r)


def test_rare_functions_first_requests_are_forced_cold():
    """The functions the warm start leaves at zero (under one request a minute) whose first
    request comes after the 60 s warm-up: one forced cold request each."""
    trace = make_trace("azure", functions=60, seconds=600, seed=1)
    r = bound.bound(trace, [SLOW] * 60, SimConfig(gpus=8, warmup_s=60.0))
    counts = np.bincount(trace.fids, minlength=60)
    first = {int(f): float(trace.times[np.flatnonzero(trace.fids == f)[0]]) for f in np.flatnonzero(counts)}
    rare = [f for f, t in first.items() if counts[f] / 600 < 1 / 60 and t >= 60.0]
    assert r["forced_cold"] == len(rare) > 0


def test_a_cluster_held_max_does_not_fit_is_said_so():
    trace = make_trace("poisson", functions=4, seconds=60, seed=1, rate=400.0)
    r = bound.bound(trace, [SLOW] * 4, SimConfig(gpus=1, warmup_s=10.0))
    assert not r["held_max"]["fits"] and r["enough"] is None
    assert "does not fit" in bound.describe("tiny", 1, r)


def test_the_exact_batcher_counts_needs_as_it_serves():
    """With SimConfig.batcher "exact" the needs held-max and static hold are the oracle's counts
    for shoal up's batcher: 300 requests/s into a model of 20 ms at 1 row and 40 ms at 4 peak
    at 4 replicas a second by the rule and at 5 for one of the two functions by that batcher,
    so static holds (4 + 5) x 0.25 x 50 s = 112.5 slice-s where the rule's holds 100."""
    trace = make_trace("poisson", functions=2, seconds=60, seed=1, rate=300.0)
    costs = {}
    for batcher in ("rule", "exact"):
        r = bound.bound(trace, [SLOW, SLOW], SimConfig(gpus=8, warmup_s=10.0, batcher=batcher))
        assert r["held_max"]["fits"] and r["held_max"]["slo"] == 1.0
        costs[batcher] = (r["static_slice_s"], r["held_max"]["slice_s"])
    assert costs["rule"][0] == 100.0 and costs["exact"][0] == 112.5
    assert costs["exact"][1] > costs["rule"][1]
