"""One control loop for both platforms: shoal up's (`deploy.local.server.control_loop`: the replica
scaler, per-replica scrapes) and the cluster controller's (`ClusterController`: the Kubernetes
scaler on the fake API server, PromQL answers in the recorded shape) go through the same
`autoscaler.loop.Loop.tick` and, given the same load, decide and ask for the same replicas.
Fake clocks, no processes, no sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.loop import Fleet, Loop, Memory, Policy, Target
from autoscaler.metrics import ReplicaStat
from autoscaler.placement import Device, Inventory
from autoscaler.policies import Kpa, RayServe, Shoal, policy_named
from autoscaler.policy import ScaleDecision
from autoscaler.replicas import ControllerConfig
from autoscaler.sources.promql import cluster_queries
from deploy.cluster.backend import KubernetesBackend
from deploy.cluster.configmaps import ConfigMapFunctions
from deploy.cluster.controller import ClusterController
from deploy.cluster.manifests.render import Cluster
from deploy.cluster.render import artifact_for
from deploy.local.server import build_parser, control_loop
from functions.spec import spec_from_dict
from tests.fakes.kube import FakeKube

SPEC = {"name": "digits", "artifact": f"sha256:{'a' * 64}/digits.onnx", "slice": "1/4",
        "scaling": {"max_replicas": 6, "target_concurrency": 2}}
T0 = 1000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------- shoal up, with fakes at its edges


class _Functions:
    broken = frozenset()

    def __init__(self, spec: dict = SPEC) -> None:
        self.spec = spec

    def functions(self):
        return {"digits": (spec_from_dict(self.spec), 1)}


class _Backend:
    """Replicas that start at once: 0.2 s to live, 0.5 s to ready."""

    async def create(self, replica_id, spec, placement):
        return SimpleNamespace(host="127.0.0.1", port=9000)

    async def wait_ready(self, handle, timeout_s):
        return 0.2, 0.5

    async def stop(self, handle, grace_s):
        pass

    def exited(self, handle):
        return None


class _Gateway:
    def __init__(self) -> None:
        self.inflight, self.waiting = 0, 0

    def outstanding(self, function):
        return self.inflight

    def inflight_seconds(self, function):
        return 0.0, 0.0  # no integral: the reading takes the count now (outstanding)

    def held(self, function):
        return self.waiting

    def add_endpoint(self, *args, **kwargs):
        pass

    def fail_waiters(self, function, message):
        raise AssertionError(f"no request should be failed here: {message}")

    def forget(self, function):
        pass

    async def drain_endpoint(self, function, replica, timeout_s):
        return True  # nothing in flight to wait for

    def remove_endpoint(self, function, replica):
        pass

    def latencies(self):
        return {}


class _Scraper:
    probes = True

    def __init__(self, clock: Clock, gateway: _Gateway) -> None:
        self.clock, self.gateway = clock, gateway

    async def scrape(self, replica, host, port, at):
        return ReplicaStat(replica, self.clock())  # a first scrape: counts, but no window yet


class Local:
    """shoal up: the loop `ControlPlane` runs, ticked as `Loop.run` ticks it."""

    def __init__(self, policy: Policy = Shoal(), spec: dict = SPEC) -> None:
        self.clock, self.gateway, self.events, self.registry = Clock(), _Gateway(), [], CollectorRegistry()
        cpus = [Device(f"cpu:{i}", "cpu", 16384, cpus=(2 * i, 2 * i + 1)) for i in range(2)]  # 8 slices of 1/4
        self.loop = control_loop(_Functions(spec), _Backend(), self.gateway, Inventory(tuple(cpus)),
                                 _Scraper(self.clock, self.gateway),
                                 lambda *a, **k: self.events.append((*a, k)), self.registry,
                                 ControllerConfig(), policy)
        self.loop.scaler.clock = self.clock
        self.runner = asyncio.new_event_loop()

    def load(self, held: int, inflight: int) -> None:
        self.gateway.waiting, self.gateway.inflight = held, inflight

    def tick(self):
        self.runner.run_until_complete(self.loop.tick(self.clock()))
        return self.loop.decisions["digits"]

    def start_what_was_asked(self) -> None:
        async def started():
            await asyncio.gather(*self.loop.scaler._tasks)

        self.runner.run_until_complete(started())

    def replicas(self) -> int:
        return len(self.loop.scaler.live("digits"))

    def close(self) -> None:
        self.runner.close()


# ---------------------------------------------------------------------- the cluster, on the fake API server


class Kubernetes:
    """shoal controller: the ClusterController, ticked as its thread ticks it."""

    def __init__(self, spec: dict = SPEC) -> None:
        self.clock, self.kube = Clock(), FakeKube()
        self.kube.create_namespaced_config_map("shoal", ConfigMapFunctions.config_map(spec, 1, "shoal"))
        self.answers: dict[str, list] = {key: [] for key in cluster_queries()}
        backend = KubernetesBackend(Cluster(), self.kube, self.kube, self.kube, clock=self.clock, identity="a")
        self.ctl = ClusterController(backend, ConfigMapFunctions(self.kube, "shoal"), self._query,
                                     lambda spec: artifact_for(spec, "pvc", ""), self.clock)

    def _query(self, promql: str) -> list[dict]:
        return self.answers[next(k for k, q in cluster_queries().items() if q == promql)]

    def load(self, held: int, inflight: int) -> None:
        for key, value in (("held", held), ("inflight", inflight)):
            self.answers[key] = [{"metric": {"function": "digits"}, "value": [T0, repr(float(value))]}]

    def tick(self):
        return self.ctl.tick().decisions["digits"]

    def start_what_was_asked(self) -> None:
        deployment = self.kube.deployments[("shoal", "fn-digits")]
        deployment["status"]["readyReplicas"] = deployment["spec"]["replicas"]

    def replicas(self) -> int:
        return self.kube.deployments[("shoal", "fn-digits")]["spec"]["replicas"]

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------- the same tick, the same decisions


STEPS = [
    # (seconds since T0, held at the gateway, in flight inside replicas) -> (reason, replicas asked for)
    # nothing runs, 4 held, 2 per replica: ceil(4 / 2) = 2, at once
    ((0, 4, 0), ("COLD_START", 2)),
    # the 2 are ready, 12 in flight, averaged over 5 s: 12 x (1 - e^(-10/5)) = 10.4 -> ceil(10.4 / 2) = 6
    ((10, 0, 12), ("BURST", 6)),
    # idle: 10.4 x e^(-10/5) = 1.4 in flight -> 1 replica, but scale-down waits 30 s of lower need
    ((20, 0, 0), ("STABLE", 6)),
]


@pytest.mark.parametrize("platform", [Local, Kubernetes], ids=["shoal-up", "shoal-controller"])
def test_both_platforms_tick_through_the_one_loop(platform, monkeypatch):
    ticks = []
    tick = Loop.tick

    async def counted(self, now, only=None):
        ticks.append(now)
        return await tick(self, now, only)

    monkeypatch.setattr(Loop, "tick", counted)
    p = platform()
    try:
        seen = []
        for (at, held, inflight), _ in STEPS:
            p.clock.t = T0 + at
            p.load(held, inflight)
            decision = p.tick()
            seen.append(((decision.reason, decision.desired), p.replicas()))
            p.start_what_was_asked()
    finally:
        p.close()
    assert ticks == [T0 + at for (at, _, _), _ in STEPS]
    assert seen == [(expected, expected[1]) for _, expected in STEPS]


INITIAL = {**SPEC, "scaling": {**SPEC["scaling"], "initial_replicas": 2}}
INITIAL_STEPS = [
    # (seconds since T0, started what was asked before this look) -> (reason, replicas asked for)
    # the first look: Shoal's policy alone says 0 (nothing held or in flight); the loop asks 2
    ((0, False), ("INITIAL", 2)),
    # both ready: the policy starts again and decides from now on; with 2 ready and nothing to
    # do it keeps them (its keep-alive counts from here: the spec's idle_to_zero_s, 60 s)
    ((2, True), (None, 2)),
    # still warm 59 s on (shoal up's look may have scaled down to 1 after its 30 s delay window)
    ((61, True), (None, None)),
    # idle 60 s since they were ready, never a request: to zero, as any idle function
    ((62, True), ("TO_ZERO", 0)),
    # and from zero it stays there: the initial scale was reached once
    ((70, True), ("TO_ZERO", 0)),
]


@pytest.mark.parametrize("platform", [Local, Kubernetes], ids=["shoal-up", "shoal-controller"])
def test_initial_replicas_start_at_the_first_look_and_go_when_unused(platform):
    p = platform(spec=INITIAL)
    try:
        seen = []
        for (at, started), _ in INITIAL_STEPS:
            if started:
                p.start_what_was_asked()
            p.clock.t = T0 + at
            p.load(0, 0)
            decision = p.tick()
            seen.append(((decision.reason, decision.desired), p.replicas()))
    finally:
        p.close()
    for k, (_, (reason, desired)) in enumerate(INITIAL_STEPS):
        if reason is None:  # the policy's own (shoal up's: NO_DATA, one scrape), not zero
            (got, n), running = seen[k]
            assert got not in ("INITIAL", "TO_ZERO") and n == running >= 1 and (desired is None or n == desired)
            seen[k] = ((None, desired), desired)
    assert seen == [(expected, expected[1]) for _, expected in INITIAL_STEPS]


@pytest.mark.parametrize("initial", [1, 2])
@pytest.mark.parametrize("policy", [Shoal(), Kpa(), RayServe()], ids=["shoal", "kpa", "ray"])
def test_each_policy_keeps_the_initial_replicas_once_ready(policy, initial):
    # ready at the look after the first: every policy keeps them (KPA through its 30 s grace
    # period, Ray Serve its 600 s downscale delay, Shoal its 60 s keep-alive), none at once to 0
    p = Local(policy, spec={**SPEC, "scaling": {**SPEC["scaling"], "initial_replicas": initial}})
    try:
        p.load(0, 0)
        first = p.tick()
        p.start_what_was_asked()
        kept = []
        for at in (1, 2, 10, 29):
            p.clock.t = T0 + at
            p.load(0, 0)
            kept.append((p.tick().desired, p.replicas()))
    finally:
        p.close()
    # KPA, told it starts at the initial scale, asks it itself: HOLD at 1, BURST at 2 (a new
    # autoscaler with pods starts in panic)
    assert first.desired == initial
    assert first.reason == ({1: "HOLD", 2: "BURST"}[initial] if policy.name == "kpa" else "INITIAL")
    assert kept == [(initial, initial)] * 4


def _look(p, at):
    p.clock.t = T0 + at
    p.load(0, 0)
    decision = p.tick()
    return decision.reason, decision.desired


def test_a_new_revision_of_an_idle_function_keeps_its_initial_replicas_once_ready():
    # revision 1 (no initial scale) idle from T0 goes to zero; revision 2, deployed with 2
    # initial replicas 200 s later, is raised, and once both are ready the policy starts again
    # (a new revision's decider): they stay, not stopped for the old revision's idle time
    p = Kubernetes(spec=SPEC)
    seen = [_look(p, 0), _look(p, 100)]
    body = ConfigMapFunctions.config_map(INITIAL, 2, "shoal")
    name = body["metadata"]["name"]
    body["metadata"]["resourceVersion"] = p.kube.config_maps[("shoal", name)]["metadata"]["resourceVersion"]
    p.kube.replace_namespaced_config_map(name, "shoal", body)
    seen.append(_look(p, 200))
    p.start_what_was_asked()
    seen += [_look(p, 201), _look(p, 210), _look(p, 250)]
    assert seen[0][1] == 0 and seen[1] == ("TO_ZERO", 0) and seen[2] == ("INITIAL", 2)
    assert [d for _, d in seen[3:]] == [2, 2, 2] and p.replicas() == 2


def test_a_model_load_longer_than_the_keep_alive_is_kept_once_ready():
    # the initial replicas take 70 s to be ready, longer than the 60 s keep-alive from the first
    # look: held at 2 (INITIAL) meanwhile, and kept once ready (the keep-alive counts from then)
    p = Kubernetes(spec=INITIAL)
    seen = [_look(p, 0), _look(p, 30), _look(p, 69)]
    p.start_what_was_asked()
    seen += [_look(p, 70), _look(p, 71), _look(p, 100)]
    assert [d for _, d in seen] == [2] * 6 and seen[0][0] == "INITIAL" and p.replicas() == 2


def test_the_initial_scale_is_held_until_ready_per_revision_and_given_up_at_the_deadline():
    # Loop._raising, what the loop holds a function at whatever its policy says: 2 while fewer
    # than 2 are ready, 0 once both were (the policy decides), 2 again for a new revision, and
    # 0 with an event once INITIAL_DEADLINE_S (600 s) passed without both ready
    from autoscaler.loop import INITIAL_DEADLINE_S
    from functions.spec import ScalingSpec

    p = Local(spec=INITIAL)
    scaling = ScalingSpec(max_replicas=6, initial_replicas=2)
    try:
        raising = p.loop._raising
        steps = [(1, Fleet(), 0.0), (1, Fleet(replicas=2, ready=0), 1.0), (1, Fleet(replicas=2, ready=1), 2.0),
                 (1, Fleet(replicas=2, ready=2), 3.0), (1, Fleet(), 4.0), (2, Fleet(), 5.0),
                 (2, Fleet(replicas=2, ready=1), 5.0 + INITIAL_DEADLINE_S - 1), (2, Fleet(replicas=2, ready=1),
                                                                                5.0 + INITIAL_DEADLINE_S)]
        seen = [raising("digits", scaling, rev, fleet, at) for rev, fleet, at in steps]
        given_up = [e for e in p.events if e[0] == "initial"]
        # a function deployed without one is never raised, nor when a later look sees it anew
        none = [raising("plain", ScalingSpec(), 1, Fleet(), at) for at in (0.0, 1.0)]
    finally:
        p.close()
    # the policy starts again where a hold begins (revisions 1 and 2) and where one ends ready
    assert seen == [(2, True), (2, False), (2, False), (0, True), (0, False), (2, True), (2, False), (0, False)]
    assert none == [(0, False), (0, False)]
    assert len(given_up) == 1 and "initial scale 2 not reached in 600 s (1 ready)" in given_up[0][1]
    assert p.loop.memory.initialized["digits"] == (2, None)


LEARN_CASES = [
    # id, (table learned on 1/4), slice now, window (requests per batch, seconds per batch) -> table
    ("first-window", (), 0.25, (1.0, 0.004), ((1.0, 0.004),)),
    # 7.6 rounds to bucket 8, new beside bucket 1
    ("a-new-size", ((1.0, 0.004),), 0.25, (7.6, 0.0059), ((1.0, 0.004), (7.6, 0.0059))),
    ("no-batch-keeps-it", ((1.0, 0.004),), 0.25, None, ((1.0, 0.004),)),
    # the policy moved new replicas to 1/2: what 1/4 ran, at twice the speed (4 -> 2 ms, 5.9 ->
    # 2.95 ms), then the window moves bucket 1 by a quarter: 2 + 0.25 x (2.2 - 2) = 2.05 ms
    ("a-new-slice-carries-it-at-its-speed", ((1.0, 0.004), (7.6, 0.0059)), 0.5, (1.0, 0.0022),
     ((1.0, 0.00205), (7.6, 0.00295))),
    ("a-new-slice-without-a-batch", ((1.0, 0.004),), 0.5, None, ((1.0, 0.002),)),
    # to 1/8: half the speed, twice the time
    ("a-smaller-slice", ((1.0, 0.004), (8.0, 0.012)), 0.125, None, ((1.0, 0.008), (8.0, 0.024))),
]


@pytest.mark.parametrize("table, slice_now, window, expected", [c[1:] for c in LEARN_CASES],
                         ids=[c[0] for c in LEARN_CASES])
def test_batch_latencies_are_learned_per_slice(table, slice_now, window, expected):
    memory = Memory(batch={"f": (0.25, table)})
    learned = memory.learn("f", slice_now, window)
    assert _flat(learned) == pytest.approx(_flat(expected))
    assert memory.batch["f"] == (slice_now, learned)


def _flat(table):
    return [x for row in table for x in row]


def test_a_slice_hint_reaches_the_next_snapshot_with_the_batch_table_at_its_speed():
    """shoal up starts new replicas on the slice the policy hints (1/4 -> 1/2); the batch
    latencies learned on 1/4 are carried to 1/2 at twice the speed (loop.on_slice), so the
    function still reads as one that batches: 4 -> 2 ms, 5.9 -> 2.95 ms."""
    local = Local()
    spec = spec_from_dict(SPEC)
    local.loop.memory.batch["digits"] = (0.25, ((1.0, 0.004), (7.6, 0.0059)))
    hint = ScaleDecision(0, "SLICE", "duty 0.90 on a 0.25 slice -> 0.5", slice_fraction=0.5)
    try:
        changed = local.runner.run_until_complete(local.loop.scaler.apply({"digits": Target(spec, 1, 0, hint)},
                                                                          frozenset()))
        local.load(0, 0)
        local.tick()
    finally:
        local.close()
    assert changed == {} and [e[0] for e in local.events] == ["slice"]  # 0 -> 0 replicas: no scale
    assert local.loop.snapshots["digits"].slice_fraction == 0.5
    assert local.loop.memory.batch["digits"][0] == 0.5
    assert _flat(local.loop.memory.batch["digits"][1]) == pytest.approx([1.0, 0.002, 7.6, 0.00295])


@pytest.mark.parametrize("change, seen, said", [
    # a new slice: new replicas, on the slice it declares, and an event says so
    ({"slice": "1/2"}, [0.125, 0.5, 0.5], "revision 2: new replicas get the 1/2 slice it declares (the hint 1/8 "
                                          "was for revision 1's replicas)"),
    # scaling only: the running replicas serve it (same_runtime), on the slice they run
    ({"scaling": {"max_replicas": 4, "target_concurrency": 2}}, [0.125, 0.125, 0.125], None),
], ids=["new-slice", "scaling-only"])
def test_a_new_revision_starts_on_the_slice_it_declares(monkeypatch, change, seen, said):
    """A slice hint is the policy's for the replicas it ran on: redeployed with other replicas
    (revision 2 on 1/2), new replicas get 1/2, not the 1/8 the hint of revision 1 asked for; a
    revision that changes only scaling keeps its replicas and their slice. The same revision
    looked at again keeps what it had."""
    from autoscaler.policy import PolicyState

    revision = {"n": 1, "spec": SPEC}
    monkeypatch.setattr(_Functions, "functions", lambda self: {
        "digits": (spec_from_dict(revision["spec"]), revision["n"])})
    local = Local()
    hint = ScaleDecision(0, "SLICE", "duty 0.05 on a 0.25 slice -> 0.125", slice_fraction=0.125)
    got, states = [], []
    try:
        local.runner.run_until_complete(local.loop.scaler.apply(
            {"digits": Target(spec_from_dict(SPEC), 1, 0, hint)}, frozenset()))
        # the policy that asked for it, a duty average of a window begun at T0 - 300 (policy._slice_kept)
        local.loop.memory.policy["digits"] = PolicyState(slice_fraction=0.125, slice_at=T0 - 300, duty_avg=0.05,
                                                         duty_since=T0 - 300, duty_last=T0 - 1)
        for n, spec in ((1, SPEC), (2, {**SPEC, **change}), (2, {**SPEC, **change})):
            revision.update(n=n, spec=spec)
            local.load(0, 0)
            local.tick()
            got.append(local.loop.snapshots["digits"].slice_fraction)
            state = local.loop.memory.policy["digits"]
            states.append((state.slice_fraction, state.slice_at))
    finally:
        local.close()
    assert got == seen
    # the policy's state follows: on a slice it did not ask for its evidence starts again
    assert [s for s, _ in states] == seen
    if said:
        assert states[1][1] > states[0][1] == T0 - 300  # slice_at: the revision 2 look's time
    else:
        assert {at for _, at in states} == {T0 - 300}
    slices = [e[1] for e in local.events if e[0] == "slice"]
    assert slices[1:] == ([said] if said else []), slices


def test_the_policy_reads_a_table_carried_to_the_specs_largest_batch(monkeypatch):
    """The loop hands decide() the learned table through policy_table with the function's own
    max_batch_size (8 here): batches of 1 and 1.5 rows (4, 4.3 ms) carried on at 0.6 ms a row
    to 8 rows, 4.3 + 6.5 x 0.6 = 8.2 ms; with no batching declared (1), as learned."""
    got = {}
    for batching in ({"max_batch_size": 8}, None):
        spec = spec_from_dict(dict(SPEC, batching=batching) if batching else SPEC)
        monkeypatch.setattr(_Functions, "functions", lambda self, spec=spec: {"digits": (spec, 1)})
        local = Local()
        local.loop.memory.batch["digits"] = (0.25, ((1.0, 0.004), (1.5, 0.0043)))
        try:
            local.load(0, 0)
            local.tick()
        finally:
            local.close()
        got[bool(batching)] = local.loop.snapshots["digits"].batch_latency_s
    assert got[False] == ((1.0, 0.004), (1.5, 0.0043))
    assert len(got[True]) == 3 and got[True][2][0] == 8.0 and got[True][2][1] == pytest.approx(0.0082)


class _Two:
    broken = frozenset({"bad"})

    def functions(self):
        return {n: (spec_from_dict({**SPEC, "name": n}), 1) for n in ("a", "b")}


class _Keeps:
    """A scaler that records what each apply was told to keep as it runs."""

    def __init__(self) -> None:
        self.kept: list[frozenset[str]] = []

    def observe(self, functions):
        return {}

    def slice_for(self, spec):
        return 0.25

    async def apply(self, targets, keep=frozenset()):
        self.kept.append(keep)
        return {}


class _NoMetrics:
    def __init__(self) -> None:
        self.between: list[bool] = []

    async def read(self, wanted, now, between_ticks=False):
        self.between.append(between_ticks)
        return {}


@pytest.mark.parametrize("only, targets, kept", [
    # a full tick looks at a and b: only the unreadable spec is kept untouched
    (None, {"a", "b"}, {"bad"}),
    # a poke of a alone: b, not looked at, must be kept as it runs, never removed
    ({"a"}, {"a"}, {"bad", "b"}),
], ids=["full-tick", "poked-tick"])
def test_a_tick_keeps_what_it_did_not_look_at(only, targets, kept):
    scaler, metrics = _Keeps(), _NoMetrics()
    loop = Loop(_Two(), metrics, scaler, lambda *a, **k: None, CollectorRegistry())
    result = asyncio.run(loop.tick(T0, only=only))
    assert set(result.unread) == targets and scaler.kept == [frozenset(kept)]
    # the status API's `ticked_at` reads when the last full tick began; a poke is no tick
    assert loop.ticked_at == (T0 if only is None else None)
    # a poked look reads between ticks: it ends no window of the metrics (MetricsSource.read)
    assert metrics.between == [only is not None]


@pytest.mark.parametrize("fleet, looked", [
    (Fleet(replicas=1, ready=0), False),  # its cold start under way: the tick will look
    (Fleet(replicas=2, ready=1), False),  # one ready, one more starting
    (Fleet(replicas=1, ready=1), True),  # nothing starting (a replica failed beside it, say)
], ids=["starting", "ready-and-starting", "none-starting"])
def test_a_poke_looks_only_at_a_function_with_no_replica_starting(fleet, looked):
    # a and b poked: b is at zero and looked at now; a only when none of its replicas is starting,
    # else it waits for the tick, kept as it runs
    class Fleets(_Keeps):
        def observe(self, functions):
            return {"a": fleet}

    scaler, metrics = Fleets(), _NoMetrics()
    loop = Loop(_Two(), metrics, scaler, lambda *a, **k: None, CollectorRegistry())
    result = asyncio.run(loop.tick(T0, only={"a", "b"}))
    assert set(result.unread) == ({"a", "b"} if looked else {"b"})
    assert scaler.kept == [frozenset({"bad"} if looked else {"a", "bad"})]
    # a tick looks at both, starting or not
    result = asyncio.run(loop.tick(T0 + 1.0))
    assert set(result.unread) == {"a", "b"}


# ---------------------------------------------------------------------- shoal up --policy


POLICY_STEPS = [
    # policy, (held, in flight) -> (reason, replicas asked for)
    # KPA: 4 held, annotation target 2 x 70 % utilization = 1.4 per pod: ceil(4 / 1.4) = 3; 3 / 1
    # ready (at least 1) = 3 >= 2 (panic threshold 200 %): panic, which scales up at once (BURST)
    (Kpa(), (4, 0), ("BURST", 3)),
    # Ray Serve: 0 running, 4 ongoing: the cold-start fast path, max(ceil(1 x 1.0), target 0) = 1
    (RayServe(), (4, 0), ("COLD_START", 1)),
    # Shoal: 4 held, 2 per replica: ceil(4 / 2) = 2
    (Shoal(), (4, 0), ("COLD_START", 2)),
]


@pytest.mark.parametrize("policy, load, expected", POLICY_STEPS, ids=[p.name for p, _, _ in POLICY_STEPS])
def test_shoal_up_scales_a_function_from_zero_with_each_policy(policy, load, expected):
    local = Local(policy)
    try:
        local.load(*load)
        decision = local.tick()
        local.start_what_was_asked()
    finally:
        local.close()
    assert (decision.reason, decision.desired) == expected and local.replicas() == expected[1]
    scale = [e for e in local.events if e[0] == "scale"]
    assert [e[-1]["data"] for e in scale] == [{"from": 0, "to": expected[1], "reason": expected[0],
                                                "policy": policy.name}]
    assert local.registry.get_sample_value("shoal_controller_policy", {"policy": policy.name}) == 1.0
    # a cold start is a raise from zero replicas, once, however many replicas it asked for
    assert local.registry.get_sample_value("shoal_scale_from_zero_total", {"function": "digits"}) == 1.0
    assert local.loop.exported.cold_starts == {"digits": 1}  # what shoal up's status reads
    # what shoal up's status shows beside the decision: Shoal's need (4 held / 2 per replica) and
    # its reserve (no rise seen before this first one: none); the baselines' reasons say all
    assert local.loop.explain("digits") == ({"need": 2.0, "reserve": 0.0} if policy.name == "shoal" else {})
    assert local.loop.explain("nothing-looked-at") == {}


def test_a_scale_event_says_how_long_after_its_look_it_came():
    """shoal up's loop (`run`, with its clock) stamps each scale event with the seconds since the
    look that decided it, so a replay can time the look a request's poke made
    (loadtests.bench.simlive.live_poke_lag_s); a tick called alone, without run's clock, has none
    (the test above). The clock here steps 2.5 ms a read: the look reads it once, the event
    after it (the poke's wait and the tick's own reads between)."""
    local = Local()
    reads = iter(range(1_000_000))
    clock = lambda: 1000.0 + 0.0025 * next(reads)  # noqa: E731

    async def until_scaled():
        running = asyncio.ensure_future(local.loop.run(60.0, clock))
        local.loop.poke("digits")
        for _ in range(200):
            await asyncio.sleep(0.01)
            if any(e[0] == "scale" for e in local.events):
                break
        local.loop.stop()
        await running

    try:
        local.load(4, 0)
        local.runner.run_until_complete(until_scaled())
        local.start_what_was_asked()
    finally:
        local.close()
    data = [e[-1]["data"] for e in local.events if e[0] == "scale"][0]
    assert (data["from"], data["to"]) == (0, 2)
    # the look at one read of the clock, the event at a later one: whole steps of 2.5 ms after it
    steps = data["after_look_s"] / 0.0025
    assert steps >= 1 and steps == pytest.approx(round(steps))


def test_kpa_keeps_scaling_with_its_own_windows_through_the_loop():
    """Later ticks go on through the KPA's own state: 12 in flight on 3 ready, 1.4 per pod. Its
    windows average over the seconds since their first write: (4 + 0 + 12) / 3 s = 5.33 ->
    ceil(5.33 / 1.4) = 4; still in the panic the first tick began (it lasts a 60 s window): BURST."""
    local = Local(Kpa())
    try:
        local.load(4, 0)
        local.tick()
        local.start_what_was_asked()
        local.clock.t += 2  # the KPA decides every 2 s
        local.load(0, 12)
        decision = local.tick()
    finally:
        local.close()
    assert (decision.reason, decision.desired) == ("BURST", 4)


@pytest.mark.parametrize("argv, name", [([], "shoal"), (["--policy", "kpa"], "kpa"), (["--policy", "ray"], "ray")],
                         ids=["default", "kpa", "ray"])
def test_shoal_up_policy_flag(argv, name):
    args = build_parser().parse_args(argv)
    assert args.policy == name and policy_named(args.policy).name == name


def test_shoal_up_refuses_an_unknown_policy(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--policy", "knative"])
    assert exit_.value.code == 2 and "invalid choice: 'knative'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="policy 'knative' is not one of shoal, kpa, ray"):
        policy_named("knative")


def test_each_policy_says_how_long_it_keeps_an_idle_replica():
    """What the scaler prices a lent slice by (Target.keep_alive_s): KPA drains its 60 s stable
    window then waits its 30 s grace (90 s); Ray Serve its 600 s downscale delay; Shoal its own
    keep-alive, the spec's idle_to_zero_s (60 s) before it knows anything."""
    from autoscaler.policy import PolicyState
    from autoscaler.baselines import ray_serve
    from functions.spec import ScalingSpec

    spec = ScalingSpec()
    assert Kpa().keep_alive_s(Kpa().initial(spec, 0, 0.0), spec) == 90.0
    assert RayServe().keep_alive_s(ray_serve.RayState(), spec) == 600.0
    assert Shoal().keep_alive_s(PolicyState(), spec) == 60.0
