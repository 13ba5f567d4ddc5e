"""Ray Serve's default policy re-implemented (autoscaler.baselines.ray_serve), against
docs/research/autoscaling-baselines.md section 2 and its Ray example cases (section 3,
cases 7-10). Table-driven on a fake clock: `now` is a number, no test sleeps.
Unless a case says otherwise: target_ongoing_requests 2, factors 1.0, upscale 30 s,
downscale 600 s, look-back 30 s, min 0 / max 8 replicas."""

from __future__ import annotations

import math

import pytest

from autoscaler.baselines.ray_serve import (
    RayConfig,
    RayState,
    apply_bounds,
    apply_delay_logic,
    apply_scaling_factors,
    calculate_raw_replicas,
    decide,
    record_sample,
    window_average,
)
from autoscaler.snapshot import MetricsSnapshot
from functions.spec import ScalingSpec

SPEC = ScalingSpec(min_replicas=0, max_replicas=8)
WIDE = ScalingSpec(min_replicas=0, max_replicas=16)  # for the doc's 10-replica cases
DEFAULTS = RayConfig()
HALF_DOWN = RayConfig(downscaling_factor=0.5)
# a look-back shorter than the 0.1 s tick, pushed at every call: the average is the current
# sample alone, so a delay test can change the metric from one call to the next (the 10 s push
# cadence has its own tests in test_baselines_published.py)
INSTANT = RayConfig(look_back_period_s=0.05, metrics_interval_s=0.05)
# the look-back alone: pushed at every 1 s call, no replica full (Ray's max_ongoing_requests
# before 2.32.0, 100), so every request counts in the replicas' average
LOOK_BACK_ONLY = RayConfig(metrics_interval_s=1.0, max_ongoing_requests=100)
TICK_S = 0.1  # Ray's CONTROL_LOOP_INTERVAL_S


def snap(ready=0, starting=0, inflight=0.0, held=0) -> MetricsSnapshot:
    return MetricsSnapshot("f", 0.0, ready=ready, starting=starting, inflight=inflight, activator_queue=held)


def streak(counter: int, since: float) -> RayState:
    """A state in the middle of a streak: `counter` calls (sign = direction) since `since`."""
    return RayState(decision_counter=counter, decision_timestamp=since)


def run(snapshot_at, times, state=RayState(), config=DEFAULTS, spec=SPEC):
    """Call decide() at each of `times` with snapshot_at(now); the decisions and the last state."""
    decisions = []
    for now in times:
        decision, state = decide(snapshot_at(now), spec, state, now, config)
        decisions.append(decision)
    return decisions, state


def ticks(first: int, last: int, step_s: float = TICK_S) -> list[float]:
    """Times first*step .. last*step inclusive, computed from integers so no error adds up."""
    return [i * step_s for i in range(first, last + 1)]


# --- configuration -------------------------------------------------------------------


def test_defaults_are_rays():
    # section 2.1: target 2 (since Ray 2.32.0), 30 s up, 600 s down, 1 -> 0 uses the
    # down delay, 30 s look-back, smoothing factors 1.0
    assert (DEFAULTS.target_ongoing_requests, DEFAULTS.upscale_delay_s, DEFAULTS.downscale_delay_s,
            DEFAULTS.downscale_to_zero_delay_s, DEFAULTS.look_back_period_s,
            DEFAULTS.upscaling_factor, DEFAULTS.downscaling_factor) == (2.0, 30.0, 600.0, None, 30.0, 1.0, 1.0)


CONFIG_ERRORS = [
    ("target-zero", {"target_ongoing_requests": 0}, "target_ongoing_requests (0) must be > 0"),
    ("target-nan", {"target_ongoing_requests": math.nan}, "target_ongoing_requests (nan) must be > 0"),
    ("look-back-zero", {"look_back_period_s": 0}, "look_back_period_s (0) must be > 0"),
    ("upscaling-factor-negative", {"upscaling_factor": -1.0}, "upscaling_factor (-1.0) must be > 0"),
    ("downscaling-factor-zero", {"downscaling_factor": 0.0}, "downscaling_factor (0.0) must be > 0"),
    ("upscale-delay-negative", {"upscale_delay_s": -1}, "upscale_delay_s (-1) must be >= 0"),
    ("downscale-delay-negative", {"downscale_delay_s": -0.5}, "downscale_delay_s (-0.5) must be >= 0"),
    ("to-zero-delay-negative", {"downscale_to_zero_delay_s": -3},
     "downscale_to_zero_delay_s (-3) must be >= 0, or None to use downscale_delay_s"),
]


@pytest.mark.parametrize("kwargs,message", [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS])
def test_config_validation_names_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        RayConfig(**kwargs)
    assert str(err.value) == message


def test_zero_delays_are_valid():
    assert RayConfig(upscale_delay_s=0, downscale_delay_s=0, downscale_to_zero_delay_s=0).upscale_delay_s == 0


# --- the ratio and the scaling factors (Ray's _apply_scaling_factors) ----------------

FACTOR_CASES = [
    # id, total ongoing, running, config, expected raw, expected scaled
    # 12 / (2 * 3) = 2.0 -> raw 3 * 2.0 = 6.0 -> ceil(3 + 1.0 * 3.0) = 6 (doc case 7)
    ("case7-upscale-default-factor", 12.0, 3, DEFAULTS, 6.0, 6),
    # 5 / (2 * 2) = 1.25 -> raw 2.5 -> ceil(2 + 1.0 * 0.5) = 3
    ("upscale-rounds-up", 5.0, 2, DEFAULTS, 2.5, 3),
    # 4 / (2 * 10) = 0.2 -> raw 2.0 -> ceil(10 + 0.5 * -8.0) = ceil(6.0) = 6 (doc case 8)
    ("case8-downscale-half-factor", 4.0, 10, HALF_DOWN, 2.0, 6),
    # 3.9 / (2 * 3) = 0.65 -> raw 1.95 -> ceil(3 + 0.5 * -1.05) = ceil(2.475) = 3 = running,
    # and ceil(1.95) = 2 < 3: the un-stick rule takes one off -> 2 (doc case 8)
    ("case8-unstick-rule", 3.9, 3, HALF_DOWN, 1.95, 2),
    # 3.5 / (2 * 2) = 0.875 -> raw 1.75 -> ceil(2 + 0.5 * -0.25) = ceil(1.875) = 2, and
    # ceil(1.75) = 2 is not < 2: stays 2 (doc case 8)
    ("case8-no-unstick-when-ceil-equals", 3.5, 2, HALF_DOWN, 1.75, 2),
    # 30 / (2 * 2) = 7.5 -> raw 15 -> ceil(2 + 0.5 * 13) = ceil(8.5) = 9
    ("upscale-half-factor", 30.0, 2, RayConfig(upscaling_factor=0.5), 15.0, 9),
    # 0 / (2 * 5) = 0 -> raw 0 -> ceil(5 + 1.0 * -5) = 0
    ("idle-wants-zero", 0.0, 5, DEFAULTS, 0.0, 0),
]


@pytest.mark.parametrize("total,running,config,raw,scaled", [c[1:] for c in FACTOR_CASES],
                         ids=[c[0] for c in FACTOR_CASES])
def test_ratio_and_scaling_factors(total, running, config, raw, scaled):
    got_raw = calculate_raw_replicas(total, running, config.target_ongoing_requests)
    assert got_raw == pytest.approx(raw)
    assert apply_scaling_factors(got_raw, running, config) == scaled


BOUNDS_CASES = [
    ("below-min", ScalingSpec(min_replicas=2, max_replicas=4), 0, 2),
    ("above-max", ScalingSpec(min_replicas=2, max_replicas=4), 9, 4),
    ("inside", ScalingSpec(min_replicas=2, max_replicas=4), 3, 3),
    ("zero-allowed", SPEC, 0, 0),
]


@pytest.mark.parametrize("spec,n,expected", [c[1:] for c in BOUNDS_CASES], ids=[c[0] for c in BOUNDS_CASES])
def test_apply_bounds(spec, n, expected):
    assert apply_bounds(n, spec) == expected


# --- one call of decide(): the doc's examples ----------------------------------------

DECIDE_CASES = [
    # id, snapshot, state, now, config, spec, expected desired, expected reason
    # doc case 7, first tick: 12 / (2 * 3) = 2.0 -> scaled 6 > target 3: streak starts, target stays
    ("case7-upscale-first-tick-holds", snap(ready=3, inflight=12), RayState(), 0.0, DEFAULTS, SPEC, 3, "HOLD"),
    # doc case 7, 30 s into the streak: 30.0 - 0.0 + 1e-6 >= 30 -> fires 6
    ("case7-upscale-fires-at-30s", snap(ready=3, inflight=12), streak(300, 0.0), 30.0, DEFAULTS, SPEC, 6, "BURST"),
    ("case7-upscale-not-at-29.9s", snap(ready=3, inflight=12), streak(299, 0.0), 29.9, DEFAULTS, SPEC, 3, "HOLD"),
    # R1's tolerance: 29.9999995 - 0 + 1e-6 = 30.0000005 >= 30 -> fires
    ("upscale-within-epsilon-fires", snap(ready=3, inflight=12), streak(300, 0.0), 29.9999995, DEFAULTS, SPEC,
     6, "BURST"),
    # doc case 8: 4 / (2 * 10) -> raw 2.0 -> ceil(10 + 0.5 * -8) = 6; 600 s into the streak -> 6
    ("case8-downscale-fires-at-600s", snap(ready=10, inflight=4), streak(-6000, 0.0), 600.0, HALF_DOWN, WIDE,
     6, "STABLE"),
    ("case8-downscale-not-at-599.9s", snap(ready=10, inflight=4), streak(-5999, 0.0), 599.9, HALF_DOWN, WIDE,
     10, "HOLD"),
    # doc case 8: raw 1.95 -> un-stick rule -> 2, fired after 600 s
    ("case8-unstick-fires", snap(ready=3, inflight=3.9), streak(-6000, 0.0), 600.0, HALF_DOWN, SPEC, 2, "STABLE"),
    # doc case 8: raw 1.75 -> scaled 2 == target 2 -> steady, the streak is dropped
    ("case8-equal-resets", snap(ready=2, inflight=3.5), streak(-6000, 0.0), 600.0, HALF_DOWN, SPEC, 2, "STABLE"),
    # doc case 9: 0 running, 1 held -> max(ceil(1 * 1.0), target 0) = 1, no delay
    ("case9-cold-start", snap(held=1), RayState(), 0.0, DEFAULTS, SPEC, 1, "COLD_START"),
    # doc case 9: max(ceil(1 * 3.0), 0) = 3
    ("case9-cold-start-upscaling-factor-3", snap(held=1), RayState(), 0.0, RayConfig(upscaling_factor=3.0), SPEC,
     3, "COLD_START"),
    # doc case 9: 2 still starting -> max(1, target 2) = 2
    ("case9-cold-start-keeps-starting", snap(starting=2, held=1), RayState(), 0.0, DEFAULTS, SPEC, 2, "COLD_START"),
    # the fast path ignores how many wait: 50 held -> still max(ceil(1 * 1.0), 0) = 1
    ("cold-start-ignores-demand-size", snap(held=50), RayState(), 0.0, DEFAULTS, SPEC, 1, "COLD_START"),
    # the fast path triggers on running == 0, and counts in-flight too: 0 ready, 1 starting
    # with 1 in flight -> max(1, 1) = 1
    ("cold-start-while-starting", snap(starting=1, inflight=1), RayState(), 0.0, DEFAULTS, SPEC, 1, "COLD_START"),
    ("zero-stays-zero", snap(), RayState(), 0.0, DEFAULTS, SPEC, 0, "TO_ZERO"),
    # 0 running, nothing waiting, 1 starting -> keep the target 1
    ("zero-running-keeps-target", snap(starting=1), RayState(), 0.0, DEFAULTS, SPEC, 1, "STABLE"),
    # gotcha 1: divides by running 1, compares with target 1 + 2 starting = 3:
    # 1 * (6 / (2 * 1)) = 3 -> scaled 3 == target 3 -> nothing, and the streak resets
    ("gotcha1-running-vs-target", snap(ready=1, starting=2, inflight=6), streak(250, 0.0), 25.0, DEFAULTS, SPEC,
     3, "STABLE"),
    # in-flight and held both count: (4 + 8) / (2 * 3) = 2 -> 6, same as case 7
    ("held-requests-count", snap(ready=3, inflight=4, held=8), streak(300, 0.0), 30.0, DEFAULTS, SPEC, 6, "BURST"),
    # max: 100 / (2 * 4) = 12.5 -> raw 50 -> bounded to 8, fired after 30 s
    ("bounded-by-max", snap(ready=4, inflight=100), streak(300, 0.0), 30.0, DEFAULTS, SPEC, 8, "BURST"),
    # min: 0 / (2 * 2) -> raw 0 -> bounded to min 2 == target 2: steady, no streak to wait out
    ("bounded-by-min", snap(ready=2), RayState(), 0.0, DEFAULTS, ScalingSpec(min_replicas=2, max_replicas=4),
     2, "STABLE"),
    # a target above max (spec lowered): the held target 10 is clamped at once -> 8
    ("target-above-max-clamped", snap(ready=10, inflight=20), RayState(), 0.0, DEFAULTS, SPEC, 8, "BOUNDS"),
    # doc case 10: 5 idle -> scaled 0, kept at max(1, 0) = 1 above one replica; after 600 s -> 1
    ("case10-five-to-one", snap(ready=5), streak(-6000, 0.0), 600.0, DEFAULTS, SPEC, 1, "STABLE"),
    # doc case 10: 1 idle -> 0 after downscale_to_zero_delay_s, here None -> 600 s
    ("case10-one-to-zero", snap(ready=1), streak(-6000, 600.0), 1200.0, DEFAULTS, SPEC, 0, "TO_ZERO"),
    ("case10-one-to-zero-waits", snap(ready=1), streak(-5999, 600.0), 1199.9, DEFAULTS, SPEC, 1, "HOLD"),
    # min 1: 1 idle -> scaled bounded to 1 == target: never goes to zero
    ("min-one-never-zero", snap(ready=1), streak(-6000, 0.0), 600.0, DEFAULTS, ScalingSpec(min_replicas=1),
     1, "STABLE"),
]


@pytest.mark.parametrize("snapshot,state,now,config,spec,desired,reason", [c[1:] for c in DECIDE_CASES],
                         ids=[c[0] for c in DECIDE_CASES])
def test_decide_one_call(snapshot, state, now, config, spec, desired, reason):
    decision, _ = decide(snapshot, spec, state, now, config)
    assert (decision.desired, decision.reason) == (desired, reason)


def test_detail_writes_out_rays_arithmetic():
    decision, _ = decide(snap(ready=3, inflight=12), SPEC, streak(120, 0.0), 12.0)
    # 12 / (2 * 3) = 2 -> raw 3 * 2 = 6 -> scaled ceil(3 + 1 * 3) = 6; 12 s into the 30 s streak
    assert decision.detail == (
        "12 ongoing / (2 per replica * 3 running) = 2 -> raw 6 -> scaled 6 vs target 3; up for 12 s of 30 s"
    )


def test_firing_resets_the_streak():
    _, state = decide(snap(ready=3, inflight=12), SPEC, streak(300, 0.0), 30.0)
    assert (state.decision_counter, state.decision_timestamp) == (0, None)


# --- the delay logic on its own (Ray's _apply_delay_logic) ---------------------------

DELAY_CASES = [
    # id, scaled, target, state, now, expected decision, expected counter, expected timestamp
    ("up-starts-streak", 6, 3, RayState(), 5.0, 3, 1, 5.0),
    ("up-extends-streak", 6, 3, streak(10, 4.0), 5.0, 3, 11, 4.0),
    # a flip from down to up starts a new streak at now
    ("flip-down-to-up-restarts", 6, 3, streak(-200, 0.0), 25.0, 3, 1, 25.0),
    ("equal-resets", 3, 3, streak(200, 0.0), 25.0, 3, 0, None),
    # 0 wanted with 5 running: floored at 1 above one replica, the streak counts down
    ("down-floors-at-one", 0, 5, RayState(), 0.0, 5, -1, 0.0),
    # 1 -> 0 uses downscale_to_zero_delay_s when set: 60 s -> fires at 60 s
    ("to-zero-own-delay", 0, 1, streak(-600, 0.0), 60.0, 0, 0, None),
]


@pytest.mark.parametrize("scaled,target,state,now,decision,counter,timestamp", [c[1:] for c in DELAY_CASES],
                         ids=[c[0] for c in DELAY_CASES])
def test_apply_delay_logic(scaled, target, state, now, decision, counter, timestamp):
    config = RayConfig(downscale_to_zero_delay_s=60.0)
    got, new_state = apply_delay_logic(scaled, target, state, now, config)
    assert (got, new_state.decision_counter, new_state.decision_timestamp) == (decision, counter, timestamp)


# --- on a fake clock: streaks over many calls ----------------------------------------


def test_upscale_fires_on_the_301st_tick():
    # doc case 7: 12 ongoing on 3 -> 6 wanted; ticks at 0.0, 0.1, ..., 30.0: the 301st
    # (30.0 - 0.0 >= 30 s) fires, as R2's counter 301 > int(30 / 0.1) = 300 did
    decisions, state = run(lambda now: snap(ready=3, inflight=12), ticks(0, 300))
    assert [d.desired for d in decisions[:300]] == [3] * 300
    assert {d.reason for d in decisions[:300]} == {"HOLD"}
    assert (decisions[300].desired, decisions[300].reason) == (6, "BURST")
    assert state.decision_counter == 0


DIP_CASES = [
    # id, ongoing at the 201st tick (20.0 s)
    # 6 / (2 * 3) = 1 -> raw 3 == target 3: the streak ends
    ("dip-to-target-resets", 6.0),
    # 2 / (2 * 3) -> raw 1 < target 3: a downscale tick, the up streak ends
    ("flip-to-downscale-resets", 2.0),
]


@pytest.mark.parametrize("dip", [c[1] for c in DIP_CASES], ids=[c[0] for c in DIP_CASES])
def test_a_dip_restarts_the_upscale_delay(dip):
    # INSTANT look-back so one call's metric is the average; 12 ongoing everywhere but at 20.0 s
    def snapshot_at(now):
        return snap(ready=3, inflight=dip if now == 200 * TICK_S else 12.0)

    decisions, _ = run(snapshot_at, ticks(0, 501), config=INSTANT)
    # the streak restarts at 20.1 s, so it fires at 20.1 + 30 = 50.1 s (tick 501), not at 30.0 s
    assert [d.desired for d in decisions[:501]] == [3] * 501
    assert decisions[501].desired == 6


def test_downscale_waits_600s_of_wall_time():
    # 4 / (2 * 5) = 0.4 -> raw 2.0 -> 2 wanted of 5. R1 measures wall time, so a 1 s
    # call period fires at 600 s just as the 0.1 s one would (R2's counter would need 6001 calls).
    decisions, _ = run(lambda now: snap(ready=5, inflight=4), ticks(0, 600, step_s=1.0))
    assert {d.desired for d in decisions[:600]} == {5}
    assert (decisions[600].desired, decisions[600].reason) == (2, "STABLE")


def test_cold_start_is_immediate_then_upscale_waits():
    # 0 running, 3 held -> 1 at once (not ceil(3 / 2) = 2); once it runs, 3 / (2 * 1) = 1.5
    # -> raw 1.5 -> 2 > 1 waits the 30 s upscale delay like any other
    first, state = decide(snap(held=3), SPEC, RayState(), 0.0, INSTANT)
    assert (first.desired, first.reason) == (1, "COLD_START")
    decisions, _ = run(lambda now: snap(ready=1, inflight=3), ticks(10, 310), state, INSTANT)
    assert [d.desired for d in decisions[:300]] == [1] * 300  # 1.0 s .. 30.9 s
    assert decisions[300].desired == 2  # 31.0 - 1.0 = 30 s


TO_ZERO_CASES = [
    # id, config, when 1 -> 0 fires
    # 5 -> 1 at 600 s; the 1 -> 0 streak starts at 601 s and lasts 600 s -> 1201 s (about 1200 s, doc case 10)
    ("defaults-600-then-600", DEFAULTS, 1201),
    # downscale_to_zero_delay_s 60: 601 + 60 = 661 s
    ("own-to-zero-delay", RayConfig(downscale_to_zero_delay_s=60.0), 661),
]


@pytest.mark.parametrize("config,zero_at", [c[1:] for c in TO_ZERO_CASES], ids=[c[0] for c in TO_ZERO_CASES])
def test_scale_to_zero_is_two_stage(config, zero_at):
    # doc case 10: 5 idle replicas, min 0. The snapshot follows the decisions as
    # Shoal's controller would (a stopped replica leaves ready at once).
    state, ready, history = RayState(), 5, {}
    for now in ticks(0, zero_at, step_s=1.0):
        decision, state = decide(snap(ready=ready), SPEC, state, now, config)
        history[int(now)] = decision.desired
        ready = decision.desired
    assert (history[599], history[600]) == (5, 1)  # never 5 -> 0 in one step
    assert (history[zero_at - 1], history[zero_at]) == (1, 0)
    assert decision.reason == "TO_ZERO"


# --- the look-back average (InMemoryMetricsStore.window_average) ---------------------

WINDOW_CASES = [
    # id, samples before, now, value now, expected samples kept, expected average
    # (0, 30] keeps 10 s and 30 s: (0 + 0) / 2 = 0 -- the 100 at exactly 30 s old is out
    ("oldest-at-exactly-look-back-dropped", ((0.0, 100.0), (10.0, 0.0)), 30.0, 0.0, ((10.0, 0.0), (30.0, 0.0)), 0.0),
    # (-0.1, 29.9] keeps all three: (100 + 0 + 2) / 3 = 34
    ("inside-look-back-kept", ((0.0, 100.0), (10.0, 0.0)), 29.9, 2.0,
     ((0.0, 100.0), (10.0, 0.0), (29.9, 2.0)), 34.0),
    ("first-sample", (), 5.0, 3.0, ((5.0, 3.0),), 3.0),
]


@pytest.mark.parametrize("before,now,value,kept,average", [c[1:] for c in WINDOW_CASES],
                         ids=[c[0] for c in WINDOW_CASES])
def test_look_back_window(before, now, value, kept, average):
    samples = record_sample(before, now, value, 30.0)
    assert samples == kept
    assert window_average(samples) == pytest.approx(average)


def test_window_average_of_nothing_is_zero():
    assert window_average(()) == 0.0


def test_a_burst_is_diluted_by_the_look_back():
    # gotcha 7: 1 running, idle from 0 s to 28 s (one sample a second), then 60 ongoing at 29 s:
    # (29 * 0 + 60) / 30 samples = 2 -> 1 * (2 / (2 * 1)) = 1 -> raw 1 == target 1: no upscale yet
    decisions, state = run(lambda now: snap(ready=1, inflight=60 if now >= 29 else 0), ticks(0, 29, step_s=1.0),
                           config=LOOK_BACK_ONLY)
    assert len(state.samples) == 30
    assert (decisions[-1].desired, decisions[-1].reason) == (1, "STABLE")
    # at 30 s the 0 s sample is out: (28 * 0 + 60 + 60) / 30 = 4 -> raw 2 > 1: a streak starts
    decision, _ = decide(snap(ready=1, inflight=60), SPEC, state, 30.0, LOOK_BACK_ONLY)
    assert (decision.desired, decision.reason) == (1, "HOLD")
    assert decision.detail.startswith("4 ongoing / (2 per replica * 1 running) = 2 -> raw 2")
