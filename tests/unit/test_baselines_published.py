"""The baselines as published (Knative's KPA, Ray Serve) and as tuned by the one rule, table-driven,
each number beside the upstream file it comes from (docs/design/baselines.md has the list).
Unit tests on a fake clock: `now` is a number; the simulator runs are a few simulated seconds."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.baselines import kpa, ray_serve, tuned
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.simulator import (ACTIVATOR_HOP_S, Profile, SimConfig, Simulation, kpa_policy, kpa_tuned_policy,
                                  ray_policy, ray_tuned_policy)
from autoscaler.traces import Trace
from functions.spec import ScalingSpec

RESNET = ((1, 4.0), (8, 6.0), (32, 14.0))
BERT = ((1, 8.0), (8, 20.0))
MLP = ((1, 1.0),)
WHISPER = ((1, 30.0), (4, 45.0))
SPEC = ScalingSpec(min_replicas=0, max_replicas=100)


def snap(ready=0, starting=0, inflight=0.0, held=0) -> MetricsSnapshot:
    return MetricsSnapshot("f", 0.0, ready=ready, starting=starting, inflight=inflight, activator_queue=held)


# ---------------------------------------------------------------------- Knative KPA

TARGET_CASES = [
    # id, annotation target (per-pod total), per-pod target = total x 0.7 (target.go ResolveMetricTarget,
    # container-concurrency-target-percentage 70 in config.go)
    ("default-100-to-70", 100.0, 70.0),
    ("annotation-10-to-7", 10.0, 7.0),
    ("annotation-4-to-2.8", 4.0, 2.8),
    ("annotation-2-to-1.4", 2.0, 1.4),
    # 0.01 x 0.7 = 0.007 < TargetMin 0.01 (autoscaling.TargetMin) -> 0.01
    ("floored-at-target-min-0.01", 0.01, 0.01),
]


@pytest.mark.parametrize("total, per_pod", [c[1:] for c in TARGET_CASES], ids=[c[0] for c in TARGET_CASES])
def test_an_annotation_target_is_scaled_by_the_utilization(total, per_pod):
    assert kpa.KpaConfig(container_concurrency_target=total).target == pytest.approx(per_pod)


def test_kpa_published_defaults():
    config = kpa.KpaConfig()
    # config.go defaultConfig: utilization 0.7, target-burst-capacity 200, stable window 60 s
    assert (config.target_utilization, config.target_burst_capacity, config.stable_window_s) == (0.7, 200.0, 60.0)


def test_the_simulated_kpa_uses_the_spec_target_as_the_annotation():
    policy = kpa_policy()
    # the spec's target 4 is the annotation: 4 x 0.7 = 2.8 per pod (before: 4, divided by 0.7 first)
    assert policy.config(0, ScalingSpec(target_concurrency=4.0)).target == pytest.approx(2.8)
    assert kpa_policy(spec_target=False).config(0, ScalingSpec(target_concurrency=4.0)).target == 70.0


EBC_CASES = [
    # id, ready pods, annotation (TotalValue), target-burst-capacity, panic concurrency, EBC
    # autoscaler.go Scale: floor(ready x total - TBC - panic)
    ("4-per-pod-3-pods", 3, 4.0, 200.0, 10.0, -198),  # floor(12 - 200 - 10)
    ("100-per-pod-3-pods", 3, 100.0, 200.0, 10.0, 90),  # floor(300 - 200 - 10)
    ("exactly-zero", 3, 70.0, 200.0, 10.0, 0),  # floor(210 - 200 - 10) = 0: not negative
    ("fraction-floored", 3, 70.0, 200.0, 10.5, -1),  # floor(-0.5) = -1
    ("no-ready-pods", 0, 100.0, 200.0, 1.0, -201),  # the unfloored ready count: floor(0 - 200 - 1)
    ("tbc-0-never-negative", 0, 4.0, 0.0, 50.0, 0),  # TBC 0: the activator only at zero scale
    ("tbc-minus-1-always", 100, 100.0, -1.0, 0.0, -1),  # TBC -1: the activator always in the path
]


@pytest.mark.parametrize("ready, total, tbc, panic, ebc", [c[1:] for c in EBC_CASES], ids=[c[0] for c in EBC_CASES])
def test_excess_burst_capacity(ready, total, tbc, panic, ebc):
    config = kpa.KpaConfig(container_concurrency_target=total, target_burst_capacity=tbc)
    assert kpa.excess_burst_capacity(ready, panic, config) == ebc


def test_target_burst_capacity_is_validated():
    with pytest.raises(ValueError, match=r"target_burst_capacity \(-2\)"):
        kpa.KpaConfig(target_burst_capacity=-2)


ACTIVATOR_CASES = [
    # id, annotation, ready, in flight, expected in path, EBC (kpa.go ReconcileKind: proxy while EBC < 0)
    # first look: stable = panic = 10 in flight; floor(3 x 4 - 200 - 10) = -198
    ("small-target-in-path", 4.0, 3, 10.0, True, -198),
    # floor(3 x 100 - 200 - 10) = 90 >= 0: out of the path
    ("large-target-out-of-path", 100.0, 3, 10.0, False, 90),
]


@pytest.mark.parametrize("total, ready, inflight, in_path, ebc", [c[1:] for c in ACTIVATOR_CASES],
                         ids=[c[0] for c in ACTIVATOR_CASES])
def test_the_decision_says_where_the_activator_is(total, ready, inflight, in_path, ebc):
    config = kpa.KpaConfig(container_concurrency_target=total)
    decision, state = kpa.decide(snap(ready=ready, inflight=inflight), SPEC, kpa.initial_state(config), 0.0, config)
    assert (state.activator_in_path, state.excess_burst_capacity) == (in_path, ebc)
    assert decision.detail.endswith(f"activator {'in' if in_path else 'out of'} path (ebc {ebc})")


def test_a_new_revision_starts_with_the_activator_in_path():
    assert kpa.KpaState().activator_in_path  # no decision yet: the SKS is created in proxy mode


def test_the_activator_is_in_path_through_the_grace_period():
    # annotation 1000: EBC = floor(1 x 1000 - 200 - 0) = 800 >= 0, but once the decider wants 0 the
    # PA is inactive and the activator takes the traffic (kpa.go: want == 0), during the 30 s grace too
    config = kpa.KpaConfig(container_concurrency_target=1000.0)
    state = kpa.KpaState(desired=1)
    decision, state = kpa.decide(snap(ready=1, inflight=1), SPEC, state, 0.0, config)
    assert not state.activator_in_path
    t = 2.0
    while decision.reason not in ("HOLD", "TO_ZERO"):
        decision, state = kpa.decide(snap(ready=1), SPEC, state, t, config)
        t += 2.0
    assert (decision.reason, state.activator_in_path) == ("HOLD", True)


def one_function(arrivals, duration=5.0) -> Trace:
    times = np.asarray(arrivals, float)
    return Trace(kind="csv", duration_s=duration, functions=("f0",), times=times,
                 fids=np.zeros(len(times), np.int32), params={})


@pytest.mark.parametrize("target, hop", [
    (4.0, ACTIVATOR_HOP_S),  # EBC floor(1 x 4 - 200 - panic) < 0: through the activator, 1 ms more
    (1000.0, 0.0),  # EBC floor(1 x 1000 - 200 - panic) >= 0 after the first look: straight to the replica
], ids=["small-target-hop", "large-target-no-hop"])
def test_the_activator_hop_adds_to_latency_while_in_path(target, hop):
    profile = Profile("p", ((1, 10.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000, target_concurrency=target)
    sim = Simulation(one_function([0.5, 3.5]), [profile], kpa_policy(), SimConfig(gpus=1), initial={0: 1})
    latencies = []
    account = sim._account
    sim._account = lambda f, latency, s, n_f: (latencies.extend(latency.tolist()), account(f, latency, s, n_f))
    sim.run()
    # 0.5 s: before any look, a new revision's activator is in the path: 10 ms + 1 ms
    # 3.5 s: after looks at 1, 2, 3 s: 10 ms, plus the hop only while EBC < 0
    assert latencies == pytest.approx([0.010 + ACTIVATOR_HOP_S, 0.010 + hop], abs=1e-9)


# ---------------------------------------------------------------------- Ray Serve


def test_ray_published_defaults():
    config = ray_serve.RayConfig()
    # constants.py: max_ongoing_requests 5 (since 2.32.0, was 100); config.py: metrics_interval_s 10,
    # look_back_period_s 30; target_ongoing_requests 2
    assert (config.max_ongoing_requests, config.metrics_interval_s, config.look_back_period_s,
            config.target_ongoing_requests) == (5, 10.0, 30.0, 2.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_ongoing_requests=0), r"max_ongoing_requests \(0\)"),
    (dict(max_ongoing_requests=2.5), r"max_ongoing_requests \(2.5\)"),
    (dict(metrics_interval_s=0), r"metrics_interval_s \(0\)"),
], ids=["max-ongoing-0", "max-ongoing-fraction", "interval-0"])
def test_ray_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ray_serve.RayConfig(**kwargs)


SPLIT_CASES = [
    # id, snapshot, max_ongoing_requests, (ongoing in replicas, queued at the router)
    ("14-on-2-max-5", snap(ready=2, inflight=14), 5, (10.0, 4.0)),  # 2 x 5 = 10 in replicas, 4 wait
    ("under-the-bound", snap(ready=2, inflight=3), 5, (3.0, 0.0)),
    ("held-at-zero", snap(starting=1, inflight=2, held=3), 5, (0.0, 5.0)),  # none running: all at the router
    ("old-default-100", snap(ready=1, inflight=60), 100, (60.0, 0.0)),  # before Ray 2.32.0
]


@pytest.mark.parametrize("snapshot, bound, expected", [c[1:] for c in SPLIT_CASES], ids=[c[0] for c in SPLIT_CASES])
def test_a_replica_holds_at_most_max_ongoing_requests(snapshot, bound, expected):
    assert ray_serve.split_ongoing(snapshot, bound) == expected


def test_metrics_are_pushed_every_10_s():
    # 3 running: idle at 0 s, then 12 ongoing from 1 s on. Pushed at 0 s (0 ongoing): the
    # controller decides on 0 until the 10 s push; then the average of the look-back's samples:
    # 0 s .. 10 s, one a second: (0 + 10 x 12) / 11 = 10.909...
    state, totals = ray_serve.RayState(), {}
    for now in range(0, 11):
        state = ray_serve.push_metrics(snap(ready=3, inflight=0 if now == 0 else 12), state, float(now),
                                       ray_serve.RayConfig())
        totals[now] = state.pushed_total
    assert [totals[t] for t in range(10)] == [0.0] * 10
    assert totals[10] == pytest.approx(120 / 11)


def test_the_queue_counts_as_it_is_at_the_push():
    # 1 running with 5 ongoing (the bound) and 15 more at the router, all samples 5: 5 + 15 = 20
    state = ray_serve.push_metrics(snap(ready=1, inflight=20), ray_serve.RayState(), 0.0, ray_serve.RayConfig())
    assert state.pushed_total == 20.0


def test_requests_at_zero_are_pushed_at_once():
    # pushed at 0 s with nothing; at 3 s, none running and 2 held: the handle pushes now (router.py
    # should_send_scaled_to_zero_optimized_push), not at 10 s -> the cold-start fast path at 3 s
    config = ray_serve.RayConfig()
    _, state = ray_serve.decide(snap(), SPEC, ray_serve.RayState(), 0.0, config)
    decision, state = ray_serve.decide(snap(held=2), SPEC, state, 3.0, config)
    assert (state.pushed_at, state.pushed_total, decision.desired, decision.reason) == (3.0, 2.0, 1, "COLD_START")


def test_an_upscale_waits_for_the_next_push():
    # tuned delays (upscale 0 s): 2 running idle, pushed at 0 s; 12 ongoing from 1 s on
    # (under the bound 2 x 100): the controller sees it only at the 10 s push
    # -> (0 + 10 x 12) / 11 = 10.9 / (2 per replica x 2) -> raw 5.45 -> 6
    config = ray_serve.RayConfig(upscale_delay_s=0.0, max_ongoing_requests=100)
    state, desired = ray_serve.RayState(), {}
    for now in range(0, 11):
        decision, state = ray_serve.decide(snap(ready=2, inflight=0 if now == 0 else 12), SPEC, state, float(now), config)
        desired[now] = decision.desired
    assert {desired[t] for t in range(1, 10)} == {2} and desired[10] == 6


def test_the_router_bounds_a_replicas_batch():
    profiles = [Profile("resnet50", RESNET, cold_start_s=4.0, slo_ms=100.0),
                Profile("whisper", WHISPER, 0.5, 0.5, cold_start_s=8.0, slo_ms=500.0)]
    trace = Trace(kind="csv", duration_s=1.0, functions=("a", "b"), times=np.array([0.1, 0.2]),
                  fids=np.array([0, 1], np.int32), params={})
    # Ray's default 5: resnet's batches of 32 -> 5; whisper's 4 stay 4 (the rest wait at the router)
    assert Simulation(trace, profiles, ray_policy(), SimConfig(gpus=2)).max_batch.tolist() == [5, 4]
    # tuned: max_ongoing_requests = the SLO concurrency (224, 44) >= the batch: unbounded
    assert Simulation(trace, profiles, ray_tuned_policy(profiles), SimConfig(gpus=2)).max_batch.tolist() == [32, 4]
    # the other policies' batches are left alone
    assert Simulation(trace, profiles, kpa_policy(), SimConfig(gpus=2)).max_batch.tolist() == [32, 4]


def test_a_burst_takes_longer_in_batches_of_5():
    # 32 requests at once on 1 warm resnet50 replica: in batches of at most 5 (Ray's default
    # max_ongoing_requests) they take longer than with the full batch of 32 (14 ms) available
    profile = Profile("resnet50", RESNET, cold_start_s=4.0, slo_ms=100.0)
    trace = one_function(np.full(32, 0.5), duration=2.0)
    p99 = {}
    for name, make in (("ray", ray_policy), ("ray-tuned", lambda: ray_tuned_policy([profile]))):
        record = Simulation(trace, [profile], make(), SimConfig(gpus=1), initial={0: 1}).run()
        p99[name] = record["p99_ms"]
    assert p99["ray"] > p99["ray-tuned"]


# ---------------------------------------------------------------------- the tuning rule

SLO_CONCURRENCY_CASES = [
    # id, profile (batch, ms), SLO ms, C: (ceil(n / B) - 1) x lat(B) + lat(rest) <= SLO
    ("resnet50", RESNET, 100.0, 224),  # 6 x 14 + 14 = 98 <= 100; 225: 7 x 14 + 4 = 102 > 100
    ("bert-base", BERT, 200.0, 80),  # 9 x 20 + 20 = 200 <= 200; 81: 10 x 20 + 8 = 208
    ("mlp-small", MLP, 50.0, 50),  # 50 x 1 ms
    ("whisper-tiny", WHISPER, 500.0, 44),  # 10 x 45 + 45 = 495; 45: 11 x 45 + 30 = 525
    ("slo-under-batch-1", MLP, 0.5, 1),  # none meets it: at least 1
]


@pytest.mark.parametrize("profile, slo, expected", [c[1:] for c in SLO_CONCURRENCY_CASES],
                         ids=[c[0] for c in SLO_CONCURRENCY_CASES])
def test_slo_concurrency(profile, slo, expected):
    assert tuned.slo_concurrency(profile, slo) == expected


def test_batch_latency_is_linear_between_profiled_sizes():
    assert tuned.batch_latency_ms(RESNET, 5) == pytest.approx(4 + 2 * 4 / 7)  # between (1, 4) and (8, 6)
    assert tuned.batch_latency_ms(RESNET, 64) == 14.0  # flat past the largest


def test_kpa_tuned_rule():
    # resnet50, headroom 0.05: annotation 0.05 x 224 = 11.2; per pod 11.2 x 0.7 = 7.84
    config = tuned.kpa_config(RESNET, 100.0, headroom=0.05)
    assert (config.container_concurrency_target, config.target) == pytest.approx((11.2, 7.84))
    assert config.target_burst_capacity == 200.0  # the rest stays KPA's defaults


def test_ray_tuned_rule():
    # whisper-tiny, headroom 0.1, cold start 8 s, 30 cold starts: target 0.1 x 44 = 4.4, at most
    # max(44, batch 4) = 44 in a replica, no upscale delay, downscale after 30 x 8 = 240 s
    config = tuned.ray_config(WHISPER, 500.0, 8.0, headroom=0.1, downscale_cold_starts=30.0)
    assert (config.target_ongoing_requests, config.max_ongoing_requests, config.upscale_delay_s,
            config.downscale_delay_s) == pytest.approx((4.4, 44, 0.0, 240.0))
    assert config.metrics_interval_s == 10.0  # the rest stays Ray's defaults


@pytest.mark.parametrize("call, message", [
    (lambda: tuned.kpa_config(MLP, 50.0, headroom=0.0), r"headroom \(0.0\)"),
    (lambda: tuned.ray_config(MLP, 50.0, 2.0, headroom=1.5), r"headroom \(1.5\)"),
    (lambda: tuned.ray_config(MLP, 50.0, 2.0, downscale_cold_starts=-1.0), r"downscale_cold_starts \(-1.0\)"),
], ids=["kpa-headroom-0", "ray-headroom-over-1", "ray-negative-delay"])
def test_tuned_rule_validation(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_tuned_makers_use_the_frozen_constants_on_the_profiled_slice():
    # a profile on half its reference slice runs 2x slower: the user profiled it there
    profile = Profile("p", RESNET, slice_fraction=0.125, ref_slice=0.25, cold_start_s=4.0, slo_ms=100.0)
    slow = tuple((b, 2 * ms) for b, ms in RESNET)
    spec = profile.spec()
    assert kpa_tuned_policy([profile]).config(0, spec) == tuned.kpa_config(slow, 100.0, tuned.KPA_HEADROOM)
    assert ray_tuned_policy([profile]).config(0, spec) == tuned.ray_config(
        slow, 100.0, 4.0, tuned.RAY_HEADROOM, tuned.RAY_DOWNSCALE_COLD_STARTS)
