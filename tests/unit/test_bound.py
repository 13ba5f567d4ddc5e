"""loadtests.bench.bound: what no policy without foresight can serve, on a trace of the bench."""

from __future__ import annotations

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
    assert r["forced_cold"] == 0 and r["best_without_forced"] == 1.0
    # most requests come in the spike, and its first seconds queue behind replicas 4 s away
    assert 0.3 < r["held_max_slo"] < 0.9 and r["held_max_timed_out"] == 0 and r["held_max_unplaceable"] == 0


def test_rare_functions_first_requests_are_forced_cold():
    trace = make_trace("azure", functions=60, seconds=600, seed=1)
    r = bound.bound(trace, [SLOW] * 60, SimConfig(gpus=8, warmup_s=60.0))
    assert r["forced_cold"] > 0 and r["forced_share"] == r["forced_cold"] / r["requests"]
