"""SLO first through cold starts (autoscaler.policy, issue 18): the keep-alive weighs a cold
start's measured misses against idle slice-seconds (`_ski_rental`, `keep_alive_s`), the
reserve holds what the need lately rose by within one cold start when such a rise came
again (`_rise_sample`, `reserve`), and the requests held through a cold start are measured
(`_held_sample`). Pure: `now` is a number."""

from __future__ import annotations

import math

import pytest

from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import (
    DEFAULT_CONFIG,
    NeedAt,
    PolicyConfig,
    PolicyState,
    _held_sample,
    _missed_sample,
    _rise_sample,
    _ski_rental,
    decide,
    keep_alive_s,
    quiet_until,
    holds_largest,
    reserve,
    reserve_under,
)
from functions.spec import ScalingSpec

SPEC = ScalingSpec()  # idle_to_zero_s 60


def snap(ready=0, starting=0, inflight=0.0, held=0, rps=0.0, at=0.0, slice_=0.25, cold=2.5) -> MetricsSnapshot:
    return MetricsSnapshot("f", at, ready=ready, starting=starting, inflight=float(inflight), activator_queue=held,
                           duty=(0.0,) * ready, rps=rps, cold_start_s=cold, slice_fraction=slice_)


SKI = [
    # gaps, a cold start worth (s of an idle replica), the keep-alive that costs least
    # 0 -> 100; 30 -> 30 + 2/3 x 100 = 96.7; 40 -> 110/3 + 100/3 = 70; 200 -> 270/3 = 90: 40
    ((30.0, 40.0, 200.0), 100.0, 40.0),
    # worth 1,000 s: 200 -> 90 beats 40 -> 36.7 + 333.3: cover every gap
    ((30.0, 40.0, 200.0), 1000.0, 200.0),
    # worth 5 s: every gap costs more to wait through than the cold start: 0
    ((30.0, 40.0, 200.0), 5.0, 0.0),
    # equal costs, the longer: gaps 10, 10; worth 10: K 0 -> 10, K 10 -> 10: 10
    ((10.0, 10.0), 10.0, 10.0),
]


@pytest.mark.parametrize("gaps,worth,keep", SKI)
def test_ski_rental_picks_the_cheapest_keep_alive(gaps, worth, keep):
    assert _ski_rental(gaps, worth) == keep


def state_with(gaps, cold_cost_s, **kw) -> PolicyState:
    # gap_quantiles as decide() keeps them once gaps_min (4) are known
    ordered = sorted(gaps)
    quantiles = (ordered[math.ceil(0.1 * len(ordered)) - 1], ordered[math.ceil(0.9 * len(ordered)) - 1]) \
        if len(gaps) >= DEFAULT_CONFIG.gaps_min else None
    return PolicyState(last_active_at=0.0, gaps=tuple(gaps), gap_quantiles=quantiles, cold_cost_s=cold_cost_s, **kw)


KEEP = [
    # id, gaps, cold start worth, keep-alive
    # every gap covered (200 s): then on until the idle time costs a cold start (250 s)
    ("covers-all-then-break-even", (30.0, 40.0, 200.0, 50.0), 250.0, 250.0),
    # capped by keep_alive_max_s (1,800 s)
    ("capped", (30.0, 40.0, 200.0, 50.0), 5000.0, 1800.0),
    # cheap cold starts, long gaps: the periodic keep (10 s), under idle_to_zero_s
    ("cheap-cold-start", (300.0, 400.0, 500.0, 900.0), 20.0, 10.0),
    # never below idle_to_zero_s (60 s) when some gap is worth covering: gaps 20 s
    ("floor-idle-to-zero", (20.0, 20.0, 20.0, 20.0), 100.0, 100.0),
    # too few gaps (1 < 4) to weigh: until the idle time has cost one cold start (ski rental's
    # break-even), never under idle_to_zero_s (60 s), at most 30 x 60 = 1,800 s (few_gaps_keep_x)
    ("few-gaps-break-even", (30.0,), 1200.0, 1200.0),
    ("few-gaps-capped", (30.0,), 5000.0, 1800.0),
    ("few-gaps-floor", (30.0,), 40.0, 60.0),
    # no cold cost known (never active with a slice): idle_to_zero_s
    ("no-cost", (), None, 60.0),
]


@pytest.mark.parametrize("gaps,worth,keep", [c[1:] for c in KEEP], ids=[c[0] for c in KEEP])
def test_keep_alive_weighs_a_cold_start_against_idle_time(gaps, worth, keep):
    assert keep_alive_s(state_with(gaps, worth), SPEC, DEFAULT_CONFIG) == pytest.approx(keep)


def test_few_gaps_keep_at_most_thirty_times_the_specs_setting():
    # a function set to go at 2 s, its cold start priced at 80 s, one gap known: 30 x 2 = 60 s
    assert keep_alive_s(state_with((30.0,), 80.0), ScalingSpec(idle_to_zero_s=2.0), DEFAULT_CONFIG) == 60.0
    # at 150 s the keep-alive cap (1,800 s) binds first
    assert keep_alive_s(state_with((30.0,), 5000.0), ScalingSpec(idle_to_zero_s=150.0), DEFAULT_CONFIG) == 1800.0


FUNCTION_CAP = [
    # id, gaps, cold start worth, the function's keep_alive_max_s, keep-alive
    # its own bound stands for the platform's 1,800 s: below it (300 s) and above it (3,600 s);
    # every gap covered (200 s), then on to the break-even (5,000 s), cut at the bound
    ("below-the-platform's", (30.0, 40.0, 200.0, 50.0), 5000.0, 300.0, 300.0),
    ("above-the-platform's", (30.0, 40.0, 200.0, 50.0), 5000.0, 3600.0, 3600.0),
    # few gaps: min(break-even 5,000, 30 x 60 = 1,800, its bound): 300 s; raised to 3,600 s,
    # few_gaps_keep_x's 1,800 s still binds until 4 gaps are known
    ("few-gaps-below", (30.0,), 5000.0, 300.0, 300.0),
    ("few-gaps-raised", (30.0,), 5000.0, 3600.0, 1800.0),
    # under its bound the price decides as before: 250 s covers every gap, then break-even
    ("not-binding", (30.0, 40.0, 200.0, 50.0), 250.0, 600.0, 250.0),
    # set to idle_to_zero_s (60 s): it goes then, however dear its cold start
    ("idle-to-zero", (30.0, 40.0, 200.0, 50.0), 5000.0, 60.0, 60.0),
    ("few-gaps-idle-to-zero", (30.0,), 5000.0, 60.0, 60.0),
    # unpriced: the gaps' p90 x 1.1 (104.5 s) within its bound, else idle_to_zero_s
    ("unpriced-within", (40.0, 55.0, 70.0, 80.0, 95.0), None, 120.0, 104.5),
    ("unpriced-past", (40.0, 55.0, 70.0, 80.0, 95.0), None, 100.0, 60.0),
]


@pytest.mark.parametrize("gaps,worth,most,keep", [c[1:] for c in FUNCTION_CAP], ids=[c[0] for c in FUNCTION_CAP])
def test_a_functions_own_keep_alive_bound_stands_for_the_platforms(gaps, worth, most, keep):
    spec = ScalingSpec(keep_alive_max_s=most)
    assert keep_alive_s(state_with(gaps, worth), spec, DEFAULT_CONFIG) == pytest.approx(keep)


def test_a_function_kept_to_its_own_bound_says_so():
    # priced at 5,000 s of idle, bound at 300 s: to zero at 300 s idle, the bound named
    spec = ScalingSpec(keep_alive_max_s=300.0)
    state = state_with((30.0, 40.0, 200.0, 50.0), 5000.0)
    kept, _ = decide(snap(ready=1, at=299.0), spec, state, 299.0)
    assert kept.reason != "TO_ZERO"
    gone, _ = decide(snap(ready=1, at=300.0), spec, state, 300.0)
    assert gone.desired == 0 and gone.reason == "TO_ZERO", gone
    assert "keep-alive 300 s" in gone.detail and "its keep_alive_max_s" in gone.detail, gone.detail
    # bound at its idle_to_zero_s (60 s): it goes then, and says which setting sent it
    at_idle = ScalingSpec(keep_alive_max_s=60.0)
    gone, _ = decide(snap(ready=1, at=60.0), at_idle, state, 60.0)
    assert gone.reason == "TO_ZERO" and "keep-alive 60 s" in gone.detail and "its keep_alive_max_s" in gone.detail


def test_the_platforms_keep_alive_off_holds_for_every_function():
    # PolicyConfig.keep_alive_max_s 0: each function goes at its idle_to_zero_s, its own bound or not
    off = PolicyConfig(keep_alive_max_s=0.0)
    for most in (None, 300.0):
        assert keep_alive_s(state_with((30.0,), 5000.0), ScalingSpec(keep_alive_max_s=most), off) == 60.0


def test_keep_alive_follows_the_old_rule_with_no_price():
    # miss_price_slice_s 0: the idle gaps' p90 x 1.1 (Shahrad et al.): gaps 40..95 -> 104.5 s
    off = PolicyConfig(miss_price_slice_s=0.0)
    assert keep_alive_s(state_with((40.0, 55.0, 70.0, 80.0, 95.0), 1000.0), SPEC, off) == pytest.approx(104.5)


def test_cold_cost_counts_the_requests_held_through_a_cold_start():
    # held 1, 6, 31 while starting (31 the most), then ready: a cold start of 31 misses
    state = PolicyState()
    for held in (1, 6, 31):
        held_max, misses = _held_sample(state, snap(starting=1, held=held))
        state = state._replace(held_max=held_max, cold_misses=misses)
    assert (state.held_max, state.cold_misses) == (31.0, 0.0)
    held_max, misses = _held_sample(state, snap(ready=1, rps=5.0))
    assert (held_max, misses) == (0.0, 31.0)
    # a later cold start of 5: down halfway, (31 + 5) / 2 = 18
    state = state._replace(held_max=5.0, cold_misses=31.0)
    assert _held_sample(state, snap(ready=1)) == (0.0, 18.0)


def test_decide_prices_a_cold_start_by_its_misses():
    # 31 held through a cold start on a 1/4 slice: 31 x 240 slice-s / 0.25 = 29,760 s of an idle replica
    state = PolicyState()
    for t, kw in enumerate([dict(held=1), dict(starting=1, held=31), dict(ready=1, rps=31.0, inflight=2.0)]):
        _, state = decide(snap(at=float(t), **kw), SPEC, state, float(t))
    assert state.cold_misses == 31.0
    assert state.cold_cost_s == pytest.approx(31 * 240.0 / 0.25)


NEEDS_HORIZON = 3.5  # a 2.5 s cold start and a 1 s look


def rises(needs: list[tuple[float, float]]) -> PolicyState:
    state = PolicyState()
    kept: tuple[NeedAt, ...] = ()
    for t, n in needs:
        kept = (kept + (NeedAt(t, n),))[-40:]
        state = state._replace(**dict(zip(("rise", "rise_at", "rise2", "rise2_at"),
                                          _rise_sample(state, kept, t, NEEDS_HORIZON, DEFAULT_CONFIG))), needs=kept)
    return state


def test_a_one_off_spike_holds_no_reserve():
    # 0.5 then 5.0 at t = 10 (a rise of 4.5), back to 0.5: seen once, nothing held
    state = rises([(float(t), 5.0 if t == 10 else 0.5) for t in range(60)])
    assert state.rise == pytest.approx(4.5 * math.exp(-(10 - 10) / 600))
    assert reserve(state, 60.0, DEFAULT_CONFIG) == 0.0


def test_a_rise_that_comes_again_holds_the_smaller():
    # bursts at t = 10 (a rise of 4.5) and t = 100 (3.0): the reserve is 3.0, decaying
    state = rises([(float(t), 5.0 if t == 10 else 3.5 if t == 100 else 0.5) for t in range(200)])
    assert reserve(state, 100.0, DEFAULT_CONFIG) == pytest.approx(3.0)
    assert reserve(state, 700.0, DEFAULT_CONFIG) == pytest.approx(3.0 * math.exp(-1.0))


def test_a_ramp_is_one_burst():
    # the need climbs 0.5 -> 1.5 -> 2.5 -> 3.5 over t = 10..12: one burst, no reserve yet
    state = rises([(float(t), {10: 1.5, 11: 2.5, 12: 3.5}.get(t, 0.5)) for t in range(30)])
    assert state.rise == pytest.approx(3.0) and reserve(state, 30.0, DEFAULT_CONFIG) == 0.0


def test_the_reserve_keeps_replicas_through_calm_and_quiet_until_says_when_it_lets_go():
    # 3 replicas; at t = 160 the need reads 0 (1 rps, no work measured), so its low over the
    # horizon is 0, and the reserve, 3.0 x e^(-60/600) = 2.71 from t = 100, holds ceil(0 + 2.71)
    # = 3; without it the delay window's largest need (0.5) lets 3 halve to 2
    state = rises([(float(t), 5.0 if t == 10 else 3.5 if t == 100 else 0.5) for t in range(160)])
    state = state._replace(last_active_at=159.0)
    spec = ScalingSpec(max_replicas=8)
    decision, _ = decide(snap(ready=3, rps=1.0, at=160.0), spec, state, 160.0)
    assert (decision.desired, decision.reason) == (3, "STABLE")
    off, _ = decide(snap(ready=3, rps=1.0, at=160.0), spec, state, 160.0, PolicyConfig(reserve_memory_s=0.0))
    assert (off.desired, off.reason) == (2, "STABLE")
    # idle at 3 replicas, its last need at 159 (0.0): the delay window ends at 159 + 30 = 189, but
    # the reserve stays over 2 until 100 + 600 ln(3 / 2) = 343.3 s: the later of the two; the
    # keep-alive (gaps of 100-200 s all covered, then on until its idle time has cost a cold start
    # priced at 1,000 s: 159 + 1,000 = 1,159) comes after it
    idle = state._replace(needs=(NeedAt(159.0, 0.0),), peak=None, cold_cost_s=1000.0, gaps=(100.0, 120.0, 150.0, 200.0),
                          gap_quantiles=(100.0, 200.0))
    assert keep_alive_s(idle, SPEC, DEFAULT_CONFIG) == 1000.0
    assert quiet_until(idle, SPEC, 3, 160.0, 2.5, DEFAULT_CONFIG) == pytest.approx(100.0 + 600.0 * math.log(1.5))


def test_reserve_off():
    off = PolicyConfig(reserve_memory_s=0.0)
    state = PolicyState()
    kept: tuple[tuple[float, float], ...] = ((0.0, 0.5), (1.0, 5.0))
    assert _rise_sample(state, kept, 1.0, NEEDS_HORIZON, off) == (0.0, None, 0.0, None)


def missed(looks: list[tuple[float, float, float]], horizon: float = NEEDS_HORIZON,
           window_s: float = 0.0) -> tuple[float, ...]:
    """missed_at after looks of (t, need, share over the SLO), the needs kept as decide() keeps
    them; the share read over `window_s` (0: the look's own)."""
    state, kept = PolicyState(), ()
    for t, need, over in looks:
        kept = (kept + (NeedAt(t, need),))[-40:]
        s = MetricsSnapshot("f", t, ready=1, rps=10.0, over_slo=over, window_s=window_s)
        state = state._replace(missed_at=_missed_sample(state, s, kept, t, horizon, DEFAULT_CONFIG), needs=kept)
    return state.missed_at


def test_missed_bursts_are_runs_of_looks_that_missed_while_the_need_rose():
    calm = [(float(t), 0.5, 0.0) for t in range(10)]
    # t = 10, 11: the need rose 0.5 -> 2.0 and half the requests missed: one burst (10, 11);
    # t = 15 missed with no rise within the horizon (2.0 since 10.5), 4 s after the burst's
    # last miss: not a burst's look
    burst = [(10.0, 2.0, 0.5), (11.0, 2.0, 0.4), (12.0, 2.0, 0.0), (13.0, 2.0, 0.0), (14.0, 2.0, 0.0),
             (15.0, 2.0, 0.3)] + [(float(t), 0.5, 0.0) for t in range(16, 50)]
    assert missed(calm + burst) == (10.0, 11.0)
    # within the horizon of the burst's last miss (3 s after 11), a miss is the same burst
    # still missing, rising or not: (10, 14)
    assert missed(calm + burst[:4] + [(14.0, 2.0, 0.3)]) == (10.0, 14.0)
    # misses under the budget (0.1 %), or a rise under half a replica: none
    assert missed(calm + [(10.0, 2.0, 0.0005)]) == ()
    assert missed(calm + [(10.0, 0.9, 0.5)]) == ()
    # a second burst at t = 50: both kept, oldest first; a third pushes out the first
    second = [(50.0, 3.0, 0.2)] + [(float(t), 0.5, 0.0) for t in range(51, 90)]
    assert missed(calm + burst + second) == (10.0, 11.0, 50.0, 50.0)
    assert missed(calm + burst + second + [(90.0, 4.0, 0.2)]) == (50.0, 50.0, 90.0, 90.0)


def test_a_run_of_misses_longer_than_three_horizons_is_a_step_not_a_burst():
    # a need rising 1 a look from t = 10 with every look missing (a spike the replicas cannot
    # follow): past 10 + 3 x 3.5 = 20.5 s its start becomes -1
    step = [(float(t), 0.5, 0.0) for t in range(10)] + [(float(t), 0.5 + (t - 9), 0.9) for t in range(10, 25)]
    assert missed(step[:21]) == (10.0, 20.0)
    assert missed(step) == (-1.0, 24.0)
    # a spike on a full cluster: the need rose at t = 10-11 and then fell, while the backlog it
    # left missed every look to t = 40 (the spike trace's, as looks read requests once answered):
    # one run of 30 s, a step; before, the looks that did not rise were no part of it, and the
    # burst read (10, 11), short, as if the replicas had caught up
    backlog = [(float(t), 0.5, 0.0) for t in range(10)] + [(10.0, 5.0, 1.0), (11.0, 9.0, 1.0)] \
        + [(float(t), 9.0 - 0.2 * (t - 11), 1.0) for t in range(12, 41)]
    assert missed(backlog) == (-1.0, 40.0)
    # read over a PromQL window of 30 s, a short burst's share over the SLO shows for 30 s after
    # it: that tail is no new miss, so two bursts that rose within the horizon to 13 s and 203 s
    # stay short bursts (a run through the tails would be two steps, (-1, 39, -1, 229))
    tail = [(10.0, 5.0, 1.0), (11.0, 9.0, 1.0)] + [(float(t), 9.0, 0.5) for t in range(12, 40)]
    second = [(200.0, 5.0, 1.0), (201.0, 9.0, 1.0)] + [(float(t), 9.0, 0.5) for t in range(202, 230)]
    calm = [(float(t), 0.5, 0.0) for t in range(10)]
    quiet = [(float(t), 0.5, 0.0) for t in range(40, 200)]
    assert missed(calm + tail + quiet + second, window_s=30.0) == (10.0, 13.0, 200.0, 203.0)


def test_the_reserve_holds_the_largest_rise_once_two_short_bursts_missed():
    # rises 1.0 at t = 50 and 2.25 at t = 144 (the second largest, 1.0, decayed, is the reserve
    # before), and both bursts missed, short: the largest, 2.25, from then on
    state = rises([(float(t), 1.5 if t == 50 else 2.75 if t == 144 else 0.5) for t in range(200)])
    assert (state.rise, state.rise2) == (pytest.approx(2.25), pytest.approx(1.0 * math.exp(-94 / 600)))
    assert reserve(state, 200.0, DEFAULT_CONFIG) == pytest.approx(state.rise2 * math.exp(-56 / 600))
    two = state._replace(missed_at=(50.0, 51.0, 144.0, 147.0))
    assert holds_largest(two, 200.0, DEFAULT_CONFIG)
    assert reserve(two, 200.0, DEFAULT_CONFIG) == pytest.approx(2.25 * math.exp(-56 / 600))
    # either burst a step (start -1), only one burst, or the older past reserve_memory_s: the second
    for m, at in (((-1.0, 80.0, 144.0, 147.0), 200.0), ((50.0, 51.0, -1.0, 160.0), 200.0),
                  ((144.0, 147.0), 200.0), ((50.0, 51.0, 144.0, 147.0), 700.0)):
        held = state._replace(missed_at=m)
        assert not holds_largest(held, at, DEFAULT_CONFIG)
        assert reserve(held, at, DEFAULT_CONFIG) == pytest.approx(_second(state, at))


def _second(state: PolicyState, at: float) -> float:
    return state.rise2 * math.exp(-(at - state.rise2_at) / DEFAULT_CONFIG.reserve_memory_s)


@pytest.mark.parametrize("level,expected", [
    # the largest (3.0 at 100) decays to 2 at 100 + 600 ln 1.5 = 343.3, before it is let go at 650
    (2.0, 100.0 + 600.0 * math.log(1.5)),
    # to 1 only at 100 + 600 ln 3 = 759.2: let go at 650 (the second, 1.0, is not over 1)
    (1.0, 650.0),
])
def test_reserve_under_says_when_the_held_rise_falls_below_a_level(level, expected):
    state = PolicyState(rise=3.0, rise_at=100.0, rise2=1.0, rise2_at=40.0, missed_at=(50.0, 52.0, 100.0, 101.0))
    assert reserve_under(state, level, 120.0, DEFAULT_CONFIG) == pytest.approx(expected)
    # and the reserve, looked at every second, is first at or below the level within the second
    # after it (never before: quiet_until's promise; at 650 exactly the largest is still held)
    first = next(t for t in range(120, 2000) if reserve(state, float(t), DEFAULT_CONFIG) <= level + 1e-9)
    assert expected - 1e-9 <= first <= expected + 1.0


def test_quiet_until_waits_for_the_largest_rise_held():
    # idle at 3 replicas after two missed bursts; the largest rise, 3.0 at 100, holds 3 (the count
    # goes to 2 once the reserve is under 2): 343.3, where the second alone (1.0) would not hold it
    state = PolicyState(last_active_at=120.0, needs=(NeedAt(120.0, 0.0),), rise=3.0, rise_at=100.0, rise2=1.0,
                        rise2_at=40.0, missed_at=(50.0, 52.0, 100.0, 101.0), cold_cost_s=2000.0,
                        gaps=(100.0, 120.0, 150.0, 200.0), gap_quantiles=(100.0, 200.0))
    assert quiet_until(state, SPEC, 3, 121.0, 2.5, DEFAULT_CONFIG) == pytest.approx(100.0 + 600.0 * math.log(1.5))
    one = state._replace(missed_at=(100.0, 101.0))
    assert quiet_until(one, SPEC, 3, 121.0, 2.5, DEFAULT_CONFIG) == pytest.approx(150.0)  # 120 + the 30 s delay


def test_decide_carries_the_missed_bursts():
    # 1 replica at 1 rps, then 30 rps with 60 % over the SLO: a burst that missed, kept by decide()
    spec = ScalingSpec(max_replicas=8, slo_p95_ms=200)
    state = PolicyState()
    for t in range(10):
        _, state = decide(MetricsSnapshot("f", float(t), ready=1, rps=1.0, duty=(0.05,), window_s=1.0,
                                          cold_start_s=2.5, slice_fraction=0.25), spec, state, float(t))
    assert state.missed_at == ()
    _, state = decide(MetricsSnapshot("f", 10.0, ready=1, rps=30.0, duty=(1.0,), over_slo=0.6, window_s=1.0,
                                      cold_start_s=2.5, slice_fraction=0.25, service_s=0.04), spec, state, 10.0)
    assert state.missed_at == (10.0, 10.0)


def test_a_share_read_over_a_long_window_keeps_the_burst():
    # PromQL's over-SLO share over 30 s still shows a burst's misses 20 s on: the same burst
    calm = [(float(t), 0.5, 0.0) for t in range(10)]
    state, kept = PolicyState(), ()
    for t, need, over in calm + [(10.0, 2.0, 0.5)] + [(float(t), 0.5, 0.0) for t in range(11, 30)] + [(30.0, 2.0, 0.5)]:
        kept = (kept + (NeedAt(t, need),))[-40:]
        s = MetricsSnapshot("f", t, ready=1, rps=10.0, over_slo=over, window_s=30.0)
        state = state._replace(missed_at=_missed_sample(state, s, kept, t, NEEDS_HORIZON, DEFAULT_CONFIG), needs=kept)
    assert state.missed_at == (-1.0, 30.0)  # one run, 20 s long: a step, not two bursts


def test_few_gaps_unpriced_keep_the_specs_setting():
    assert keep_alive_s(state_with((30.0,), 1200.0), SPEC, PolicyConfig(miss_price_slice_s=0.0)) == 60.0
