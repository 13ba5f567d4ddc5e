"""Shoal's scaling policy (autoscaler.policy): the need, scale up/down, to and from zero,
the forecast, slice hints, config validation, purity. Table-driven on a fake clock:
`now` is a number, multi-step scenarios call decide() at now = 0, 1, 2, ... threading
the state. Unless a case says otherwise: ScalingSpec() = min 0 / max 8 replicas, SLO
p95 100 ms (target 80 % = 80 ms), target duty 0.7, target concurrency 4, idle to zero
60 s; PolicyConfig() defaults (max duty 0.9 at p95 <= 50 % of its target = 40 ms, SLO
boost at most 2); measured cold start 2 s; duty 0.0 on every ready replica; service
time (executor seconds per request) unknown, p95 unknown.

The need model: measured work = max(rps x service_s, sum(duty)); work view = work /
duty target (0.7 when p95 is unknown or >= 80 ms, 0.9 when p95 <= 40 ms, linear
between); concurrency view = (in flight + held) / 4, only when p95 is unknown or over
80 ms, and at most 2 x the work view once service_s is known; SLO view = work view x
min(2, p95 / 80 ms) when p95 is over 80 ms. The need is the largest view."""

from __future__ import annotations

import copy
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import (
    DEFAULT_CONFIG,
    REASONS,
    NeedAt,
    PolicyConfig,
    PolicyState,
    ScaleDecision,
    _duty_target,
    _kept_needs,
    _window_peak,
    decide,
    estimate_need,
    next_onset,
    quiet_until,
    trend_need,
    window_max,
    window_start,
)
from functions.spec import ScalingSpec

SPEC = ScalingSpec()
CFG = DEFAULT_CONFIG
# the window mechanics below read each look's in-flight as it is (by default the concurrency
# view averages it over 5 s: test_in_flight_is_averaged_like_kpas_window covers that)
INSTANT = PolicyConfig(concurrency_window_s=0.0)
# a trend capped at 1x can never exceed the current need, so it never wins: the
# burst-window cases read without the forecast's extrapolation
NO_TREND = PolicyConfig(trend_max_boost=1.0, concurrency_window_s=0.0)
# keeps 31 s of needs instead of 30, so a whole 30 s delay window can be seen and the
# scale-down arithmetic can be tested (with the defaults it never scales down: see
# test_scale_down_happens_with_the_default_config)
COVERS = PolicyConfig(trend_window_s=31.0, concurrency_window_s=0.0)
COVERS_NO_TREND = PolicyConfig(trend_window_s=31.0, trend_max_boost=1.0, concurrency_window_s=0.0)


def snap(ready=0, starting=0, inflight=0.0, held=0, duty=None, rps=0.0, p95=None, cold=2.0,
         slice_=None, service=None, at=0.0, batch=(), deployed=None) -> MetricsSnapshot:
    """duty defaults to 0.0 on each ready replica (a scrape has been seen)."""
    if duty is None:
        duty = (0.0,) * ready
    return MetricsSnapshot("f", at, ready=ready, starting=starting, inflight=float(inflight),
                           activator_queue=held, duty=tuple(duty), rps=rps, p95_s=p95,
                           cold_start_s=cold, slice_fraction=slice_, service_s=service, batch_latency_s=batch,
                           deployed_slice=deployed)


def run(load, until, spec=SPEC, config=CFG, state=None, start=0):
    """decide() at now = start..until, threading the state; load(t) -> snapshot kwargs.
    Returns [(t, decision)] and the last state."""
    state = PolicyState() if state is None else state
    out = []
    for t in range(start, until + 1):
        decision, state = decide(snap(at=float(t), **load(t)), spec, state, float(t), config)
        out.append((t, decision))
    return out, state


def follow(load, until, spec=SPEC, config=CFG, ready=0):
    """Like run(), with the replicas following each decision at once (a started replica
    is ready on the next tick); load(t, ready) -> snapshot kwargs other than ready."""
    state = PolicyState()
    out = []
    for t in range(until + 1):
        decision, state = decide(snap(ready=ready, at=float(t), **load(t, ready)), spec, state, float(t), config)
        out.append((t, decision))
        ready = decision.desired
    return out


def changes(out):
    """(t, desired, reason) where the decision differs from the previous tick's."""
    got, last = [], None
    for t, d in out:
        if (d.desired, d.reason) != last:
            got.append((t, d.desired, d.reason))
            last = (d.desired, d.reason)
    return got


# ---------------------------------------------------------------------- estimate_need

DUTY_TARGET_CASES = [
    # id, p95 / its target (None: unknown), spec, config, expected duty target
    # high = max(max_duty 0.9, target_duty 0.7) = 0.9, low = headroom 50 % = 0.5
    ("unknown", None, SPEC, CFG, 0.7),  # the spec's target_duty
    ("headroom-0.4", 0.4, SPEC, CFG, 0.9),  # 0.4 <= 0.5: max_duty
    ("headroom-edge-0.5", 0.5, SPEC, CFG, 0.9),  # 0.5 <= 0.5
    ("no-latency-0.0", 0.0, SPEC, CFG, 0.9),
    ("halfway-0.75", 0.75, SPEC, CFG, 0.8),  # 0.7 + (0.9 - 0.7) x (1 - 0.75) / (1 - 0.5) = 0.7 + 0.2 x 0.5
    ("0.9", 0.9, SPEC, CFG, 0.74),  # 0.7 + 0.2 x (1 - 0.9) / 0.5 = 0.7 + 0.04
    ("at-target-1.0", 1.0, SPEC, CFG, 0.7),  # >= 1: target_duty
    ("over-target-1.5", 1.5, SPEC, CFG, 0.7),
    ("spec-duty-0.5", 0.75, ScalingSpec(target_duty=0.5), CFG, 0.7),  # 0.5 + (0.9 - 0.5) x 0.5
    ("spec-duty-above-max", 0.4, ScalingSpec(target_duty=0.95), CFG, 0.95),  # high = max(0.9, 0.95)
    ("spec-duty-above-max-halfway", 0.75, ScalingSpec(target_duty=0.95), CFG, 0.95),  # 0.95 + 0 x 0.5
    ("max-duty-1", 0.4, SPEC, PolicyConfig(max_duty=1.0), 1.0),
    ("max-duty-1-halfway", 0.75, SPEC, PolicyConfig(max_duty=1.0), 0.85),  # 0.7 + (1 - 0.7) x 0.5
    ("headroom-0pct", 0.5, SPEC, PolicyConfig(headroom_pct=0.0), 0.8),  # low 0: 0.7 + 0.2 x (1 - 0.5) / 1
    ("headroom-0pct-at-0", 0.0, SPEC, PolicyConfig(headroom_pct=0.0), 0.9),  # 0 <= 0
]


@pytest.mark.parametrize("ratio,spec,config,expected", [c[1:] for c in DUTY_TARGET_CASES],
                         ids=[c[0] for c in DUTY_TARGET_CASES])
def test_duty_target(ratio, spec, config, expected):
    assert _duty_target(ratio, spec, config) == pytest.approx(expected)


NEED_CASES = [
    # id, snapshot, expected replicas, expected view
    # (SLO target 100 ms x 80 % = 80 ms; headroom at 80 x 50 % = 40 ms)
    ("nothing", snap(), 0.0, "work"),  # work 0 / 0.7 = 0; concurrency 0 / 4 = 0 is not larger
    # p95 unknown: the concurrency view counts
    ("concurrency-9-in-flight", snap(ready=2, inflight=9), 2.25, "concurrency"),  # work 0; 9 / 4 = 2.25
    ("held-count-as-demand", snap(held=9), 2.25, "concurrency"),  # 0 + 9 held = 9; 9 / 4 = 2.25
    ("in-flight-plus-held", snap(ready=1, inflight=5, held=4), 2.25, "concurrency"),  # (5 + 4) / 4
    # the summed duty is measured work: (0.9 + 0.8) / 0.7 = 2.43 > 4 / 4 = 1
    ("duty-is-work", snap(ready=2, inflight=4, duty=(0.9, 0.8)), 1.7 / 0.7, "work"),
    ("concurrency-wins-over-duty", snap(ready=2, inflight=12, duty=(0.9, 0.8)), 3.0, "concurrency"),  # 12/4 = 3 > 2.43
    ("tie-goes-to-work", snap(ready=1, inflight=4, duty=(0.7,)), 1.0, "work"),  # 0.7 / 0.7 = 1 = 4 / 4: not larger
    # work from the service time: rps x service_s, or the summed duty if larger
    ("work-300rps-x-4ms", snap(ready=2, rps=300, service=0.004), 1.2 / 0.7, "work"),  # 300 x 0.004 = 1.2; / 0.7 = 1.71
    ("work-duty-larger", snap(ready=2, duty=(0.9, 0.8), rps=300, service=0.004), 1.7 / 0.7, "work"),  # max(1.2, 1.7)
    # one replica's duty stops at 1.0, rps x service_s does not: max(500 x 0.004 = 2.0, 1.0) / 0.7 = 2.86
    ("work-not-saturated", snap(ready=1, duty=(1.0,), rps=500, service=0.004), 2.0 / 0.7, "work"),
    ("service-time-without-rps", snap(ready=1, duty=(0.35,), service=0.004), 0.5, "work"),  # max(0, 0.35) / 0.7
    ("rps-without-service-time", snap(ready=1, duty=(0.35,), rps=300), 0.5, "work"),  # service unknown: 0.35 / 0.7
    # the duty target follows the latency headroom
    ("work-headroom-30ms", snap(ready=2, rps=300, service=0.004, p95=0.030), 1.2 / 0.9, "work"),  # 30 <= 40: 1.33
    ("work-halfway-60ms", snap(ready=2, rps=300, service=0.004, p95=0.060), 1.5, "work"),  # 60/80 -> 0.8; 1.2/0.8
    ("work-at-target-80ms", snap(ready=2, rps=300, service=0.004, p95=0.080), 1.2 / 0.7, "work"),  # 80/80 = 1 -> 0.7
    # the concurrency view stands whatever the latency: the function's own target per replica
    # 50/80 = 0.625 -> duty 0.85: 1.4 / 0.85 = 1.65 < 40 / 4 = 10
    ("concurrency-under-target", snap(ready=2, inflight=40, duty=(0.7, 0.7), p95=0.050), 10.0, "concurrency"),
    ("concurrency-at-target", snap(ready=2, inflight=40, duty=(0.7, 0.7), p95=0.080), 10.0, "concurrency"),  # > 1.4/0.7
    ("in-flight-alone-under-target", snap(ready=2, inflight=40, p95=0.020), 10.0, "concurrency"),  # 40 / 4
    # p95 over its target: it is; 120/80 = 1.5, service unknown so uncapped: 40 / 4 = 10 > SLO 1.4/0.7 x 1.5 = 3
    ("concurrency-used-over-target", snap(ready=2, inflight=40, duty=(0.7, 0.7), p95=0.120), 10.0, "concurrency"),
    # executor time misses decoding and queueing: concurrency is not capped by the work view
    ("concurrency-beside-measured-work", snap(ready=1, inflight=40, rps=300, service=0.004), 10.0, "concurrency"),
    ("concurrency-over-1.71", snap(ready=1, inflight=9, rps=300, service=0.004), 2.25, "concurrency"),  # 9/4 > 1.71
    ("concurrency-without-work", snap(ready=1, inflight=40, service=0.004), 10.0, "concurrency"),  # work 0, 40 / 4
    ("concurrency-over-duty", snap(ready=1, inflight=40, duty=(0.6,)), 10.0, "concurrency"),  # 0.86 < 10
    # 120/80 = 1.5: SLO 1.71 x 1.5 = 2.57 < 40 / 4 = 10
    ("concurrency-over-slo", snap(ready=1, inflight=40, rps=300, service=0.004, p95=0.120), 10.0, "concurrency"),
    # SLO: p95 over 80 ms multiplies the work view (duty target 0.7) by min(3, p95 / 80)
    ("slo-x1.5", snap(ready=2, duty=(0.7, 0.7), p95=0.120), 3.0, "slo"),  # 120/80 = 1.5; 1.4 / 0.7 = 2 x 1.5 = 3
    ("slo-boost-capped-at-3", snap(ready=2, duty=(0.7, 0.7), p95=0.400), 6.0, "slo"),  # 400/80 = 5 -> 3; 2 x 3 = 6
    ("slo-needs-measured-work", snap(ready=2, p95=0.120), 0.0, "work"),  # work 0 x 1.5 = 0; concurrency 0 / 4
    # the SLO raises the work view only: 16 / 4 = 4 > 2 x 1.5 = 3 (not 4 x 1.5 = 6)
    ("slo-does-not-raise-concurrency", snap(ready=2, inflight=16, duty=(0.7, 0.7), p95=0.120), 4.0, "concurrency"),
    ("slo-beats-concurrency", snap(ready=2, inflight=8, duty=(0.7, 0.7), p95=0.120), 3.0, "slo"),  # 3 > 8 / 4 = 2
    ("slo-ignored-without-ready", snap(starting=2, held=4, p95=0.200), 1.0, "concurrency"),  # nobody measured it: 4/4
    # the docstring's numbers in one snapshot: work 300 x 4 ms = 1.2 / 0.7 = 1.71; concurrency 9 / 4 = 2.25;
    # SLO 120/80: 1.71 x 1.5 = 2.57 > 2.25
    ("docstring-example", snap(ready=2, inflight=9, rps=300, service=0.004, p95=0.120), 1.2 / 0.7 * 1.5, "slo"),
    # the same from duty alone: 1.7 / 0.7 = 2.43 x 1.5 = 3.64 > 9 / 4 = 2.25
    ("duty-example", snap(ready=2, inflight=9, duty=(0.9, 0.8), p95=0.120), 1.7 / 0.7 * 1.5, "slo"),
]


@pytest.mark.parametrize("snapshot,replicas,by", [c[1:] for c in NEED_CASES], ids=[c[0] for c in NEED_CASES])
def test_estimate_need(snapshot, replicas, by):
    need = estimate_need(snapshot, SPEC, CFG)
    assert need.replicas == pytest.approx(replicas)
    assert need.by == by
    assert need.detail


def test_slo_max_boost_bounds_the_slo_view():
    # p95 400 ms over 80: 5x, bounded at 1.5: (300 x 0.004 = 1.2) / 0.7 x 1.5 = 2.57
    need = estimate_need(snap(ready=1, rps=300, service=0.004, p95=0.400), SPEC, PolicyConfig(slo_max_boost=1.5))
    assert (need.replicas, need.by) == (pytest.approx(1.5 * 1.2 / 0.7), "slo")


# ---------------------------------------------------------------------- one decision

ONE_STEP_CASES = [
    # id, spec, snapshot, expected desired, expected reason  (fresh state, now = 0)
    # from zero: sized by demand, no rate cap
    ("cold-start-9-held", SPEC, snap(held=9), 3, "COLD_START"),  # ceil(9 / 4 = 2.25) = 3
    ("cold-start-1-held", SPEC, snap(held=1), 1, "COLD_START"),  # max(1, ceil(0.25) = 1)
    ("cold-start-capped-by-max", SPEC, snap(held=100), 8, "COLD_START"),  # ceil(100 / 4 = 25) -> max 8
    ("cold-start-not-rate-capped", ScalingSpec(max_replicas=30), snap(held=100), 25, "COLD_START"),  # 0 x 10 = 0 ignored
    ("cold-start-min-floor", ScalingSpec(min_replicas=5), snap(held=9), 5, "COLD_START"),  # max(5, 3)
    ("zero-stays-zero", SPEC, snap(), 0, "TO_ZERO"),
    ("zero-up-to-min", ScalingSpec(min_replicas=2), snap(), 2, "STABLE"),
    # starting, none ready, requests held, need from concurrency: hold the count (COLD_START)
    ("cold-start-hold-500-held", SPEC, snap(starting=1, held=500), 1, "COLD_START"),  # 500 / 4 = 125, not BURST to 8
    ("cold-start-hold-3-for-9", SPEC, snap(starting=3, held=9), 3, "COLD_START"),  # 9 / 4 = 2.25: 3 starting
    ("starting-nothing-held", SPEC, snap(starting=1), 1, "STABLE"),  # need 0, never below 1 while up
    # one ready: no hold; 125 wanted, at most ceil(2 x 10) = 20 -> max 8
    ("no-hold-once-one-is-ready", SPEC, snap(ready=1, starting=1, held=500), 8, "BURST"),
    # none ready, but the need is work (1.2 / 0.7 = 1.71 > 4 / 4 = 1): no hold, ceil(1.71) = 2 > 1
    ("no-hold-when-work-sets-the-need", SPEC, snap(starting=1, held=4, rps=300, service=0.004), 2, "BURST"),
    # with replicas
    ("burst-at-once", SPEC, snap(ready=2, inflight=20), 5, "BURST"),  # 20 / 4 = 5 > 2
    ("burst-on-duty", SPEC, snap(ready=2, inflight=2, duty=(0.9, 0.8)), 3, "BURST"),  # ceil(1.7 / 0.7 = 2.43)
    ("burst-on-service-time", SPEC, snap(ready=1, duty=(1.0,), rps=500, service=0.004), 3, "BURST"),  # 2.0/0.7 = 2.86
    # 40 / 4 = 10 > 1, capped at max_scale_up_rate 10 x 1 = 10, and max_replicas 8 -> 8
    ("backlog-burst", SPEC, snap(ready=1, inflight=40, rps=300, service=0.004), 8, "BURST"),
    # work 0.5 / 0.7 = 0.71 < (4 + 5) / 4 = 2.25 -> ceil 3 = 1 ready + 2 starting
    ("ready-plus-starting", SPEC, snap(ready=1, starting=2, inflight=4, held=5, duty=(0.5,)), 3, "STABLE"),
    # latency headroom packs the work into fewer replicas: p95 30 <= 40 ms: 1.6 / 0.9 = 1.78 -> 2 = 2
    ("headroom-packs-fewer", SPEC, snap(ready=2, duty=(0.8, 0.8), p95=0.030), 2, "STABLE"),
    ("no-headroom-scales-out", SPEC, snap(ready=2, duty=(0.8, 0.8)), 3, "BURST"),  # p95 unknown: 1.6 / 0.7 = 2.29 -> 3
    # 50/80 -> duty 0.85: 1.4 / 0.85 = 1.65, but 40 in flight / 4 = 10 -> max_replicas 8
    ("in-flight-under-target-bursts", SPEC, snap(ready=2, inflight=40, duty=(0.7, 0.7), p95=0.050), 8, "BURST"),
    # (0.5 + 0.5) / 0.7 = 1.43 x 120/80 = 2.14 -> 3 > 2
    ("slo-sets-the-need", SPEC, snap(ready=2, duty=(0.5, 0.5), p95=0.120), 3, "SLO"),
    ("slo-capped-boost", SPEC, snap(ready=2, duty=(0.7, 0.7), p95=0.400), 6, "SLO"),  # 1.4/0.7 = 2 x min(3, 5) = 6
    # 4000 / 4 = 1000 wanted; at most ceil(1 x 10) = 10 per decision
    ("rate-cap-1-to-10", ScalingSpec(max_replicas=100), snap(ready=1, inflight=4000), 10, "BURST"),
    ("rate-cap-3-to-30", ScalingSpec(max_replicas=100), snap(ready=3, inflight=4000), 30, "BURST"),  # 3 x 10
    ("max-replicas-cap", SPEC, snap(ready=2, inflight=100), 8, "BURST"),  # ceil(25) -> max 8
    ("at-max-stays-stable", SPEC, snap(ready=8, inflight=100), 8, "STABLE"),  # nothing above 8 to go to
    ("need-fits-stable", SPEC, snap(ready=2, inflight=8), 2, "STABLE"),  # 8 / 4 = 2
    # fresh state: no delay window seen yet
    ("lower-need-holds", SPEC, snap(ready=4, inflight=4), 4, "HOLD"),  # 4 / 4 = 1 < 4
    # NO_DATA: ready replicas, some without a duty sample, nothing to serve
    ("no-data-no-duty-yet", SPEC, snap(ready=2, duty=()), 2, "NO_DATA"),
    ("no-data-one-of-two-sampled", SPEC, snap(ready=2, duty=(0.0,)), 2, "NO_DATA"),
    ("no-duty-but-demand-is-data", SPEC, snap(ready=2, held=1, duty=()), 2, "HOLD"),  # 1/4 = 0.25 -> 1 < 2
    ("sampled-idle-is-stable", SPEC, snap(ready=1, duty=(0.0,)), 1, "STABLE"),  # never below 1 while up
]


@pytest.mark.parametrize("spec,snapshot,desired,reason", [c[1:] for c in ONE_STEP_CASES],
                         ids=[c[0] for c in ONE_STEP_CASES])
def test_one_decision(spec, snapshot, desired, reason):
    decision, _ = decide(snapshot, spec, PolicyState(), 0.0, CFG)
    assert (decision.desired, decision.reason) == (desired, reason), decision


def test_starting_replicas_are_not_started_twice():
    # 9 held at zero: 3 start (ceil(9 / 4 = 2.25)); while they start (none ready) the same 9 held
    # are a concurrency need of 2.25: the COLD_START hold keeps 3 and starts no more
    out, _ = run(lambda t: {"held": 9} if t == 0 else {"starting": 3, "held": 9}, 5)
    assert [(d.desired, d.reason) for _, d in out] == [(3, "COLD_START")] * 6
    assert out[-1][1].detail == "3 starting for 9 held"


def test_a_growing_backlog_is_held_through_the_cold_start():
    # one replica starting, 100, 200, ... 500 held (need 25 .. 125 from concurrency): it stays 1
    out, _ = run(lambda t: {"starting": 1, "held": 100 * (t + 1)}, 4, ScalingSpec(max_replicas=20))
    assert [(d.desired, d.reason) for _, d in out] == [(1, "COLD_START")] * 5


# ---------------------------------------------------------------------- burst window


def test_a_one_tick_spike_raises_for_the_burst_window_only():
    # 2 replicas stay 2 (say the cluster is full); need 8/4 = 2, a spike of 40/4 = 10 at t=10.
    # The burst window keeps 10 while t - 10 <= 6 s: t = 10..16, then the need is 2 again.
    out, _ = run(lambda t: {"ready": 2, "inflight": 40 if t == 10 else 8}, 20, ScalingSpec(max_replicas=20), NO_TREND)
    assert changes(out) == [(0, 2, "STABLE"), (10, 10, "BURST"), (17, 2, "STABLE")]


def test_a_spike_does_not_scale_down_before_the_delay():
    # replicas follow: 2, the spike takes them to 10 at t=10, the need is 2 again from t=11.
    # The 30 s window still holds the 10 until t=40 (10 > 40 - 30 - eps): 10 stays;
    # at t=41 it has left the window: max(ceil(2), ceil(10 / 2) = 5) = 5.
    out = follow(lambda t, ready: {"inflight": 40 if t == 10 else 8}, 41, ScalingSpec(max_replicas=20),
                 COVERS_NO_TREND, ready=2)
    assert changes(out) == [(0, 2, "STABLE"), (10, 10, "BURST"), (11, 10, "STABLE"), (41, 5, "STABLE")]


def test_a_spike_is_not_a_trend_with_the_defaults():
    # the same spike with the forecast on: needs 2, 2, 10 over the last three looks did not
    # rise at each look (2 < 2 is false), so no trend: the burst window alone gives 10
    out, _ = run(lambda t: {"ready": 2, "inflight": 40 if t == 10 else 8}, 10, ScalingSpec(max_replicas=20), INSTANT)
    assert (out[10][1].desired, out[10][1].reason) == (10, "BURST")


# ---------------------------------------------------------------------- scale down

SCALE_DOWN_CASES = [
    # id, spec, ready (held), inflight at t (need = inflight / 4), at t, expected desired, reason
    # default inflight 4 -> need 1; the window at t=30 is (0 - eps, 30]
    ("hold-at-29s", SPEC, 8, {}, 29, 8, "HOLD"),  # 29 s seen < 30
    ("8-to-4-even-if-need-1", SPEC, 8, {}, 30, 4, "STABLE"),  # max(ceil(1) = 1, ceil(8 / 2) = 4)
    ("5-to-3", SPEC, 5, {}, 30, 3, "STABLE"),  # max(1, ceil(5 / 2 = 2.5) = 3)
    ("3-to-2", SPEC, 3, {}, 30, 2, "STABLE"),  # max(1, ceil(1.5) = 2)
    ("2-to-1", SPEC, 2, {}, 30, 1, "STABLE"),  # max(1, ceil(1) = 1)
    ("4-to-window-max-2.4", SPEC, 4, {5: 9.6}, 30, 3, "STABLE"),  # max(ceil(9.6 / 4 = 2.4) = 3, 2)
    ("peak-at-window-start-counts", SPEC, 4, {0: 16}, 30, 4, "STABLE"),  # 16 / 4 = 4 at t=0: 0 > 30 - 30 - eps
    ("peak-just-left-the-window", SPEC, 4, {0: 16}, 31, 2, "STABLE"),  # t=0 out at 31: max(1, ceil(4 / 2))
    ("never-below-1-while-up", SPEC, 1, {t: 1 for t in range(31)}, 30, 1, "STABLE"),  # ceil(0.25) = 1
    ("idle-never-below-1", SPEC, 2, {t: 0 for t in range(31)}, 30, 1, "STABLE"),  # max(1, 0, ceil(1))
    ("min-replicas-floor", ScalingSpec(min_replicas=3), 4, {}, 30, 3, "STABLE"),  # max(3, 1, ceil(2))
    ("min-replicas-with-halving", ScalingSpec(min_replicas=3), 8, {}, 30, 4, "STABLE"),  # max(3, ceil(4))
]


@pytest.mark.parametrize("spec,ready,peaks,at,desired,reason", [c[1:] for c in SCALE_DOWN_CASES],
                         ids=[c[0] for c in SCALE_DOWN_CASES])
def test_scale_down(spec, ready, peaks, at, desired, reason):
    out, _ = run(lambda t: {"ready": ready, "inflight": peaks.get(t, 4)}, at, spec, COVERS)
    decision = out[-1][1]
    assert (decision.desired, decision.reason) == (desired, reason), decision


def test_scale_down_halves_per_decision():
    # 8 replicas, need 4 / 4 = 1 throughout; replicas follow. HOLD through t=29, then at most
    # half per decision: 8 -> 4 (t=30) -> 2 (t=31) -> 1 (t=32), never below 1
    out = follow(lambda t, ready: {"inflight": 4}, 40, SPEC, COVERS, ready=8)
    assert changes(out) == [(0, 8, "HOLD"), (30, 4, "STABLE"), (31, 2, "STABLE"), (32, 1, "STABLE")]


def test_scale_down_happens_with_the_default_config():
    out, _ = run(lambda t: {"ready": 8, "inflight": 4}, 31, SPEC, CFG)
    assert out[29][1].reason == "HOLD"
    # a whole 30 s window of need 1 seen by t=30 (or by the next tick): 8 -> ceil(8 / 2) = 4
    assert min(d.desired for _, d in out[30:]) == 4


# ---------------------------------------------------------------------- to zero

MEETS = ScalingSpec(slo_p95_ms=5000.0)  # the default 2 s cold start within the SLO
TO_ZERO_CASES = [
    # id, spec, load(t) (1 ready replica throughout), at t, expected desired, reason
    # the first look counts as activity (t=0); idle_to_zero_s 60
    ("idle-59s-of-60-stays", SPEC, lambda t: {}, 59, 1, "STABLE"),
    ("idle-60s-goes", SPEC, lambda t: {}, 60, 0, "TO_ZERO"),
    ("in-flight-at-30-restarts-the-clock", SPEC, lambda t: {"inflight": 1 if t == 30 else 0}, 89, 1, "STABLE"),
    # a cold start within the SLO costs no miss: idle_to_zero_s after the last activity, 30 + 60
    ("in-flight-at-30-zero-at-90", MEETS, lambda t: {"inflight": 1 if t == 30 else 0}, 90, 0, "TO_ZERO"),
    ("held-at-30-zero-at-90", MEETS, lambda t: {"held": 1 if t == 30 else 0}, 90, 0, "TO_ZERO"),
    # one that misses it (2 s against 100 ms) is priced: 1 miss x 240 slice-s / slice 1 = 240 s of
    # idle, so kept to 30 + 240 = 270 (keep_alive_s)
    ("in-flight-at-30-kept-for-its-cold-start", SPEC, lambda t: {"inflight": 1 if t == 30 else 0}, 269, 1, "STABLE"),
    ("in-flight-at-30-priced-zero-at-270", SPEC, lambda t: {"inflight": 1 if t == 30 else 0}, 270, 0, "TO_ZERO"),
    ("held-at-30-kept-for-its-cold-start", SPEC, lambda t: {"held": 1 if t == 30 else 0}, 269, 1, "STABLE"),
    ("held-at-30-priced-zero-at-270", SPEC, lambda t: {"held": 1 if t == 30 else 0}, 270, 0, "TO_ZERO"),
    ("rps-counts-as-activity", SPEC, lambda t: {"rps": 0.5 if t == 30 else 0.0}, 89, 1, "STABLE"),
    ("held-all-along-never", SPEC, lambda t: {"held": 1}, 120, 1, "STABLE"),  # ceil(1 / 4) = 1
    ("in-flight-all-along-never", SPEC, lambda t: {"inflight": 1}, 120, 1, "STABLE"),
    ("min-replicas-1-never", ScalingSpec(min_replicas=1), lambda t: {}, 120, 1, "STABLE"),
    ("idle-to-zero-10s", ScalingSpec(idle_to_zero_s=10), lambda t: {}, 10, 0, "TO_ZERO"),
    ("idle-to-zero-0s-goes-at-once", ScalingSpec(idle_to_zero_s=0), lambda t: {}, 0, 0, "TO_ZERO"),
]


@pytest.mark.parametrize("spec,load,at,desired,reason", [c[1:] for c in TO_ZERO_CASES],
                         ids=[c[0] for c in TO_ZERO_CASES])
def test_to_zero(spec, load, at, desired, reason):
    out, _ = run(lambda t: {"ready": 1, **load(t)}, at, spec, CFG)
    decision = out[-1][1]
    assert (decision.desired, decision.reason) == (desired, reason), decision


def test_idle_replicas_go_to_zero_in_one_step():
    # 3 idle replicas, idle_to_zero_s 20 (< the 30 s delay): HOLD (need 0 -> 1 < 3) through
    # t=19, then straight to 0 at t=20 (TO_ZERO does not halve)
    out, _ = run(lambda t: {"ready": 3}, 20, ScalingSpec(idle_to_zero_s=20), CFG)
    assert changes(out) == [(0, 3, "HOLD"), (20, 0, "TO_ZERO")]


def test_idle_replicas_shrink_then_go_to_zero():
    # 3 idle replicas following the decisions: the 30 s delay halves them (3 -> 2 -> 1), 60 s idle -> 0
    out = follow(lambda t, ready: {}, 60, SPEC, COVERS, ready=3)
    assert changes(out) == [(0, 3, "HOLD"), (30, 2, "STABLE"), (31, 1, "STABLE"), (60, 0, "TO_ZERO")]


def test_a_held_request_at_idle_time_keeps_the_replica():
    # idle since t=0, a request held at the gateway at exactly t=60: not TO_ZERO
    state = PolicyState(last_active_at=0.0)
    decision, _ = decide(snap(ready=1, held=1, at=60.0), SPEC, state, 60.0, CFG)
    assert decision.desired == 1 and decision.reason != "TO_ZERO"


# ---------------------------------------------------------------------- forecast: trend

TREND_NEED_CASES = [
    # id, needs ((t, n), ...), now, lead, expected
    ("docstring-2-3-4-lead-2", ((0, 2), (1, 3), (2, 4)), 2, 2.0, 6.0),  # min(4 + 1 x 2, 4 x 1.5)
    ("lead-1-under-the-cap", ((0, 2), (1, 3), (2, 4)), 2, 1.0, 5.0),  # min(4 + 1, 6)
    ("capped-at-1.5x", ((0, 2), (1, 3), (2, 4)), 2, 10.0, 6.0),  # min(4 + 10, 6)
    ("falling-is-zero", ((0, 4), (1, 3), (2, 2)), 2, 2.0, 0.0),
    ("flat-is-zero", ((0, 3), (1, 3), (2, 3)), 2, 2.0, 0.0),
    ("two-points-are-zero", ((1, 3), (2, 4)), 2, 2.0, 0.0),
    ("latest-zero-is-zero", ((0, 0), (1, 1), (2, 0)), 2, 2.0, 0.0),  # slope 0 and latest 0
    # only t > 42 - 30 - eps counts: 1, 2, 3 at 40..42, slope 1 -> min(3 + 2, 4.5)
    ("old-points-left-out", ((0, 10), (40, 1), (41, 2), (42, 3)), 42, 2.0, 4.5),
]


@pytest.mark.parametrize("needs,now,lead,expected", [c[1:] for c in TREND_NEED_CASES],
                         ids=[c[0] for c in TREND_NEED_CASES])
def test_trend_need(needs, now, lead, expected):
    state = PolicyState(needs=tuple(NeedAt(float(t), float(n)) for t, n in needs))
    assert trend_need(state, float(now), lead, CFG) == pytest.approx(expected)


def test_a_rising_need_scales_up_ahead_with_forecast():
    # need t + 1 (inflight 4 (t + 1), target 4), cold start 2 s: the trend looks 2 + 1 = 3 s ahead
    out = follow(lambda t, ready: {"inflight": 4 * (t + 1), "held": 0}, 5, ScalingSpec(max_replicas=20), INSTANT)
    assert [(t, d.desired, d.reason) for t, d in out] == [
        (0, 1, "COLD_START"),  # ceil(4 / 4) = 1
        (1, 2, "BURST"),  # 2 points: no trend yet; ceil(2) = 2
        (2, 5, "FORECAST"),  # slope 1: min(3 + 1 x 3, 3 x 1.5 = 4.5) -> 5 > need 3
        (3, 6, "FORECAST"),  # min(4 + 3, 4 x 1.5 = 6) = 6 > need 4
        (4, 8, "FORECAST"),  # min(5 + 3, 7.5) = 7.5 -> 8 > need 5
        (5, 9, "FORECAST"),  # min(6 + 3, 9) = 9 > need 6
    ]


def test_flat_load_gives_no_forecast():
    # need 12 / 4 = 3 on 3 replicas for 40 s: slope 0, no FORECAST ever
    out, _ = run(lambda t: {"ready": 3, "inflight": 12}, 40)
    assert {(d.desired, d.reason) for _, d in out} == {(3, "STABLE")}


TREND_NEVER_LOWERS_CASES = [
    # id, inflight per tick (4 ready throughout; need = inflight / 4)
    ("rising", [4 * (t + 1) for t in range(12)]),
    ("falling", [48 - 4 * t for t in range(12)]),
    ("zigzag", [4, 16, 8, 24, 4, 32, 0, 12, 40, 8, 20, 4]),
    ("spike-then-flat", [8] * 5 + [60] + [8] * 6),
]


@pytest.mark.parametrize("inflight", [c[1] for c in TREND_NEVER_LOWERS_CASES],
                         ids=[c[0] for c in TREND_NEVER_LOWERS_CASES])
def test_the_trend_never_lowers_a_decision(inflight):
    spec = ScalingSpec(max_replicas=40)
    load = lambda t: {"ready": 4, "inflight": inflight[t]}  # noqa: E731
    with_trend, _ = run(load, len(inflight) - 1, spec, INSTANT)  # the same in-flight reading as NO_TREND
    without, _ = run(load, len(inflight) - 1, spec, NO_TREND)
    for (t, a), (_, b) in zip(with_trend, without):
        assert a.desired >= b.desired, (t, a, b)


# ---------------------------------------------------------------------- forecast: periodic

NEXT_ONSET_CASES = [
    # id, onsets, expected
    ("docstring-0-300-601-900", (0, 300, 601, 900), 1200.0),  # gaps 300, 301, 299: mean 300, CV 0.003
    ("three-regular", (0, 300, 600), 900.0),  # 600 + 300
    ("cv-0.09-is-regular", (0, 100, 220), 330.0),  # gaps 100, 120: mean 110, sd 10, CV 0.091 <= 0.1
    ("cv-0.11-is-not", (0, 100, 225), None),  # gaps 100, 125: mean 112.5, sd 12.5, CV 0.111 > 0.1
    ("irregular", (0, 100, 400, 500), None),  # gaps 100, 300, 100: CV 0.57
    ("two-onsets", (0, 300), None),
    ("no-onsets", (), None),
    ("same-instant", (5, 5, 5), None),  # mean gap 0
]


@pytest.mark.parametrize("onsets,expected", [c[1:] for c in NEXT_ONSET_CASES], ids=[c[0] for c in NEXT_ONSET_CASES])
def test_next_onset(onsets, expected):
    got = next_onset(PolicyState(onsets=tuple(float(o) for o in onsets)), CFG)
    assert got == (None if expected is None else pytest.approx(expected))


def test_onsets_are_traffic_after_20s_of_silence():
    # traffic at t=0 (the first look, busy: an onset), 19 (19 s later: no), 40 (21 s: yes)
    out, state = run(lambda t: {"ready": 1, "inflight": 1 if t in (0, 19, 40) else 0}, 45)
    assert state.onsets == (0.0, 40.0)


PERIODIC_CASES = [
    # id, measured cold start, when the pre-warm starts (onset 1200 - cold start - margin 3)
    ("cold-start-2s", 2.0, 1195),  # 1200 - 2 - 3
    ("cold-start-10s", 10.0, 1187),  # 1200 - 10 - 3
]


@pytest.mark.parametrize("cold,prewarm_at", [c[1:] for c in PERIODIC_CASES], ids=[c[0] for c in PERIODIC_CASES])
def test_a_timer_is_prewarmed_and_let_go_early(cold, prewarm_at):
    # one request (held at the gateway) every 300 s, t = 0..1500; replicas follow.
    # t=0 is the first look, busy: an onset; onsets 0, 300, 600 make a period of 300 -> next 900.
    # Until then the keep-alive prices the cold start (over the 100 ms SLO): 1 miss x 240 slice-s
    # / slice 1 = 240 s of idle
    out = follow(lambda t, ready: {"held": 1 if t % 300 == 0 else 0, "cold": cold}, 1500)
    assert changes(out) == [
        (0, 1, "COLD_START"), (1, 1, "STABLE"), (240, 0, "TO_ZERO"),  # onsets (0): idle 240 s
        (300, 1, "COLD_START"), (301, 1, "STABLE"), (540, 0, "TO_ZERO"),  # onsets (0, 300): idle 240 s
        (600, 1, "COLD_START"), (601, 1, "STABLE"),
        (610, 0, "TO_ZERO"),  # periodic from the third onset: 600 + periodic_keep_s 10
        (prewarm_at - 300, 1, "FORECAST"),  # warm before 900
        (900, 1, "STABLE"),  # the request finds a warm replica: no COLD_START
        (910, 0, "TO_ZERO"),  # 900 + 10
        (prewarm_at, 1, "FORECAST"), (1200, 1, "STABLE"), (1210, 0, "TO_ZERO"),
        (prewarm_at + 300, 1, "FORECAST"), (1500, 1, "STABLE"),
    ]


def test_prewarm_lets_go_when_the_onset_does_not_come():
    # onsets 300, 600, 900 (next 1200), last active 900, one replica warmed for 1200; nothing comes.
    # The pre-warm window ends at 1200 + margin 3 = 1203: idle 1204 - 900 >= 10 -> zero at 1204
    state = PolicyState(last_active_at=900.0, onsets=(300.0, 600.0, 900.0))
    out, _ = run(lambda t: {"ready": 1}, 1210, state=state, start=1195)
    assert changes(out) == [(1195, 1, "FORECAST"), (1204, 0, "TO_ZERO")]


def test_prewarm_does_not_scale_warm_replicas_down():
    # 3 replicas, nothing in flight, idle 895 - 890 = 5 s (< periodic_keep_s 10); onsets 0, 300, 600
    # -> next 900, pre-warm window from 900 - 2 - 3 = 895. No delay window seen yet: HOLD 3
    # (and even after one, at most ceil(3 / 2) = 2)
    state = PolicyState(last_active_at=890.0, onsets=(0.0, 300.0, 600.0))
    assert next_onset(state, CFG) == 900.0
    decision, _ = decide(snap(ready=3, at=895.0), SPEC, state, 895.0, CFG)
    assert decision.desired == 3, decision


# ---------------------------------------------------------------------- slice hints

HOT = {"ready": 2, "inflight": 8, "duty": (0.9, 0.9), "slice_": 0.25}  # duty 0.9 >= 0.85
COLD = {"ready": 1, "duty": (0.05,), "rps": 1.0, "p95": 0.030, "slice_": 0.25}  # duty 0.05 <= 0.15
CAPPED = ScalingSpec(max_replicas=2)  # hot but no room to grow: otherwise STABLE

SLICE_CASES = [
    # id, spec, config, load (constant), expected slice hint at t=300, expected reason
    # EWMA of a constant duty is that duty; age 300 - 0 >= slice_window_s 300
    ("hot-quarter-to-half", CAPPED, CFG, HOT, 0.5, "SLICE"),  # 0.25 x 2
    ("hot-half-to-whole", CAPPED, CFG, {**HOT, "slice_": 0.5}, 1.0, "SLICE"),  # 0.5 x 2 = 1 <= 1
    ("hot-whole-no-bigger", CAPPED, CFG, {**HOT, "slice_": 1.0}, None, "STABLE"),  # 2 > max_slice 1
    ("hot-0.75-no-bigger", CAPPED, CFG, {**HOT, "slice_": 0.75}, None, "STABLE"),  # 1.5 > 1: no clamping
    ("hot-above-config-max", CAPPED, PolicyConfig(max_slice=0.5), {**HOT, "slice_": 0.5}, None, "STABLE"),
    # ceil(1.8 / 0.7 = 2.57) = 3 > 2 with room for 8: more replicas, not bigger ones (only a
    # count at max_replicas asks for a bigger slice)
    ("hot-with-room-scales-out", SPEC, CFG, HOT, None, "BURST"),
    ("hot-0.84-is-not-hot", CAPPED, CFG, {**HOT, "duty": (0.84, 0.84)}, None, "STABLE"),
    # lone idle replica, p95 30 ms x 2 = 60 <= 80 ms target
    ("cold-quarter-to-eighth", SPEC, CFG, COLD, 0.125, "SLICE"),  # 0.25 / 2
    ("cold-eighth-no-smaller", SPEC, CFG, {**COLD, "slice_": 0.125}, None, "STABLE"),  # 0.0625 < 0.125
    ("cold-above-config-min", SPEC, PolicyConfig(min_slice=0.25), COLD, None, "STABLE"),  # 0.125 < 0.25
    ("cold-p95-too-close", SPEC, CFG, {**COLD, "p95": 0.050}, None, "STABLE"),  # 50 x 2 = 100 > 80
    ("cold-p95-exactly-half", SPEC, CFG, {**COLD, "p95": 0.040}, 0.125, "SLICE"),  # 40 x 2 = 80 <= 80
    ("cold-p95-unknown", SPEC, CFG, {**COLD, "p95": None}, None, "STABLE"),
    # 3 in flight / target 4 = a need of 0.75 replica, steady (no rise): half the slice could not carry it
    ("cold-but-a-need-over-half", SPEC, CFG, {**COLD, "inflight": 3.0}, None, "STABLE"),
    ("cold-but-two-replicas", ScalingSpec(min_replicas=2), CFG, {**COLD, "ready": 2, "duty": (0.05, 0.05)},
     None, "STABLE"),  # only a lone replica shrinks; min 2 keeps it STABLE
    # the batch budget is 40 ms (SLO 100 x 80 % x 1/2). 10 ms at 1, 40 ms at 8: 8 rows in 40 ms,
    # 200/s; at half speed 20 ms and 80 ms: 1 + (40 - 20) / (80 - 20) x 7 = 3.33 -> 3 rows in
    # 37.1 ms, 80.8/s, under 200 / 2 = 100: half the slice would cost more per request
    ("cold-but-half-costs-more", SPEC, CFG, {**COLD, "batch": ((1, .010), (8, .040))}, None, "STABLE"),
    # 4 ms at 1, 6 ms at 8: 8 rows in 6 ms and, at half speed, in 12 ms: 1,333/s and 667/s
    ("cold-half-serves-as-much", SPEC, CFG, {**COLD, "batch": ((1, .004), (8, .006))}, 0.125, "SLICE"),
    # 20 ms at 1, 30 ms at 2: 2 rows in 30 ms (66.7/s); half: 40 ms at 1 (25/s), under 33.3
    ("cold-but-half-loses-the-batch", SPEC, CFG, {**COLD, "batch": ((1, .020), (2, .030))}, None, "STABLE"),
    ("middling-duty", CAPPED, CFG, {**HOT, "duty": (0.5, 0.5)}, None, "STABLE"),
    ("no-slice-in-snapshot", CAPPED, CFG, {**HOT, "slice_": None}, None, "STABLE"),
]


@pytest.mark.parametrize("spec,config,load,hint,reason", [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_slice_hint_after_a_window(spec, config, load, hint, reason):
    out, state = run(lambda t: load, 300, spec, config)
    assert all(d.slice_fraction is None for _, d in out[:-1]), "a hint before a whole window of evidence"
    decision = out[-1][1]
    assert decision.slice_fraction == hint and decision.reason == reason, decision
    if hint is not None:
        assert state.slice_fraction == hint and state.slice_at == 300.0 and state.duty_avg is None


WHISPERY = ScalingSpec(slo_p95_ms=500.0)  # p95 target 400 ms; a request alone may take 200 ms
MEASURED = PolicyState(service_max=0.030, service_on=0.5)  # 30 ms a request measured on 1/2

START_SLICE_CASES = [
    # id, spec, config, state, snapshot at zero (kwargs), expected slice of the start
    ("one-waiting-to-eighth", WHISPERY, CFG, MEASURED, {"held": 1, "slice_": 0.5}, 0.125),  # 120 ms <= 200
    # three run one by one: 3 x 60 = 180 ms on 1/4, 3 x 120 = 360 on 1/8
    ("three-waiting-to-quarter", WHISPERY, CFG, MEASURED, {"held": 3, "slice_": 0.5}, 0.25),
    ("seven-waiting-keep-half", WHISPERY, CFG, MEASURED, {"held": 7, "slice_": 0.5}, None),  # 7 x 60 > 200
    # one waiting, but its past cold starts held 3 on average: sized for 3
    ("past-backlog-counts", WHISPERY, CFG, MEASURED._replace(cold_misses=3.0), {"held": 1, "slice_": 0.5}, 0.25),
    # measured on 1/2, now on 1/4 (its first look: deployed there): 60 ms there, 120 on 1/8
    ("measured-on-another-slice", WHISPERY, CFG, MEASURED, {"held": 1, "slice_": 0.25}, 0.125),
    ("measured-on-another-slice-two-waiting", WHISPERY, CFG, MEASURED, {"held": 2, "slice_": 0.25}, None),  # 240 ms
    # deployed on 1/2, on 1/8 since a start that shrank it: three waiting grow it back to 1/4
    ("grows-back-at-a-start", WHISPERY, CFG, MEASURED._replace(slice_fraction=0.125),
     {"held": 3, "slice_": 0.125, "deployed": 0.5}, 0.25),
    # a fresh state (a controller started again, a new revision's hold) grows back all the same
    ("grows-back-from-a-fresh-state", WHISPERY, CFG, PolicyState(service_max=0.120, service_on=0.125),
     {"held": 3, "slice_": 0.125, "deployed": 0.5}, 0.25),
    ("many-waiting-stay-on-deployed", WHISPERY, CFG, MEASURED, {"held": 20, "slice_": 0.5, "deployed": 0.5}, None),
    # twenty waiting on 1/8 would want more than 1/2, but a start asks for no more than 1/4 declared
    ("no-bigger-than-deployed", WHISPERY, CFG, MEASURED._replace(slice_fraction=0.125),
     {"held": 20, "slice_": 0.125, "deployed": 0.25}, 0.25),
    # a floor's restart (min_replicas 1, at zero after a failure) is no start from zero for traffic
    ("min-replicas-restart", ScalingSpec(slo_p95_ms=500.0, min_replicas=1), CFG, MEASURED, {"slice_": 0.5}, None),
    ("already-at-min-slice", WHISPERY, CFG, MEASURED, {"held": 1, "slice_": 0.125}, None),
    ("min-slice-quarter", WHISPERY, PolicyConfig(min_slice=0.25), MEASURED, {"held": 1, "slice_": 0.5}, 0.25),
    ("nothing-measured", WHISPERY, CFG, PolicyState(), {"held": 1, "slice_": 0.5}, None),
    ("hints-off", WHISPERY, PolicyConfig(slice_hints=False), MEASURED, {"held": 1, "slice_": 0.5}, None),
    ("no-slice-known", WHISPERY, CFG, MEASURED, {"held": 1}, None),
    # SLO 100 ms (target 80, half 40): 30 ms on 1/2 would be 60 on 1/4
    ("too-slow-for-the-slo", SPEC, CFG, MEASURED, {"held": 1, "slice_": 0.5}, None),
    # the batch table's first size counts before the measured service (30 ms): 60 ms at 1 on 1/2
    # -> 120 on 1/4, 240 on 1/8 (and 8 rows in 100 ms, 200 on 1/4: half the rate at half the slice)
    ("table-first-size", WHISPERY, CFG, MEASURED, {"held": 1, "slice_": 0.5, "batch": ((1, .060), (8, .100))}, 0.25),
    # the code profile (40 ms at 1, 120 at 8; SLO 200: target 160, half 80, batch budget 80 ms):
    # alone on 1/8 80 ms fits, but half the slice serves 12.5/s where the whole serves 53.8/s
    ("half-costs-more-under-load", ScalingSpec(slo_p95_ms=200.0), CFG, MEASURED,
     {"held": 1, "slice_": 0.25, "batch": ((1, .040), (8, .120))}, None),
]


@pytest.mark.parametrize("spec,config,state,load,hint", [c[1:] for c in START_SLICE_CASES],
                         ids=[c[0] for c in START_SLICE_CASES])
def test_a_start_from_zero_takes_the_least_slice_that_serves_it(spec, config, state, load, hint):
    decision, after = decide(snap(**load, at=100.0), spec, state, 100.0, config)
    assert decision.reason == ("COLD_START" if load.get("held") else "STABLE") and decision.desired >= 1
    assert decision.slice_fraction == hint, decision
    if hint is not None:
        assert after.slice_fraction == hint and after.slice_at == 100.0 and f"starts on a {hint:g} slice" in decision.detail


def test_a_pre_warm_starts_on_the_least_slice_too_and_nothing_starts_small_without_a_start():
    # a timer every 60 s (onsets at 0, 60, 120, 180): a pre-warm is due from 240 - 2 - 3 = 235
    state = MEASURED._replace(onsets=(0.0, 60.0, 120.0, 180.0), last_active_at=181.0)
    decision, _ = decide(snap(slice_=0.5, at=236.0), WHISPERY, state, 236.0)
    assert decision.reason == "FORECAST" and decision.slice_fraction == 0.125, decision
    idle, _ = decide(snap(slice_=0.5, at=200.0), WHISPERY, state, 200.0)  # at zero, staying there
    assert idle.desired == 0 and idle.slice_fraction is None


# a lone replica kept idle past idle_to_zero_s (60 s) by a priced cold start (1,000 s of idle;
# few gaps known, so at most 30 x 60 = 1,800 s: kept 1,000 s) moves to the least slice a start
# from zero would get
KEPT = MEASURED._replace(last_active_at=40.0, cold_cost_s=1000.0)

IDLE_SHRINK_CASES = [
    # id, config, state, snapshot (kwargs), expected slice asked
    ("kept-idle-to-eighth", CFG, KEPT, {"ready": 1, "slice_": 0.5, "at": 100.0}, 0.125),  # 120 ms <= 200
    ("not-idle-long-enough", CFG, KEPT, {"ready": 1, "slice_": 0.5, "at": 99.0}, None),  # idle 59 s
    # its past cold starts held 3: sized for 3, as a start is (3 x 60 = 180 ms on 1/4)
    ("past-backlog-counts", CFG, KEPT._replace(cold_misses=3.0), {"ready": 1, "slice_": 0.5, "at": 100.0}, 0.25),
    ("two-replicas", CFG, KEPT, {"ready": 2, "slice_": 0.5, "at": 100.0}, None),
    ("already-at-min-slice", CFG, KEPT, {"ready": 1, "slice_": 0.125, "at": 100.0}, None),
    ("off", PolicyConfig(idle_shrink=False), KEPT, {"ready": 1, "slice_": 0.5, "at": 100.0}, None),
    ("hints-off", PolicyConfig(slice_hints=False), KEPT, {"ready": 1, "slice_": 0.5, "at": 100.0}, None),
    ("nothing-measured", CFG, PolicyState(last_active_at=40.0, cold_cost_s=1000.0),
     {"ready": 1, "slice_": 0.5, "at": 100.0}, None),
    # a cold start priced at 62 s keeps it 62 s: 2 s left, not worth a 2 s start on 1/8 beside
    # the 1/2 (0.375 x (2 - 2) = 0 <= 0.125 x 2)
    ("keep-alive-nearly-over", CFG, KEPT._replace(cold_cost_s=62.0), {"ready": 1, "slice_": 0.5, "at": 100.0}, None),
    # kept 220 s from its last request at 40, to 260: 160 s left at 100, 0.375 x 158 > 0.125 x 2
    ("keep-alive-long-enough", CFG, KEPT._replace(cold_cost_s=220.0), {"ready": 1, "slice_": 0.5, "at": 100.0}, 0.125),
]


@pytest.mark.parametrize("config,state,load,hint", [c[1:] for c in IDLE_SHRINK_CASES],
                         ids=[c[0] for c in IDLE_SHRINK_CASES])
def test_a_lone_replica_kept_idle_moves_to_the_least_slice_a_start_would_get(config, state, load, hint):
    decision, after = decide(snap(**load), WHISPERY, state, load["at"], config)
    assert decision.desired == load["ready"], decision  # kept, neither scaled nor sent to zero
    assert decision.slice_fraction == hint, decision
    if hint is not None:
        assert decision.reason == "SLICE" and f"kept on a {hint:g} slice" in decision.detail
        assert after.slice_fraction == hint and after.slice_at == load["at"]


def test_the_idle_shrink_leaves_a_floor_a_start_and_a_moved_replica_alone():
    floor = ScalingSpec(slo_p95_ms=500.0, min_replicas=1)  # held by min_replicas, not the keep-alive
    decision, _ = decide(snap(ready=1, slice_=0.5, at=100.0), floor, KEPT, 100.0)
    assert decision.desired == 1 and decision.slice_fraction is None, decision
    starting, _ = decide(snap(ready=1, starting=1, slice_=0.5, at=100.0), WHISPERY, KEPT, 100.0)
    assert starting.slice_fraction is None, starting
    # the look after the move: on the least slice now, nothing more to ask
    moved, after = decide(snap(ready=1, slice_=0.5, at=100.0), WHISPERY, KEPT, 100.0)
    assert moved.slice_fraction == 0.125
    again, _ = decide(snap(ready=1, slice_=0.125, at=101.0), WHISPERY, after, 101.0)
    assert again.desired == 1 and again.slice_fraction is None and again.reason == "STABLE", again


def test_an_idle_replica_not_kept_goes_to_zero_on_its_slice():
    # no cold start priced: the keep-alive is the spec's 60 s, so at 60 s idle it goes, unmoved
    decision, _ = decide(snap(ready=1, slice_=0.5, at=100.0), WHISPERY, KEPT._replace(cold_cost_s=None), 100.0)
    assert (decision.desired, decision.reason, decision.slice_fraction) == (0, "TO_ZERO", None)


def test_quiet_until_wakes_a_lone_idle_replica_for_its_shrink():
    # kept until 40 + 1,000 = 1,040; on 1/2 it is looked at when idle_to_zero_s has passed (100),
    # on the least slice already it sleeps to the keep-alive's end
    assert quiet_until(KEPT._replace(slice_fraction=0.5), WHISPERY, 1, 50.0, 2.0) == 100.0
    assert quiet_until(KEPT._replace(slice_fraction=0.125), WHISPERY, 1, 50.0, 2.0) == 1040.0
    assert quiet_until(KEPT._replace(slice_fraction=0.5), WHISPERY, 1, 50.0, 2.0, PolicyConfig(idle_shrink=False)) == 1040.0
    # past the shrink's look it sleeps to the keep-alive's end (a shrink that could not be made)
    assert quiet_until(KEPT._replace(slice_fraction=0.5), WHISPERY, 1, 100.0, 2.0) == 1040.0


SERVICE_CASES = [
    # id, (service_max, service_on) before, snapshot (service, slice), expected after
    ("first", (None, None), (0.030, 0.5), (0.030, 0.5)),
    ("longer-kept", (0.030, 0.5), (0.020, 0.5), (0.030, 0.5)),
    ("longer-replaces", (0.030, 0.5), (0.040, 0.5), (0.040, 0.5)),
    ("carried-to-a-new-slice", (0.030, 0.5), (0.050, 0.25), (0.060, 0.25)),  # the docstring's example
    ("none-measured", (0.030, 0.5), (None, 0.25), (0.030, 0.5)),
    ("no-slice", (0.030, 0.5), (0.040, None), (0.030, 0.5)),
]


@pytest.mark.parametrize("before,now,after", [c[1:] for c in SERVICE_CASES], ids=[c[0] for c in SERVICE_CASES])
def test_the_longest_service_a_look_measured_is_kept_at_the_slice_it_ran_on(before, now, after):
    state = PolicyState(service_max=before[0], service_on=before[1])
    _, out = decide(snap(ready=1, rps=1.0, service=now[0], slice_=now[1]), SPEC, state, 0.0)
    assert out.service_max == pytest.approx(after[0]) and out.service_on == after[1]


def test_a_lone_replica_does_not_shrink_while_a_recent_need_would_not_fit_half_of_it():
    # cold as in "cold-quarter-to-eighth", but one look at t = 290 reads duty 0.9: a need of
    # 0.9 / 0.9 = 1.0 replica (p95 30 ms is under half its 80 ms target: duty target 0.9),
    # which one replica of half the slice could not carry. It rose from 0.05 / 0.9 = 0.056: a
    # rise of 0.944, seen once (no reserve), which decays to half a replica at
    # 290 + 600 ln(0.944 / 0.5) = 671.6: the hint comes at the look after, 672
    out, state = run(lambda t: {**COLD, "duty": (0.9,)} if t == 290 else COLD, 680)
    assert state.rise == pytest.approx(1.0 - 0.05 / 0.9) and state.rise_at == 290.0
    assert [(t, d.slice_fraction) for t, d in out if d.slice_fraction is not None] == [(672, 0.125)]


RISE_READ_CASES = [
    # id, rise_lag_windows, the look where the rise peaks, the share of the step it reads
    # in flight steps 0 -> 8 at t = 10 (a need of 8 / 4 = 2 replicas once the 5 s average has it);
    # after k looks the average is 8 (1 - e^(-k/5)); over a horizon h = 3 (a 2 s cold start and
    # a look) + lag x 5 s the window still holds the need before the step until k = h
    ("a-cold-start-and-a-look", 0.0, 12, 1 - math.exp(-3 / 5)),  # 45 % of the step
    # h = 5.5: the look at 14 (k = 5) is the last whose window (from 8.5) holds the need at 9
    ("and-half-a-rate-window", 0.5, 14, 1 - math.exp(-5 / 5)),  # 63 %: the default
    ("and-a-rate-window", 1.0, 17, 1 - math.exp(-8 / 5)),  # 80 %
]


@pytest.mark.parametrize("lag,peak,share", [c[1:] for c in RISE_READ_CASES], ids=[c[0] for c in RISE_READ_CASES])
def test_a_step_in_the_load_is_read_as_a_rise_over_the_rate_windows_lag(lag, peak, share):
    config = PolicyConfig(rise_lag_windows=lag)
    _, state = run(lambda t: {"ready": 2, "inflight": 8 if t >= 10 else 0}, peak, config=config)
    assert state.rise == pytest.approx(2.0 * share) and state.rise_at == float(peak)
    # a look later the window has lost the need before the step: the rise read is smaller,
    # and the largest (a look older, decayed) is kept
    _, later = run(lambda t: {"ready": 2, "inflight": 8 if t >= 10 else 0}, peak + 1, config=config)
    assert later.rise == pytest.approx(2.0 * share * math.exp(-1 / config.reserve_memory_s))


def test_a_hint_waits_for_a_whole_window_of_evidence():
    # hot from t=0: at 299 the average is 299 s old (< 300), at 300 it is a whole window
    out, _ = run(lambda t: HOT, 300, CAPPED)
    assert out[299][1].slice_fraction is None and out[300][1].slice_fraction == 0.5


def test_a_hint_needs_the_evidence_to_stay_hot():
    # 0.9 at t = 0..149, then 0.5 at t = 150..300: 151 one-second steps of weight 1 - exp(-1/300)
    # after the last 0.9 -> EWMA at 300 = 0.5 + (0.9 - 0.5) x exp(-151 / 300) = 0.742 < 0.85: no hint
    out, state = run(lambda t: {**HOT, "duty": (0.9, 0.9) if t < 150 else (0.5, 0.5)}, 300, CAPPED)
    assert state.duty_avg == pytest.approx(0.5 + 0.4 * math.exp(-151 / 300))
    assert all(d.slice_fraction is None for _, d in out)


def test_hints_are_spaced_by_the_slice_window():
    # after the hint at 300 the evidence starts again at 301: next hint at 301 + 300 = 601
    out, _ = run(lambda t: HOT, 700, CAPPED)
    assert [t for t, d in out if d.slice_fraction is not None] == [300, 601]


SLICE_SPACING_CASES = [
    # id, slice_at (evidence since t=0, hot), now, expected hint
    ("last-hint-100s-ago", 300.0, 400.0, None),  # 400 - 300 = 100 < 300
    ("last-hint-299s-ago", 300.0, 599.0, None),
    ("last-hint-300s-ago", 300.0, 600.0, 0.5),  # 600 - 300 >= 300
    ("never-hinted", None, 400.0, 0.5),
]


@pytest.mark.parametrize("slice_at,now,hint", [c[1:] for c in SLICE_SPACING_CASES],
                         ids=[c[0] for c in SLICE_SPACING_CASES])
def test_hints_are_spaced_from_the_last_one(slice_at, now, hint):
    state = PolicyState(duty_avg=0.9, duty_since=0.0, duty_last=now - 1, slice_at=slice_at, slice_fraction=0.25)
    decision, _ = decide(snap(at=now, **HOT), CAPPED, state, now, CFG)
    assert decision.slice_fraction == hint


@pytest.mark.parametrize("running, hint", [
    (0.25, 0.5),  # the slice asked for: the evidence of a whole window stands
    (0.5, None),  # another (a new revision declares 1/2): the evidence starts again
], ids=["as-asked", "another-slice"])
def test_a_slice_other_than_the_one_asked_for_starts_the_evidence_again(running, hint):
    """The policy asked for 1/4 at 300 and has been hot on it since; at 600 new replicas get
    `running`. On 1/4 the window is whole: 1/2. On 1/2 (shoal up's new revision declares it,
    ReplicaScaler._reap) the duty measured on 1/4 says nothing of it: no hint (1.0 without this
    rule), the state takes 1/2 and the next hint waits a window from 600."""
    state = PolicyState(duty_avg=0.9, duty_since=300.0, duty_last=599.0, slice_at=300.0, slice_fraction=0.25)
    decision, after = decide(snap(at=600.0, **{**HOT, "slice_": running}), CAPPED, state, 600.0, CFG)
    assert decision.slice_fraction == hint
    assert after.slice_fraction == (hint or running) and after.slice_at == 600.0
    if hint is None:
        assert after.duty_since == 600.0  # the duty average begins with this look


def test_no_hint_is_not_a_hint_for_the_same_slice():
    # a decision without a hint leaves slice_fraction None (keep what new replicas get now)
    decision, _ = decide(snap(**HOT), CAPPED, PolicyState(), 0.0, CFG)
    assert decision.slice_fraction is None


# ---------------------------------------------------------------------- PolicyConfig

BAD_CONFIG_CASES = [
    # id, kwargs, text the message must hold (field and value)
    ("negative-window", {"burst_window_s": -1.0}, "burst_window_s (-1.0)"),
    ("nan-delay", {"scale_down_delay_s": float("nan")}, "scale_down_delay_s (nan)"),
    ("inf-trend-window", {"trend_window_s": float("inf")}, "trend_window_s (inf)"),
    ("string-gap", {"onset_gap_s": "20"}, "onset_gap_s ('20')"),
    ("none-margin", {"prewarm_margin_s": None}, "prewarm_margin_s (None)"),
    ("up-rate-1", {"max_scale_up_rate": 1.0}, "max_scale_up_rate (1.0)"),
    ("down-rate-0.5", {"max_scale_down_rate": 0.5}, "max_scale_down_rate (0.5)"),
    ("slo-target-0", {"slo_target_pct": 0.0}, "slo_target_pct (0.0)"),
    ("slo-target-120", {"slo_target_pct": 120.0}, "slo_target_pct (120.0)"),
    ("slo-boost-under-1", {"slo_max_boost": 0.5}, "slo_max_boost (0.5)"),
    ("trend-boost-under-1", {"trend_max_boost": 0.9}, "trend_max_boost (0.9)"),
    ("cold-duty-over-hot", {"slice_cold_duty": 0.9}, "slice_cold_duty (0.9)"),  # 0.9 >= hot 0.85
    ("hot-duty-over-1", {"slice_hot_duty": 1.5}, "slice_hot_duty (1.5)"),
    ("min-slice-0", {"min_slice": 0.0}, "min_slice (0.0)"),
    ("min-slice-over-max", {"min_slice": 0.5, "max_slice": 0.25}, "min_slice (0.5)"),
    ("max-slice-over-1", {"max_slice": 2.0}, "max_slice (2.0)"),
    ("onsets-kept-2", {"onsets_kept": 2}, "onsets_kept (2)"),
    ("negative-keep", {"periodic_keep_s": -5.0}, "periodic_keep_s (-5.0)"),
    ("max-duty-0", {"max_duty": 0.0}, "max_duty (0.0)"),
    ("max-duty-over-1", {"max_duty": 1.5}, "max_duty (1.5)"),
    ("headroom-100pct", {"headroom_pct": 100.0}, "headroom_pct (100.0)"),
    ("negative-headroom", {"headroom_pct": -10.0}, "headroom_pct (-10.0)"),
]


@pytest.mark.parametrize("kwargs,text", [c[1:] for c in BAD_CONFIG_CASES], ids=[c[0] for c in BAD_CONFIG_CASES])
def test_bad_config_names_the_field_and_value(kwargs, text):
    with pytest.raises(ValueError, match=re.escape(text)):
        PolicyConfig(**kwargs)


GOOD_CONFIG_CASES = [
    ("defaults", {}),
    ("slo-target-100", {"slo_target_pct": 100.0}),
    ("boosts-1", {"slo_max_boost": 1.0, "trend_max_boost": 1.0}),
    ("rates-just-over-1", {"max_scale_up_rate": 1.01, "max_scale_down_rate": 1.01}),
    ("one-slice-size", {"min_slice": 0.5, "max_slice": 0.5}),
    ("hot-duty-1", {"slice_hot_duty": 1.0}),
    ("max-duty-1-no-headroom", {"max_duty": 1.0, "headroom_pct": 0.0}),
    ("max-duty-under-target-duty", {"max_duty": 0.5}),  # the spec's 0.7 is then the most
    ("zero-windows", {"burst_window_s": 0.0, "scale_down_delay_s": 0.0, "trend_window_s": 0.0}),
]


@pytest.mark.parametrize("kwargs", [c[1] for c in GOOD_CONFIG_CASES], ids=[c[0] for c in GOOD_CONFIG_CASES])
def test_good_config_constructs_and_decides(kwargs):
    config = PolicyConfig(**kwargs)
    out, _ = run(lambda t: {"ready": 2, "inflight": 4 * t, "duty": (0.5, 0.5), "slice_": 0.25}, 5, SPEC, config)
    assert all(d.reason in REASONS for _, d in out)


def test_default_config_values():
    assert CFG == PolicyConfig()
    assert (CFG.burst_window_s, CFG.scale_down_delay_s, CFG.max_scale_up_rate, CFG.max_scale_down_rate) == (6, 30, 10, 2)
    assert (CFG.slo_target_pct, CFG.slo_max_boost, CFG.periodic_keep_s, CFG.slice_window_s) == (80, 3, 10, 300)
    assert (CFG.max_duty, CFG.headroom_pct) == (0.9, 50)


def test_zero_slice_window_is_rejected():
    with pytest.raises(ValueError, match=re.escape("slice_window_s (0.0)")):
        PolicyConfig(slice_window_s=0.0)


@pytest.mark.parametrize("name", ["onsets_kept", "max_spare", "budget_clean_windows", "gaps_min", "gaps_kept"])
def test_fractional_counts_are_rejected(name):
    """Counts are whole numbers: max_spare 1.5 would add half a replica."""
    with pytest.raises(ValueError, match=re.escape(f"{name} (3.5) must be a whole number")):
        PolicyConfig(**{name: 3.5, "gaps_kept": 16 if name != "gaps_kept" else 3.5})


def test_zero_windows_at_wall_clock_times():
    """At now = 1.7e9 s (time.time()), now - 0 - EPS rounds to now: a window of 0 s must still
    hold the look's own need. It once left the delay window empty, and decide() raised on
    every look; the burst window read 0. Here 9 in flight / 4 per replica = 2.25 -> 3 replicas."""
    config = PolicyConfig(burst_window_s=0.0, scale_down_delay_s=0.0, trend_window_s=0.0, concurrency_window_s=0.0)
    now = 1.7e9
    assert window_start(now, 0.0) < now and now - 0.0 - 1e-9 == now
    state = PolicyState()
    for t in (now, now + 1.0):
        decision, state = decide(snap(ready=1, inflight=9, duty=(0.9,), at=t), SPEC, state, t, config)
    assert decision.desired == 3 and state.peak == NeedAt(now + 1.0, 2.25)
    assert window_max(state.needs, now + 1.0, 0.0) == 2.25


# ---------------------------------------------------------------------- bounds


def test_hold_stays_within_max_replicas():
    decision, _ = decide(snap(ready=10, inflight=4), ScalingSpec(max_replicas=8), PolicyState(), 0.0, CFG)
    assert decision.desired <= 8, decision


def test_no_data_stays_within_min_replicas():
    decision, _ = decide(snap(ready=1, duty=()), ScalingSpec(min_replicas=2), PolicyState(), 0.0, CFG)
    assert decision.desired >= 2, decision


# ---------------------------------------------------------------------- purity


def test_decide_does_not_mutate_and_is_deterministic():
    snapshot = MetricsSnapshot("f", 5.0, ready=2, inflight=9.0, activator_queue=3, duty=(0.9, 0.8), rps=2.0,
                               p95_s=0.12, cold_start_s=2.0, slice_fraction=0.25, extra={"x": 1.0})
    state = PolicyState(last_active_at=0.0, needs=(NeedAt(1.0, 2.0), NeedAt(2.0, 3.0), NeedAt(3.0, 4.0)), onsets=(0.0,),
                        duty_avg=0.9, duty_since=0.0, duty_last=4.0)
    copies = copy.deepcopy((snapshot, SPEC, state, CFG))
    assert copies[0] is not snapshot and copies[0].extra is not snapshot.extra  # a real copy to compare with
    first = decide(snapshot, SPEC, state, 5.0, CFG)
    second = decide(snapshot, SPEC, state, 5.0, CFG)
    assert (snapshot, SPEC, state, CFG) == copies
    assert first == second
    for obj, name in ((snapshot, "ready"), (SPEC, "max_replicas"), (state, "needs"), (CFG, "burst_window_s"),
                      (first[0], "desired")):
        # frozen dataclasses raise FrozenInstanceError, the records AttributeError (its base)
        with pytest.raises(AttributeError):
            setattr(obj, name, 1)
    with pytest.raises(AttributeError):  # nor a name it does not have, as a NamedTuple
        snapshot.redy = 3  # type: ignore[attr-defined]
    assert hash(state) == hash(copy.deepcopy(state))  # hashable by value, as a tuple


def test_the_same_scenario_gives_the_same_decisions():
    load = lambda t, ready: {"held": 1 if t % 300 == 0 else 0, "inflight": 3 * (t % 7)}  # noqa: E731
    assert follow(load, 700) == follow(load, 700)


# ---------------------------------------------------------------------- properties


@st.composite
def scenarios(draw):
    min_r = draw(st.integers(0, 4))
    spec = ScalingSpec(
        min_replicas=min_r, max_replicas=draw(st.integers(max(1, min_r), 20)),
        slo_p95_ms=draw(st.floats(1.0, 1000.0)), target_duty=draw(st.floats(0.05, 1.0)),
        target_concurrency=draw(st.floats(0.5, 16.0)), idle_to_zero_s=draw(st.floats(0.0, 120.0)),
    )
    steps, now = [], 0.0
    for _ in range(draw(st.integers(1, 6))):
        now += draw(st.sampled_from([0.5, 1.0, 2.0, 10.0, 31.0, 61.0, 300.0]))
        # the controller keeps the count within the bounds (or at zero)
        current = draw(st.just(0) | st.integers(max(1, min_r), spec.max_replicas))
        ready = draw(st.integers(0, current))
        steps.append((now, MetricsSnapshot(
            "f", now, ready=ready, starting=current - ready,
            inflight=draw(st.floats(0.0, 200.0)), activator_queue=draw(st.integers(0, 200)),
            duty=tuple(draw(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=ready))),
            rps=draw(st.floats(0.0, 50.0)), p95_s=draw(st.none() | st.floats(0.0, 2.0)),
            cold_start_s=draw(st.none() | st.floats(0.0, 30.0)),
            slice_fraction=draw(st.none() | st.sampled_from([0.125, 0.25, 0.5, 1.0])),
            service_s=draw(st.none() | st.floats(0.0, 0.5)),
        )))
    return spec, steps


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(target_duty=st.floats(0.05, 1.0), slo_ms=st.floats(1.0, 1000.0), ready=st.integers(0, 4),
       duty=st.floats(0.0, 1.0), inflight=st.floats(0.0, 200.0), rps=st.floats(0.0, 500.0),
       service_s=st.none() | st.floats(0.0, 0.5), p95_s=st.none() | st.floats(0.0, 2.0))
def test_the_need_lies_between_the_work_at_max_duty_and_its_views(target_duty, slo_ms, ready, duty, inflight, rps,
                                                                   service_s, p95_s):
    # work / max(max_duty, target_duty) <= need <= max(work / target_duty x slo_max_boost, demand / concurrency)
    spec = ScalingSpec(target_duty=target_duty, slo_p95_ms=slo_ms)
    snapshot = MetricsSnapshot("f", 0.0, ready=ready, inflight=inflight, duty=(duty,) * ready, rps=rps,
                               p95_s=p95_s, service_s=service_s)
    need = estimate_need(snapshot, spec, CFG)
    work = max(rps * service_s if service_s else 0.0, duty * ready)
    assert need.by in ("work", "concurrency", "slo")
    assert need.replicas >= work / max(CFG.max_duty, target_duty) * (1 - 1e-9), need
    high = max(work / target_duty * CFG.slo_max_boost, snapshot.demand / spec.target_concurrency)
    assert need.replicas <= high * (1 + 1e-9), need


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_decisions_stay_in_bounds_and_never_cut_an_overloaded_function(scenario):
    spec, steps = scenario
    state = PolicyState()
    for now, snapshot in steps:
        decision, state = decide(snapshot, spec, state, now, CFG)
        assert isinstance(decision, ScaleDecision)
        assert decision.reason in REASONS
        if decision.desired == 0:
            assert spec.min_replicas == 0, decision
        else:
            assert spec.min_replicas <= decision.desired <= spec.max_replicas, decision
        current = snapshot.ready + snapshot.starting
        # the concurrency view counts, uncapped, while p95 is unknown (or nobody is ready to
        # measure it) or over its target, and no work is measured with a known service time
        slo_target_s = spec.slo_p95_ms / 1000.0 * CFG.slo_target_pct / 100.0
        latency_bad = snapshot.p95_s is None or snapshot.ready == 0 or snapshot.p95_s / slo_target_s > 1
        capped = bool(snapshot.service_s) and max(snapshot.rps * snapshot.service_s, sum(snapshot.duty)) > 0
        if latency_bad and not capped and snapshot.demand > current * spec.target_concurrency:
            assert decision.desired >= current, (snapshot, decision)
        if decision.slice_fraction is not None:
            assert CFG.min_slice <= decision.slice_fraction <= CFG.max_slice


def test_a_forecast_is_not_undone_by_the_next_look():
    """A FORECAST scale-up counts as a need for the delay window. 40 s of need 0.5 (2 in
    flight / 4) on 1 replica, then 0.75 and 1.0: the trend (least squares over the last
    30 s, 3 s ahead) passes 1 -> 2 (FORECAST). Then the need is 0.5 again: the window's
    needs say ceil(1.0) = 1 after a whole delay window of looks (without the hold, down to
    1 at once), but the forecast holds 2 until 30 s after it."""
    state, decisions = PolicyState(), []
    load = [2] * 40 + [3, 4] + [2] * 31
    for t, inflight in enumerate(load):
        ready = decisions[-1][0] if decisions else 1
        decision, state = decide(snap(ready=ready, inflight=float(inflight), at=float(t)), SPEC, state, float(t),
                                 INSTANT)
        decisions.append((decision.desired, decision.reason))
    assert decisions[41] == (2, "FORECAST")
    assert [d for d, _ in decisions[42:71]] == [2] * 29  # held through t = 70, the window's end
    assert decisions[72] == (1, "STABLE")  # 31 s after it: the window's needs rule again


def test_in_flight_is_averaged_like_kpas_window():
    """By default the concurrency view reads in-flight averaged over 5 s (EWMA): 8 in flight
    on 2 replicas (need 2), then one look at 40: the average is 8 + 32 x (1 - e^-0.2) = 13.8,
    need 3.45 -> 4, not 10; held requests count at once (a function at zero acts on them)."""
    out, state = run(lambda t: {"ready": 2, "inflight": 40 if t == 10 else 8}, 10, ScalingSpec(max_replicas=20),
                     NO_TREND.__class__(trend_max_boost=1.0))
    assert state.inflight_avg == pytest.approx(8 + 32 * (1 - math.exp(-0.2)))
    assert (out[10][1].desired, out[10][1].reason) == (4, "BURST")
    (decision, _), = [decide(snap(held=40), SPEC, PolicyState(), 0.0)]
    assert decision.desired == 8  # 40 held / 4 = 10, capped at max 8: not averaged


def test_window_peak_carried_from_look_to_look():
    """The delay window's largest need, carried in the state: 3.0 at 90 stays while inside the
    30 s window and beats the new need; an equal new need takes over (the latest of equals);
    once it leaves the window the window is scanned."""
    needs = (NeedAt(80.0, 1.0), NeedAt(90.0, 3.0), NeedAt(100.0, 2.0))
    assert _window_peak(NeedAt(90.0, 3.0), needs, 100.0, 30.0) == NeedAt(90.0, 3.0)
    assert _window_peak(NeedAt(90.0, 3.0), needs[:2] + (NeedAt(100.0, 3.0),), 100.0, 30.0) == NeedAt(100.0, 3.0)
    later = (NeedAt(90.0, 3.0), NeedAt(100.0, 2.0), NeedAt(121.0, 1.0))
    assert _window_peak(NeedAt(90.0, 3.0), later, 121.0, 30.0) == NeedAt(100.0, 2.0)  # 90 <= 121 - 30: scanned
    assert _window_peak(None, needs, 100.0, 30.0) == NeedAt(90.0, 3.0)  # none carried: scanned


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 7.0, 31.0]),
                          st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.25])), min_size=1, max_size=120))
def test_window_peak_matches_a_scan_of_the_window(looks):
    """Look after look (gaps of 0 to 31 s, needs with many ties), the carried peak is what
    window_max scans from the needs, for the delay window."""
    needs, peak, now = (), None, 0.0
    for gap, need in looks:
        now += gap
        needs = _kept_needs(needs, now, need, CFG)
        peak = _window_peak(peak, needs, now, CFG.scale_down_delay_s)
        assert peak.replicas == window_max(needs, now, CFG.scale_down_delay_s)
        assert now - CFG.scale_down_delay_s - 1e-9 < peak.at <= now


def test_window_peak_is_scanned_when_the_clock_goes_back():
    """A wall clock stepped back (the cluster controller reads time.time): the last look was
    at 100 with the peak 3.0 at 90; a look at 95 must see 5.0 at 68 again, inside (65, 95]."""
    needs = (NeedAt(68.0, 5.0), NeedAt(90.0, 3.0), NeedAt(100.0, 1.0), NeedAt(95.0, 1.0))
    assert _window_peak(NeedAt(90.0, 3.0), needs, 95.0, 30.0) == NeedAt(68.0, 5.0)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from([CFG, INSTANT, PolicyConfig(burst_window_s=40.0)]),
       looks=st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 7.0, 31.0]), st.integers(0, 4),
                                st.integers(0, 3), st.sampled_from([0.0, 0.5, 3.0, 9.0, 30.0]),
                                st.sampled_from([0.0, 10.0, 200.0])), min_size=1, max_size=60))
def test_a_carried_peak_decides_as_a_scan_would(config, looks):
    """Whole decisions: every look decided from the carried state and from the same state with
    its peak dropped (so decide() scans the window) gives the same decision and state, also
    with a burst window longer than the delay window."""
    spec = ScalingSpec(max_replicas=8, slo_p95_ms=100.0)
    carried = scanned = PolicyState()
    now = 0.0
    for gap, ready, starting, inflight, rps in looks:
        now += gap
        snapshot = MetricsSnapshot("f", now, ready=ready, starting=starting, inflight=inflight, rps=rps,
                                   service_s=0.004 if rps else None, duty=(min(1.0, rps * 0.004),) * ready,
                                   p95_s=0.01 if ready and rps else None, cold_start_s=2.0, window_s=1.0)
        a, carried = decide(snapshot, spec, carried, now, config)
        b, scanned = decide(snapshot, spec, scanned._replace(peak=None), now, config)
        assert a == b
        assert carried == scanned


def _looked(traffic: dict[int, float], skip: bool, seconds: int = 120) -> list[tuple[int, int, float]]:
    """(second, desired, rate average) of each look at one function with 1 s looks, traffic[t]
    requests/s at second t (each request 40 ms, two batch sizes learned), the count taking
    effect at once; skip: the looks quiet_until lets a caller skip after an idle one skipped."""
    spec = ScalingSpec(max_replicas=8, slo_p95_ms=200.0)
    state, current, quiet, out = PolicyState(), 1, -1.0, []
    for t in range(1, seconds + 1):
        rps = traffic.get(t, 0.0)
        if skip and rps == 0 and t < quiet:
            continue
        snapshot = MetricsSnapshot("f", float(t), ready=current, rps=rps, inflight=rps * 0.04,
                                   service_s=0.04 if rps else None, duty=(min(1.0, rps * 0.04 / current),) * current,
                                   p95_s=0.05 if rps else None, over_slo=0.0, cold_start_s=2.0, window_s=1.0)
        decision, state = decide(snapshot, spec, state, float(t), CFG)
        current = max(1, decision.desired)
        quiet = quiet_until(state, spec, current, float(t), 2.0, CFG) if rps == 0 else -1.0
        out.append((t, current, state.rate_avg))
    return out


@pytest.mark.parametrize("traffic", [
    {t: 30.0 for t in range(1, 11)} | {t: 90.0 for t in range(50, 55)},  # a burst after 39 s idle
    {t: 10.0 for t in range(1, 6)} | {40: 5.0} | {t: 60.0 for t in range(70, 73)},  # a lone request, then a burst
], ids=["burst-after-silence", "lone-request-then-burst"])
def test_skipped_idle_looks_leave_the_state_as_looking_would(traffic):
    """A caller that skips the looks quiet_until allows after an idle look (the simulator) and
    one that looks every second (the live controller) decide alike at every look the first
    takes, and read the same rate average there: the look after a skip finds the skipped looks
    idle (_unlooked), so a burst after a silence reads the rise a look each second reads."""
    every = {t: (desired, rate) for t, desired, rate in _looked(traffic, skip=False)}
    skipping = _looked(traffic, skip=True)
    assert len(skipping) < len(every)  # some were skipped
    for t, desired, rate in skipping:
        assert desired == every[t][0], t
        assert rate == pytest.approx(every[t][1], rel=1e-9, abs=1e-12), t
