"""The cluster's control loop: a snapshot from PromQL answers (autoscaler/sources/promql.py, on
recorded shapes of Prometheus's `data.result`), and the controller's tick (deploy/cluster/controller.py)
against the fake API server, on a fake clock."""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client import CollectorRegistry

from deploy.cluster.backend import KubernetesBackend, Observed
from deploy.cluster.configmaps import ConfigMapFunctions
from deploy.cluster.render import artifact_for
from autoscaler.coldstarts import ColdStarts
from autoscaler.loop import Memory
from autoscaler.sources.promql import batch_of, by_function, cluster_queries, snapshot_from_results
from deploy.cluster.controller import ClusterController
from deploy.cluster.manifests.render import Cluster
from tests.fakes.kube import FakeKube


def vector(*values: float, label: str | None = None, function: str = "digits") -> list[dict]:
    """An instant vector as Prometheus answers it: values are strings, with the evaluation time."""
    return [{"metric": {"function": function, **({"pod": f"{label}-{i}"} if label else {})},
             "value": [1795320000.0, repr(v)]} for i, v in enumerate(values)]


def test_eleven_queries_for_every_function_at_once():
    q = cluster_queries()
    assert set(q) == {"rps", "duty", "p95_s", "inflight", "queued", "held", "busy", "buckets", "batches", "rows",
                      "probe"}
    assert q["rps"] == "sum by (function) (rate(shoal_replica_requests_total[30s]))"
    assert q["duty"] == "sum by (function, pod) (rate(shoal_replica_busy_seconds_total[30s]))"
    # latency from arrival, held time included: the gateways' histogram, not the replicas'
    assert q["buckets"] == "sum by (function, le) (rate(shoal_gateway_request_duration_seconds_bucket[30s]))"
    assert q["p95_s"] == ("histogram_quantile(0.95, sum by (function, le) "
                          "(rate(shoal_gateway_request_duration_seconds_bucket[30s])))")
    assert q["batches"] == "sum by (function) (rate(shoal_replica_batch_size_count[30s]))"
    assert q["rows"] == "sum by (function) (rate(shoal_replica_batch_size_sum[30s]))"
    # each size's slowest pod's batch of zeros timed at its load
    assert q["probe"] == "max by (function, rows) (shoal_replica_batch_probe_seconds)"
    # in flight time-averaged between the last two scrapes, not the gauge's count at one
    assert q["inflight"] == "sum by (function) (irate(shoal_replica_inflight_seconds_total[30s]))"


def buckets(*pairs: tuple[str, float], function: str = "digits") -> list[dict]:
    """A `buckets` vector: one sample per `le` bound, requests per second at or under it."""
    return [{"metric": {"function": function, "le": le}, "value": [1795320000.0, repr(v)]} for le, v in pairs]


def test_over_slo_from_the_latency_histogram():
    # 100 req/s: 90 within 0.1 s, 99 within 0.25 s, all within +Inf; SLO 0.2 s:
    # 90 + 9 x (0.2 - 0.1) / (0.25 - 0.1) = 96 at or under it -> 4 % over
    results = {"rps": vector(100.0), "buckets": buckets(("+Inf", 100.0), ("0.1", 90.0), ("0.25", 99.0), ("x", 5.0),
                                                        ("0.15", float("nan")))}  # a bound or a value not a number
    s = snapshot_from_results("digits", 0.0, Observed("digits", 1, 1, 1), results, slo_s=0.2)
    assert s.over_slo == pytest.approx(0.04)
    assert s.window_s == 30.0  # the rates were measured over the query window
    assert snapshot_from_results("digits", 0.0, None, results).over_slo == 0.0  # no SLO given
    assert snapshot_from_results("digits", 0.0, None, {"buckets": []}, slo_s=0.2).over_slo == 0.0  # no requests
    # the share's whole: the gateways' rate (the +Inf bucket), not the replicas' (no scrape yet: none)
    held = snapshot_from_results("digits", 0.0, Observed("digits", 1, 1, 1), {"buckets": results["buckets"]}, slo_s=0.2)
    assert (held.rps, held.answered_rps) == (0.0, 100.0)
    assert snapshot_from_results("digits", 0.0, None, {"buckets": []}).answered_rps == 0.0


def test_batch_latencies_are_learned_from_rates_over_the_window():
    # 8 batches/s answering 38 requests/s with 0.04 busy s/s: 38 / 8 = 4.75 requests in 0.04 / 8 = 5 ms
    window = {"batches": vector(8.0), "rps": vector(38.0), "busy": vector(0.04)}
    memory = Memory(batch={"digits": (0.25, ((1.0, 0.004),))})
    table = memory.learn("digits", 0.25, batch_of(window))
    assert [x for pair in table for x in pair] == pytest.approx([1.0, 0.004, 4.75, 0.005])
    assert batch_of({"rps": vector(38.0)}) is None  # no batch in the window: nothing to learn
    assert memory.learn("digits", 0.25, batch_of({"rps": vector(38.0)})) == table


def test_by_function_splits_the_vectors():
    split = by_function({"rps": vector(5.0, function="a") + vector(7.0, function="b"), "held": vector(2.0,
                                                                                                       function="b")})
    assert split == {"a": {"rps": vector(5.0, function="a")},
                     "b": {"rps": vector(7.0, function="b"), "held": vector(2.0, function="b")}}


def test_duty_takes_the_busiest_ready_pods():
    # 2 ready; three pods in the window: a starting (or gone) one idle at 0 must not replace a hot one
    s = snapshot_from_results("digits", 0.0, Observed("digits", 1, 3, 2), {"duty": vector(0.0, 0.9, 0.8,
                                                                                         label="p")})
    assert s.duty == (0.8, 0.9)


def test_snapshot_arithmetic():
    # 40 req/s answered with 0.8 executor-seconds per second: 0.02 s per request; 3 desired, 2 ready -> 1 starting
    results = {"rps": vector(40.0), "busy": vector(0.8), "duty": vector(0.5, 0.3, label="fn-digits"),
               "p95_s": vector(0.042), "inflight": vector(3.0), "queued": vector(1.0), "held": vector(2.0)}
    s = snapshot_from_results("digits", 100.0, Observed("digits", 1, 3, 2), results)
    assert (s.ready, s.starting, s.rps, s.p95_s, s.inflight, s.queued, s.activator_queue) == (2, 1, 40.0, 0.042,
                                                                                               3.0, 1.0, 2)
    assert s.duty == (0.3, 0.5) and s.service_s == pytest.approx(0.02)
    assert s.demand == 5.0  # 3 inside replicas + 2 held at the activator


def test_snapshot_of_nothing():
    # no series yet, a quantile of no requests is NaN: zero load, p95 unknown
    s = snapshot_from_results("digits", 100.0, None, {"rps": [], "p95_s": vector(float("nan")), "duty": []})
    assert (s.ready, s.starting, s.rps, s.p95_s, s.service_s, s.duty) == (0, 0, 0.0, None, None, ())


def deploy_function(kube: FakeKube, name: str = "digits", revision: int = 1, **scaling) -> None:
    spec = {"name": name, "artifact": f"sha256:{'a' * 64}/{name}.onnx", "slice": "1/4",
            "scaling": {"max_replicas": 6, "target_concurrency": 2, **scaling}}
    kube.create_namespaced_config_map("shoal", ConfigMapFunctions.config_map(spec, revision, "shoal"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def controller(kube: FakeKube, query, clock: Clock, identity: str = "a") -> ClusterController:
    cluster = Cluster()
    backend = KubernetesBackend(cluster, kube, kube, kube, clock=clock, identity=identity)
    return ClusterController(backend, ConfigMapFunctions(kube, "shoal"), query,
                             lambda spec: artifact_for(spec, "pvc", ""), clock)


def test_tick_scales_out_on_load_and_only_the_leader_acts():
    kube, clock = FakeKube(), Clock()
    deploy_function(kube)
    load = {"rps": vector(200.0), "busy": vector(0.0), "inflight": vector(12.0), "held": vector(0.0),
            "queued": vector(0.0), "duty": [], "p95_s": vector(0.01), "buckets": [], "batches": []}

    def query(promql: str) -> list[dict]:
        key = next(k for k, q in cluster_queries().items() if q == promql)
        return load.get(key, [])

    a, b = controller(kube, query, clock, "a"), controller(kube, query, clock, "b")
    first = a.tick()
    # from zero with 12 in flight at target_concurrency 2: 12 / 2 = 6 replicas at once (max_replicas 6)
    assert first.leader and first.decisions["digits"].reason == "COLD_START"
    assert first.applied == ["create digits to 6"]
    assert b.tick().leader is False and b.tick().applied == []  # the follower touches nothing
    kube.deployments[("shoal", "fn-digits")]["status"]["readyReplicas"] = 6
    load["inflight"] = vector(2.0)  # 2 in flight: 1 replica would do
    applied, at = [], []
    for _ in range(60):  # scale-down waits a whole 30 s window of lower need, then at most halves
        clock.t += 1
        done = a.tick().applied
        applied += done
        at += [clock.t] * len(done)
    # in flight is averaged over 5 s (2 + 10 e^(-t/5)), so the need falls over some seconds
    # and the count follows it down in steps, the first one a whole window after the load fell
    counts = [int(x.rsplit(" ", 1)[1]) for x in applied]
    assert counts == [5, 4, 3], applied  # ceil of the averaged need as it falls; halving allows each step
    assert all(x.startswith("scale digits to ") for x in applied) and at[0] - 1000.0 >= 30 - 1e-9, (at, applied)
    assert kube.deployments[("shoal", "fn-digits")]["spec"]["replicas"] == 3


def test_prometheus_down_keeps_the_replica_count():
    kube, clock = FakeKube(), Clock()
    deploy_function(kube, min_replicas=1)

    def down(promql: str) -> list[dict]:
        raise ConnectionError("connection refused")

    c = controller(kube, down, clock)
    r = c.tick()
    assert r.unread == ["digits"] and r.decisions == {}
    assert kube.deployments[("shoal", "fn-digits")]["spec"]["replicas"] == 1  # min_replicas, not zero


def test_a_bad_config_map_does_not_stop_the_others_nor_delete_what_runs():
    kube, clock = FakeKube(), Clock()
    deploy_function(kube, "good")
    deploy_function(kube, "bad")
    c = controller(kube, lambda q: [], clock)
    c.tick()
    assert ("shoal", "fn-bad") in kube.deployments
    kube.config_maps[("shoal", "function-bad")]["data"]["spec.json"] = "{not json"  # edited by hand, badly
    functions = ConfigMapFunctions(kube, "shoal")
    assert list(functions.functions()) == ["good"] and functions.broken == {"bad"}
    clock.t += 1
    c.tick()
    assert ("shoal", "fn-bad") in kube.deployments  # kept as it was, not deleted


def test_a_poke_from_the_gateway_starts_a_replica_before_prometheus_sees_the_queue():
    kube, clock = FakeKube(), Clock()
    deploy_function(kube)
    quiet = {"rps": [], "busy": [], "inflight": [], "held": [], "queued": [], "duty": [], "p95_s": [], "buckets": [],
             "batches": []}

    def query(promql: str) -> list[dict]:
        return quiet.get(next(k for k, q in cluster_queries().items() if q == promql), [])

    c = controller(kube, query, clock)
    assert c.tick().applied == ["create digits to 0"]  # nothing held, nothing measured: stays at zero
    c.poke("digits", 3)  # a gateway holds 3 requests
    clock.t += 0.5
    r = c.tick()
    assert r.decisions["digits"].reason == "COLD_START" and r.applied[0].startswith("scale digits to ")
    assert kube.deployments[("shoal", "fn-digits")]["spec"]["replicas"] >= 1
    clock.t += 10  # the poke is 10 s old: only what Prometheus says counts again
    c.pokes["digits"] = (clock.t - 10, 3)
    assert c.tick().decisions["digits"].reason != "COLD_START"


def test_old_pokes_are_forgotten():
    kube, clock = FakeKube(), Clock()
    c = controller(kube, lambda q: [], clock)
    for i in range(1000):  # names a gateway poked once (POKE_TTL_S = 5 s)
        c.poke(f"gone-{i}", 1)
    clock.t += 4
    c.poke("recent", 2)
    c.tick()
    assert len(c.pokes) == 1001  # 4 s old: still counted
    clock.t += 2  # the 1000 are 6 s old, "recent" 2 s
    c.tick()
    assert set(c.pokes) == {"recent"}


@pytest.mark.parametrize("over_pct, expected", [(0.0, 1), (5.0, 2)])
def test_requests_over_the_slo_reach_the_error_budget(over_pct, expected):
    """One ready replica, 40 req/s of 10 ms and 1 in flight: the work and concurrency views say
    one replica. With 5 % of requests over the 100 ms SLO (more than the 0.1 % budget), the
    budget's first 30 s window adds a spare replica; with none over, nothing changes."""
    kube, clock = FakeKube(), Clock()
    deploy_function(kube, min_replicas=1)
    within = 40.0 * (1 - over_pct / 100)
    load = {"rps": vector(40.0), "busy": vector(0.4), "inflight": vector(1.0), "held": vector(0.0),
            "queued": vector(0.0), "duty": vector(0.4, label="fn-digits"), "p95_s": vector(0.05),
            "buckets": buckets(("0.05", within), ("0.1", within), ("0.25", 40.0), ("+Inf", 40.0)), "batches": []}
    c = controller(kube, lambda promql: load.get(next(k for k, q in cluster_queries().items() if q == promql), []), clock)
    c.tick()
    kube.deployments[("shoal", "fn-digits")]["status"]["readyReplicas"] = 1
    for _ in range(40):
        clock.t += 1
        c.tick()
    assert kube.deployments[("shoal", "fn-digits")]["spec"]["replicas"] == expected


def test_the_burst_view_compares_rates_of_windows_that_do_not_overlap():
    """Rates over 30 s read every second: the rate's variance is sampled every 30 s, from the
    rates of two disjoint windows, not from two windows that share 29 s. 40 req/s, then 70
    from the 31st second: at 1030 s, 30^2 x 30 / 2 = 13,500 weighing w = 1 - e^(-30/60); at
    1060 s no difference, so it decays by e^(-30/60)."""
    kube, clock = FakeKube(), Clock()
    deploy_function(kube, min_replicas=1)
    load = {"rps": vector(40.0), "busy": vector(0.4), "inflight": vector(1.0), "held": vector(0.0),
            "queued": vector(0.0), "duty": vector(0.4, label="fn-digits"), "p95_s": vector(0.05), "buckets": [],
            "batches": []}
    c = controller(kube, lambda promql: load.get(next(k for k, q in cluster_queries().items() if q == promql), []), clock)
    sampled_at = set()
    for i in range(61):
        load["rps"] = vector(40.0 if i < 30 else 70.0)
        c.tick()
        sampled_at.add(c.state["digits"].rps_last_at)
        if i == 29:
            assert c.state["digits"].rate_var == 0.0  # 40 req/s throughout: no difference yet
        if i == 30:
            assert c.state["digits"].rate_var == pytest.approx(13500 * (1 - math.exp(-0.5)))
        clock.t += 1
    assert sampled_at == {1000.0, 1030.0, 1060.0}
    assert c.state["digits"].rate_var == pytest.approx(13500 * (1 - math.exp(-0.5)) * math.exp(-0.5))


COLD_START_CASES = [
    # id, steps: ("ask", t, desired, Deployment's replicas, ready) | ("observe", t, ready);
    # expected latest (None: none measured)
    ("measured-when-all-ready", [("ask", 0, 3, 0, 0), ("observe", 5, 2), ("observe", 9, 3)], 9.0),
    ("no-scale-up-no-measure", [("ask", 0, 2, 2, 2), ("observe", 5, 2)], None),
    # a pod restarting (2 of 3 ready, nothing raised) is no cold start
    ("a-readiness-dip-is-not-one", [("ask", 0, 3, 3, 2), ("observe", 4, 3)], None),
    # 3 asked at 0 s, 6 at 4 s, every pod 8 s: the second raise reads its own 8 s
    ("each-raise-on-its-own", [("ask", 0, 3, 0, 0), ("ask", 4, 6, 3, 1), ("observe", 8, 3), ("observe", 12, 6)],
     8.0),
    # asked for fewer meanwhile: 2 ready complete it (from the first ask, 0 s: 7 s)
    ("asked-for-fewer", [("ask", 0, 5, 0, 0), ("ask", 3, 2, 5, 1), ("observe", 7, 2)], 7.0),
    # scaled down to what is ready: nothing to measure any more
    ("scale-down-ends-it", [("ask", 0, 5, 1, 1), ("ask", 3, 1, 5, 1), ("observe", 9, 5)], None),
    # ready 20 minutes after the ask (MAX_S 900 s): pods waited for room, not a cold start
    ("a-wait-for-capacity-is-not-one", [("ask", 0, 2, 0, 0), ("observe", 1200, 2)], None),
    ("the-clock-stepped-back", [("ask", 100, 2, 0, 0), ("observe", 50, 2)], None),
]


@pytest.mark.parametrize("steps, expected", [c[1:] for c in COLD_START_CASES], ids=[c[0] for c in COLD_START_CASES])
def test_cold_starts(steps, expected):
    cold = ColdStarts()
    for step in steps:
        if step[0] == "ask":
            cold.ask("f", float(step[1]), step[2], step[3], step[4])
        else:
            cold.observe("f", float(step[1]), step[2])
    assert cold.latest.get("f") == expected


def test_what_is_learned_is_forgotten_with_the_lease_and_with_the_function():
    kube, clock = FakeKube(), Clock()
    deploy_function(kube)
    deploy_function(kube, "other")
    window = {key: vector(value) + vector(value, function="other")
              for key, value in (("batches", 8.0), ("rps", 38.0), ("busy", 0.04))}
    c = controller(kube, lambda q: window.get(next(k for k, v in cluster_queries().items() if v == q), []), clock)
    c.tick()
    c.cold_starts.latest["digits"] = c.cold_starts.latest["other"] = 5.0
    assert set(c.state) == set(c.batch_latency) == {"digits", "other"}
    kube.config_maps.pop(("shoal", "function-other"))  # deleted
    clock.t += 1
    c.tick()
    assert set(c.state) == set(c.batch_latency) == set(c.cold_starts.latest) == {"digits"}
    other = controller(kube, lambda q: [], clock, "b")
    kube.leases[("shoal", "shoal-controller")]["spec"]["holderIdentity"] = "b"  # another took the Lease
    assert other.tick().leader and not c.tick().leader
    assert c.state == {} and c.batch_latency == {} and c.cold_starts.latest == {}


def test_the_cold_start_measured_on_the_cluster_reaches_the_policy(monkeypatch):
    import autoscaler.policies as policies  # the loop's default policy, Shoal's, calls decide() there

    snapshots = []

    def recorded(snapshot, *args, **kwargs):
        snapshots.append(snapshot)
        return loop_decide(snapshot, *args, **kwargs)

    loop_decide = policies.decide
    monkeypatch.setattr(policies, "decide", recorded)
    kube, clock = FakeKube(), Clock()
    deploy_function(kube)
    load = {"rps": [], "busy": [], "inflight": vector(4.0), "held": vector(0.0), "queued": [], "duty": [],
            "p95_s": [], "buckets": [], "batches": []}
    seen = []

    def query(promql: str) -> list[dict]:
        return load.get(next(k for k, q in cluster_queries().items() if q == promql), [])

    c = controller(kube, query, clock)
    assert c.tick().applied == ["create digits to 2"]  # 4 in flight / 2 per replica
    for _ in range(12):
        clock.t += 1
        if clock.t == 1012.0:
            kube.deployments[("shoal", "fn-digits")]["status"]["readyReplicas"] = 2  # ready 12 s after the ask
        c.tick()
        seen.append(c.cold_starts.latest.get("digits"))
    assert seen == [None] * 11 + [12.0]
    assert [x.cold_start_s for x in snapshots] == [None] * 12 + [12.0]  # what decide() was given


def _steady_calls(n: int) -> list[str]:
    """The API calls of one steady tick (after the tick that created everything) with n functions."""
    kube, clock = FakeKube(), Clock()
    for i in range(n):
        deploy_function(kube, f"f{i:04d}")
    ctl = controller(kube, lambda promql: [], clock)
    clock.t += 2
    assert len(ctl.tick().applied) == n  # the first tick creates every Deployment and Service
    clock.t += 2
    del kube.calls[:]
    assert ctl.tick().applied == []
    return sorted(c.split(" ")[0] for c in kube.calls)


def test_a_steady_tick_makes_the_same_calls_for_3_and_300_functions():
    """Issue 21, must-show 6 (tests/cluster/test_scale.py checks it on a real API server): one list
    per kind and the Lease, never a call per function."""
    assert _steady_calls(3) == _steady_calls(300) == sorted(
        ["read_namespaced_lease", "replace_namespaced_lease"] * 2
        + ["list_namespaced_config_map", "list_namespaced_deployment", "list_namespaced_service"])


def test_a_function_removed_and_deployed_again_between_two_ticks_rolls_its_deployment():
    """`shoal rm f && shoal deploy f other` within one tick: the controller never sees f gone, so
    only a new revision tells it the Deployment runs the old template (revisions are not reused)."""
    from deploy.cluster.configmaps import ConfigMapRegistry
    from functions.spec import spec_from_dict

    kube, clock = FakeKube(), Clock()
    reg = ConfigMapRegistry(kube, "shoal", clock)
    first = {"name": "digits", "artifact": f"sha256:{'a' * 64}/digits.onnx", "slice": "1/4"}
    reg.put_function(spec_from_dict(first), clock.t)
    c = controller(kube, lambda q: [], clock)
    assert c.tick().applied == ["create digits to 0"]
    reg.delete_function("digits")
    record, _ = reg.put_function(spec_from_dict({**first, "artifact": f"sha256:{'b' * 64}/other.onnx"}), clock.t)
    assert record.revision == 2
    clock.t += 1
    assert c.tick().applied == ["replace digits to 0"]
    deployment = kube.deployments[("shoal", "fn-digits")]
    assert deployment["metadata"]["labels"]["shoal.dev/revision"] == "2"
    assert "other.onnx" in json.dumps(deployment["spec"]["template"])


@pytest.mark.parametrize("hints", [True, False])
def test_a_start_from_zero_on_the_cluster_asks_for_no_other_slice(hints):
    """A Deployment's replicas run its slice, so the cluster's policy gives no slice hints: a
    start from zero of a function known to take 5 ms a request on its 1/4 would ask for 1/8
    under shoal up (`hints`: the same decide() with hints on, which does), not here."""
    from dataclasses import replace

    from autoscaler.policies import Shoal
    from autoscaler.policy import PolicyState

    kube, clock = FakeKube(), Clock()
    deploy_function(kube)
    c = controller(kube, lambda q: [], clock)
    if hints:
        c.loop.policy = Shoal(replace(c.loop.policy.config, slice_hints=True))
    c.tick()
    c.loop.memory.policy["digits"] = PolicyState(service_max=0.005, service_on=0.25)
    c.poke("digits", 1)
    clock.t += 0.5
    decision = c.tick().decisions["digits"]
    assert decision.reason == "COLD_START"
    assert (decision.slice_fraction, "starts on" in decision.detail) == ((0.125, True) if hints else (None, False))


def test_the_cluster_controller_says_it_runs_shoal_without_slice_resizing():
    """A Deployment's replicas all run its slice: the policy runs with slice hints off, and its
    metric says so by the simulator's name for it (shoal-fixed), not plain shoal."""
    registry = CollectorRegistry()
    cluster = Cluster()
    kube, clock = FakeKube(), Clock()
    backend = KubernetesBackend(cluster, kube, kube, kube, clock=clock, identity="a")
    made = ClusterController(backend, ConfigMapFunctions(kube, "shoal"), lambda q: [],
                             lambda spec: artifact_for(spec, "pvc", ""), clock, registry=registry)
    assert made.loop.policy.name == "shoal-fixed" and not made.loop.policy.config.slice_hints
    assert registry.get_sample_value("shoal_controller_policy", {"policy": "shoal-fixed"}) == 1.0
    assert registry.get_sample_value("shoal_controller_policy", {"policy": "shoal"}) is None
