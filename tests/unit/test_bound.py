"""loadtests.bench.bound: what no policy without foresight can serve, on a trace of the bench."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.simulator import Profile, SimConfig, assign_profiles, oracle_counts, simulate, warm_start
from autoscaler.traces import Trace, make_trace
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


def _streams(kind: str, counts: list[int], seconds: float, timer: int | None = None) -> Trace:
    """Functions with exactly `counts[i]` requests at uniform random times over `seconds` (a
    Poisson stream given its count); function `timer`, if given, fires every 50 s instead."""
    rng = np.random.default_rng(5)
    times, fids = [], []
    for fid, n in enumerate(counts):
        t = np.arange(25.0, seconds, 50.0) if fid == timer else np.sort(rng.uniform(0.0, seconds, n))
        times.append(t)
        fids.append(np.full(len(t), fid, np.int32))
    t, f = np.concatenate(times), np.concatenate(fids)
    order = np.argsort(t, kind="stable")
    return Trace(kind, seconds, tuple(f"f{i}" for i in range(len(counts))), t[order], f[order], {})


def test_the_memoryless_floor_holds_the_cheapest_functions_per_miss_first():
    """The docstring's example: two functions at 1/4, 10 and 100 requests over 1,000 s. With a
    budget of 10 misses the busier one is held throughout (0.25 / 0.1 = 2.5 slice-s a miss
    avoided; 0.25 x 1,000 = 250 slice-s) and the other's 10 requests miss; with 5, half the
    other's time too (0.25 / 0.01 = 25 a miss: 5 x 25 = 125 more)."""
    trace = _streams("poisson", [10, 100], 1000.0)
    config = SimConfig(gpus=1, warmup_s=0.0)
    ten = bound.memoryless_floor(trace, [SLOW, SLOW], config, {}, target=1 - 10 / 110)
    assert ten["memoryless_functions"] == 2 and ten["memoryless_requests"] == 110
    assert ten["floor_slice_s"] == pytest.approx(250.0) and ten["price_slice_s"] == pytest.approx(2.5)
    assert ten["reachable"] and ten["misses_at_floor"] == pytest.approx(10.0)
    five = bound.memoryless_floor(trace, [SLOW, SLOW], config, {}, target=1 - 5 / 110)
    assert five["floor_slice_s"] == pytest.approx(375.0) and five["price_slice_s"] == pytest.approx(25.0)
    # every request within the SLO: both held throughout, 500 slice-s
    assert bound.memoryless_floor(trace, [SLOW, SLOW], config, {}, target=1.0)["floor_slice_s"] == pytest.approx(500.0)


def test_timers_are_free_and_only_their_first_request_is_forced_cold():
    """A timer (every 50 s) may be foreseen: not in the floor. Its first request, with no
    replica at the start, misses under any policy: one forced miss. With a budget of 1 that
    miss takes it all, and the Poisson function is held throughout; a function whose cold start
    is within its SLO is free too (its requests wait less than the SLO)."""
    fast = Profile("fast", ((1, 20.0),), 0.25, 0.25, cold_start_s=0.1, slo_ms=200.0)
    trace = _streams("azure", [100, 0, 30], 1000.0, timer=1)
    r = bound.memoryless_floor(trace, [SLOW, SLOW, fast], SimConfig(gpus=1, warmup_s=0.0), {},
                               target=1 - 1 / 150)
    assert r["memoryless_functions"] == 1 and r["memoryless_requests"] == 100 and r["forced_cold_others"] == 1
    assert r["floor_slice_s"] == pytest.approx(250.0) and r["price_slice_s"] == pytest.approx(2.5) and r["reachable"]
    # no budget left for the forced miss: out of reach, whatever is held
    out = bound.memoryless_floor(trace, [SLOW, SLOW, fast], SimConfig(gpus=1, warmup_s=0.0), {}, target=1.0)
    assert not out["reachable"] and out["misses_at_floor"] == pytest.approx(1.0)
    assert "out of reach" in bound.describe("t", 1, {**bound.bound(trace, [SLOW, SLOW, fast], SimConfig(
        gpus=1, warmup_s=0.0)), "memoryless_floor": out})


def test_the_cheapest_per_miss_is_by_slice_over_rate():
    """A function at 1/8 with 10 requests over 1,000 s (12.5 slice-s a miss) is held before one at
    1/2 with 20 (25 a miss), though the second is the busier: 20 misses allowed of 30, 125 slice-s."""
    small = Profile("small", ((1, 5.0),), 0.125, 0.125, cold_start_s=2.0, slo_ms=100.0)
    big = Profile("big", ((1, 5.0),), 0.5, 0.5, cold_start_s=2.0, slo_ms=100.0)
    r = bound.memoryless_floor(_streams("poisson", [10, 20], 1000.0), [small, big], SimConfig(gpus=1, warmup_s=0.0),
                               {}, target=1 - 20 / 30)
    assert r["floor_slice_s"] == pytest.approx(125.0) and r["price_slice_s"] == pytest.approx(12.5)


def test_a_resizing_policy_may_hold_a_replica_on_the_least_slice_that_meets_the_slo_alone():
    """whisper-tiny-like, 30 ms at 1/2, SLO 500 ms: 120 ms on 1/8, so held on 1/8 (4x less a miss
    avoided); 60 ms at 1/4 with SLO 100 ms: 1/8 would take 120 ms, so 0.15 (100 ms); a slice
    already at min_slice stays."""
    whisper = Profile("w", ((1, 30.0), (4, 45.0)), 0.5, 0.5, cold_start_s=8.0, slo_ms=500.0)
    tight = Profile("t", ((1, 60.0),), 0.25, 0.25, cold_start_s=4.0, slo_ms=100.0)
    assert bound.held_slice(whisper, 0.125) == 0.125 and bound.held_slice(whisper, None) == 0.5
    assert bound.held_slice(tight, 0.125) == pytest.approx(0.15)
    assert bound.held_slice(Profile("m", ((1, 1.0),), 0.125, 0.125), 0.125) == 0.125
    trace = _streams("poisson", [100], 1000.0)
    fixed = bound.memoryless_floor(trace, [whisper], SimConfig(gpus=1, warmup_s=0.0), {}, target=1.0)
    resized = bound.memoryless_floor(trace, [whisper], SimConfig(gpus=1, warmup_s=0.0), {}, target=1.0, min_slice=0.125)
    assert fixed["floor_slice_s"] == pytest.approx(500.0) and resized["floor_slice_s"] == pytest.approx(125.0)


def test_the_floor_is_only_for_memoryless_traces():
    trace = make_trace("gamma", functions=2, seconds=60, seed=1, rate=50.0, cv=4.0)
    assert bound.memoryless_floor(trace, [SLOW, SLOW], SimConfig(gpus=1), {}) is None


def test_no_policy_in_the_simulator_holds_less_than_the_floor_at_its_own_attainment():
    """The floor is one: on an Azure-like population every policy, Shoal's included, holds at
    least the floor for the SLO attainment it reached (Shoal the floor of a policy that may hold
    a replica on min_slice, the others each function's own slice's); a higher target, a higher
    floor."""
    trace = make_trace("azure", functions=100, seconds=900, seed=1)
    profiles = assign_profiles(trace, 1)
    config = SimConfig(gpus=10, warmup_s=60.0)
    initial = warm_start(trace, profiles, oracle_counts(trace, profiles, config.tick_s, config.batcher))
    r = simulate(trace, ["shoal", "shoal-fixed", "kpa-tuned"], config, seed=1, profiles=profiles)
    beside = bound.against(trace, profiles, config, r["policies"])
    assert [name for name, a in beside.items() if a["resized"]] == ["shoal"]
    for name, a in beside.items():
        assert 0 < a["floor_slice_s"] < a["slice_s"] and a["x_floor"] > 1, (name, a)
        rec = r["policies"][name]
        assert a["floor_slice_s"] == bound.memoryless_floor(
            trace, profiles, config, initial, target=rec["slo_attainment"], requests=rec["requests"],
            min_slice=bound.MIN_SLICE if a["resized"] else None)["floor_slice_s"]
        higher = bound.memoryless_floor(trace, profiles, config, initial, target=(1 + rec["slo_attainment"]) / 2)
        fixed = bound.memoryless_floor(trace, profiles, config, initial, target=rec["slo_attainment"])
        assert higher["floor_slice_s"] > fixed["floor_slice_s"] > 0.5 * a["slice_s"]


def test_the_cheapest_setting_is_the_one_that_fits_at_the_slo_with_least_held():
    runs = [{"window_s": 2, "factor": 1.0, "slo": 0.998, "slice_s": 90.0, "fits": True},
            {"window_s": 30, "factor": 1.0, "slo": 0.9995, "slice_s": 120.0, "fits": True},
            {"window_s": 5, "factor": 1.25, "slo": 1.0, "slice_s": 110.0, "fits": False},  # unplaceable: not chosen
            {"window_s": 10, "factor": 1.1, "slo": 1.0, "slice_s": 130.0, "fits": True}]
    assert bound.cheapest(runs, 0.999)["window_s"] == 30
    assert bound.cheapest(runs, 1.0)["window_s"] == 10
    assert bound.cheapest(runs, 0.99)["window_s"] == 2
    assert bound.cheapest(runs[:1], 0.999) is None


def test_window_max_over_its_grid_beside_the_oracle_and_shoal():
    """Two Gamma CV 4 functions on a cluster that holds every setting: a longer memory holds more
    and misses no more, as does a larger factor; the cheapest at 99.9 % and at Shoal's
    attainment are runs of the grid, each over the oracle's slice-seconds (simulate's
    `vs_oracle` divides by the same), and Shoal's record is put beside them as it was run; a
    record of another seed is refused."""
    trace = make_trace("gamma", functions=2, seconds=240, seed=3, rate=60.0, cv=4.0)
    config = SimConfig(gpus=8, warmup_s=30.0)
    shoal = simulate(trace, ["shoal"], config, profiles=[SLOW, SLOW])["policies"]["shoal"]
    r = bound.window_sweep(trace, [SLOW, SLOW], config, shoal, windows=(1, 5, 60), factors=(1.0, 1.5))
    runs = {(x["window_s"], x["factor"]): x for x in r["runs"]}
    assert list(runs) == [(1, 1.0), (1, 1.5), (5, 1.0), (5, 1.5), (60, 1.0), (60, 1.5)]
    assert all(x["fits"] for x in r["runs"])
    for f in (1.0, 1.5):  # held longer: more slice-seconds, no fewer requests within the SLO
        assert runs[1, f]["slice_s"] < runs[5, f]["slice_s"] < runs[60, f]["slice_s"]
        assert runs[1, f]["slo"] <= runs[5, f]["slo"] <= runs[60, f]["slo"]
    for w in (1, 5, 60):  # x1.5: more held, no fewer within the SLO
        assert runs[w, 1.0]["slice_s"] < runs[w, 1.5]["slice_s"] and runs[w, 1.0]["slo"] <= runs[w, 1.5]["slo"]
    assert runs[1, 1.0]["slo"] < 0.999  # each second's need a tick late misses the rises
    assert r["oracle_slice_s"] == pytest.approx(shoal["oracle_replica_slice_seconds"], abs=0.1)  # (to 0.1)
    assert r["shoal"]["x_oracle"] == pytest.approx(shoal["vs_oracle"], abs=0.001)
    for key, slo in (("at_target", 0.999), ("at_shoal", shoal["slo_attainment"])):
        best = r[key]
        assert best is not None and best["slo"] >= slo and best["x_oracle"] == pytest.approx(
            best["slice_s"] / r["oracle_slice_s"], abs=0.001)
        assert all(x["slice_s"] >= best["slice_s"] for x in r["runs"] if x["fits"] and x["slo"] >= slo)
    assert "window-max" in bound.describe_sweep("gamma", 3, r) and "Shoal's" in bound.describe_sweep("gamma", 3, r)
    other = simulate(make_trace("gamma", functions=2, seconds=240, seed=4, rate=60.0, cv=4.0), ["shoal"], config,
                     profiles=[SLOW, SLOW])["policies"]["shoal"]
    with pytest.raises(ValueError, match="another trace, seed or batcher"):
        bound.window_sweep(trace, [SLOW, SLOW], config, other, windows=(1,), factors=(1.0,))
