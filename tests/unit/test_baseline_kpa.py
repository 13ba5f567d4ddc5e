"""Knative KPA baseline: the decision step and the window buckets, table-driven on a fake clock.
Cases from docs/research/autoscaling-baselines.md section 3 (target 70 = 100 x 70 %)."""

from __future__ import annotations

import pytest

from autoscaler.baselines.kpa import Buckets, KpaConfig, KpaState, decide, initial_state, scale_step
from autoscaler.snapshot import MetricsSnapshot
from functions.spec import ScalingSpec

CFG = KpaConfig()
NOW = 1000.0

STEP_CASES = [
    # id, ready, stable, panic, state, expected desired, expected panicking
    # max_down = floor(3/2) = 1; dspc = ceil(150/70) = 3; dppc = ceil(160/70) = 3; 3/3 = 1.0 < 2.0
    ("steady-state", 3, 150.0, 160.0, KpaState(), 3, False),
    # dppc = ceil(280/70) = 4; 4/2 = 2.0 >= 2.0 -> panic; max(ceil(100/70) = 2, 4) = 4
    ("enters-panic-at-exactly-200pct", 2, 100.0, 280.0, KpaState(), 4, True),
    # dppc = ceil(210/70) = 3; 3/2 = 1.5 < 2.0 -> no panic; dspc = ceil(100/70) = 2
    ("no-panic-at-150pct", 2, 100.0, 210.0, KpaState(), 2, False),
    # dppc = ceil(210.5/70) = ceil(3.007) = 4; 4/2 = 2.0 -> panic
    ("ceil-tips-into-panic", 2, 100.0, 210.5, KpaState(), 4, True),
    # panicking 20 s, max_panic_pods 10; dspc = ceil(500/70) = 8, dppc = 5; 20 s < 60 s: still panic
    # -> max(8, 5, 10) = 10: panic never scales down
    ("panic-never-scales-down", 10, 500.0, 350.0, KpaState(panic_time=NOW - 20, max_panic_pods=10), 10, True),
    # same, panicking since 61 s ago: 61 > 60 -> un-panic, max_panic_pods = 0, stable decides: 8
    ("panic-ends-after-stable-window", 10, 500.0, 350.0, KpaState(panic_time=NOW - 61, max_panic_pods=10), 8, False),
    # exactly 60 s: panic_time + 60 < now is false -> still panicking
    ("panic-holds-at-exactly-60s", 10, 500.0, 350.0, KpaState(panic_time=NOW - 60, max_panic_pods=10), 10, True),
    # dspc = ceil(70/70) = 1 but max_down = floor(10/2) = 5: at most halve per tick
    ("scale-down-halves", 10, 70.0, 70.0, KpaState(), 5, False),
    ("halving-5-to-2", 5, 70.0, 70.0, KpaState(), 2, False),  # floor(5/2) = 2
    ("one-to-zero", 1, 0.0, 0.0, KpaState(), 0, False),  # floor(1/2) = 0, ceil(0/70) = 0
    # from zero: ready floored at 1; ceil(1/70) = 1; 1/1 < 2
    ("from-zero-one-request", 0, 1.0, 1.0, KpaState(), 1, False),
    # 300 at the activator: dppc = ceil(300/70) = 5; 5/1 >= 2 -> panic, 5 pods
    ("from-zero-burst-panics", 0, 1.0, 300.0, KpaState(), 5, True),
]


@pytest.mark.parametrize("ready,stable,panic,state,desired,panicking", [c[1:] for c in STEP_CASES],
                         ids=[c[0] for c in STEP_CASES])
def test_scale_step(ready, stable, panic, state, desired, panicking):
    got, _, new_state = scale_step(ready, stable, panic, state, NOW, CFG)
    assert got == desired
    assert (new_state.panic_time is not None) == panicking


def test_defaults():
    assert CFG.target == 70.0 and CFG.panic_window_s == 6 and CFG.panic_threshold == 2.0


def test_new_autoscaler_with_pods_starts_in_panic():
    state = initial_state(CFG, ready=3, now=5.0)
    assert state.panic_time == 5.0 and state.max_panic_pods == 3
    assert initial_state(CFG, ready=1).panic_time is None


def test_a_scale_it_starts_with_is_kept_until_the_grace_period():
    # a new revision's initial scale of one pod, looked at before the pod is asked for (nothing
    # runs yet) and without traffic: the decision reaches 0 at the first tick, and the scale stays
    # 1 through the 30 s grace period, then 0 (started from what runs, it would be 0 at once)
    state = initial_state(CFG, ready=1, now=0.0)
    assert (state.desired, initial_state(CFG).desired) == (1, -1)
    seen = []
    for t in (0.0, 2.0, 28.0, 30.0):
        decision, state = decide(MetricsSnapshot("f", t, ready=1 if t else 0), ScalingSpec(), state, t, CFG)
        seen.append((decision.desired, decision.reason))
    assert seen == [(1, "HOLD"), (1, "HOLD"), (1, "HOLD"), (0, "TO_ZERO")]


def test_buckets_average_over_a_partial_window_after_silence():
    # one second with 1 request after a long idle: the average is 1.0, not 1/60
    b = Buckets(60.0).record(100.0, 1.0)
    assert b.average(100.5) == 1.0
    # two values in the same second add up (scraper + activator)
    assert b.record(100.7, 2.0).average(100.9) == 3.0
    full = Buckets(60.0)
    for t in range(100, 110):
        full = full.record(float(t), 7.0)
    # at t=159 (50 s after the last write): buckets after 109 are empty; valid = 10 seconds
    # written, window has 60 - 50 = 10 buckets left to count -> 70 / min(10, 10) = 7.0
    assert full.average(159.0) == 7.0
    assert full.is_empty(170.0) and not full.is_empty(169.0)


def snap(ready, demand):
    return MetricsSnapshot("f", 0.0, ready=ready, inflight=float(demand))


def test_scale_to_zero_waits_for_the_grace_period():
    spec = ScalingSpec(min_replicas=0, max_replicas=10)
    state = KpaState(desired=1)
    # one request at t=0, then nothing: the stable window (60 s) must drain first
    decision, state = decide(snap(1, 1), spec, state, 0.0)
    assert decision.desired == 1
    t = 2.0
    while t < 61.0:
        decision, state = decide(snap(1, 0), spec, state, t)
        assert decision.desired == 1, t
        t += 2.0
    # the running pod keeps reporting 0: once the 60 s window holds only zeros the step wants
    # 0 pods (floor(1/2) = 0 allows it), HOLD during the 30 s grace, then TO_ZERO
    reasons = []
    while t < 130.0:
        decision, state = decide(snap(1, 0), spec, state, t)
        reasons.append((t, decision.desired, decision.reason))
        t += 2.0
    zero_at = next(t for t, d, r in reasons if r == "TO_ZERO")
    # 60 s of window + 30 s of grace: zero about 90 s after the last request
    assert 88.0 <= zero_at <= 94.0, reasons


def test_scale_from_zero_is_decided_at_once():
    spec = ScalingSpec(min_replicas=0, max_replicas=10)
    state = KpaState(desired=0, last_tick=100.0)
    decision, state = decide(snap(0, 3), spec, state, 100.5)  # before the next 2 s tick: poked
    assert decision.desired == 1 and decision.reason == "STABLE"
