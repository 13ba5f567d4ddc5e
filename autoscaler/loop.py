"""The one control loop: a tick reads the functions (FunctionSource), what a scaler runs for them
(Scaler.observe), one metrics reading each (MetricsSource), asks its Policy (Shoal's `decide()` by
default, or a baseline: autoscaler.policies), and hands the counts to the scaler (Scaler.apply). `shoal up` (autoscaler.replicas.ReplicaScaler, per-replica scrapes)
and the cluster controller (the Kubernetes scaler, PromQL by function) run this same tick. What a
tick learns for the next (policy state, batch latencies, cold starts) and the controller metrics
(`shoal_scale_decisions_total`, `shoal_scale_from_zero_total`, `shoal_function_replicas`, which
policy runs) live here, once. The interfaces are
declared here, by their caller; imports neither deploy nor serving.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from autoscaler.coldstarts import ColdStarts, forget_others
from autoscaler.metrics import learn_batch_latency, rows_per_request, seed_batch_latency
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policies import Shoal
from autoscaler.policy import ScaleDecision
from functions.spec import FunctionSpec, ScalingSpec

log = logging.getLogger("shoal.loop")

# how long a new revision is held at its initial scale at most (Knative's progress deadline, 600 s
# by default: a revision that is not Ready by then fails; here its policy takes over)
INITIAL_DEADLINE_S = 600.0

Functions = dict[str, tuple[FunctionSpec, int]]  # name -> (spec, revision)
BatchTable = tuple[tuple[float, float], ...]  # ((requests per batch, seconds per batch), ...)
EventSink = Callable[..., None]  # (kind, message, function=None, data=None)


# ---------------------------------------------------------------------- what a tick needs


class FunctionSource(Protocol):
    broken: Collection[str]  # functions whose spec cannot be read now: what runs for them is kept

    def functions(self) -> Functions:
        """Every registered function with its revision."""


@dataclass(frozen=True)
class Fleet:
    """One function's replicas as its scaler has them."""

    replicas: int = 0  # asked for: starting and ready
    ready: int = 0
    draining: int = 0
    started_s: float | None = None  # create to ready of the newest replica, where the scaler timed it

    @property
    def starting(self) -> int:
        return max(0, self.replicas - self.ready)


class Reading(NamedTuple):
    """One function as a metrics source measured it: the snapshot, less what the loop learns
    (batch latencies, cold start, slice), the window's batches as (requests per batch, seconds
    per batch), None without a batch (metrics.batch_window), and what a replica's probe at its
    load timed."""

    snapshot: MetricsSnapshot
    batch: tuple[float, float] | None = None
    # a replica's probe at its load (metrics.seed_batch_latency): the slice it ran on (None: the
    # function's now) and its ((rows, seconds), ...); None when no replica read had one
    probe: tuple[float | None, BatchTable] | None = None
    rows: tuple[float, float] | None = None  # (batch rows, requests answered) over the window; None: none answered


class MetricsSource(Protocol):
    async def read(self, wanted: dict[str, tuple[FunctionSpec, Fleet]], now: float,
                   between_ticks: bool = False) -> dict[str, Reading]:
        """A reading per function whose metrics could be read; one left out keeps its count.
        A tick's reading ends the windows it reads over (in flight, rates, latencies since the
        last tick's); a look between ticks (`between_ticks`: a poke, by requests held, a replica
        that failed, a deploy) reads them without ending them, so the next tick's window is still
        a whole tick, as Knative's queue-proxy reports over fixed 1 s periods whatever the
        activator asks between."""


@dataclass(frozen=True)
class Target:
    spec: FunctionSpec
    revision: int
    desired: int
    decision: ScaleDecision | None = None  # None: the metrics were not read, the count is kept
    keep_alive_s: float | None = None  # how long the policy keeps an idle replica (None: the spec's idle_to_zero_s)


class Scaler(Protocol):
    def observe(self, functions: Functions) -> dict[str, Fleet]:
        """What runs, per function (and what died or lost its function is reaped)."""

    def slice_for(self, spec: FunctionSpec) -> float:
        """The share of a device the function's new replicas get now."""

    async def apply(self, targets: dict[str, Target], keep: frozenset[str]) -> dict[str, int]:
        """Make it so (`keep`: leave what runs for these alone); the functions whose replica
        count this changed, each with the count it had."""


class Policy(Protocol):
    """What decides a function's replica count from its snapshot: pure, `now` an argument, the
    state returned rather than changed: Shoal's or a baseline's (autoscaler.policies)."""

    @property
    def name(self) -> str:
        """What events and metrics call it: shoal, kpa, ray."""

    def initial(self, spec: ScalingSpec, ready: int, now: float) -> Any:
        """The state of a function at the loop's first look at it (`ready` replicas ready), and
        of a revision held at its initial scale when the hold begins and ends (Loop._raising:
        `ready` the initial scale, then the replicas ready)."""

    def decide(self, snapshot: MetricsSnapshot, spec: ScalingSpec, state: Any,
               now: float) -> tuple[ScaleDecision, Any]: ...

    def keep_alive_s(self, state: Any, spec: ScalingSpec) -> float:
        """How long it keeps an idle replica now (what the scaler prices a lent slice by)."""

    def explain(self, state: Any, now: float) -> dict[str, float]:
        """The numbers behind its last decision that `shoal status` shows (Shoal's need and
        reserve); empty where the reason says all."""


# ---------------------------------------------------------------------- what a tick learns


@dataclass
class Memory:
    """What the loop learns across ticks, per function."""

    policy: dict[str, Any] = field(default_factory=dict)  # the policy's state, per function
    batch: dict[str, tuple[float, BatchTable]] = field(default_factory=dict)  # (the slice it was learned on, table)
    probe: dict[str, tuple[float, BatchTable]] = field(default_factory=dict)  # (the slice it ran on, the probe)
    rows: dict[str, tuple[float, float]] = field(default_factory=dict)  # (batch rows, requests answered), summed
    cold: ColdStarts = field(default_factory=ColdStarts)
    # per function, (revision, since): the revision whose initial scale is being held since that
    # look, or was reached or given up (since None): then its policy decides (Loop._raising)
    initialized: dict[str, tuple[int, float | None]] = field(default_factory=dict)

    def learn(self, name: str, slice_fraction: float, window: tuple[float, float] | None,
              probe: tuple[float | None, BatchTable] | None = None, rows: tuple[float, float] | None = None,
              max_rows: float | None = None) -> BatchTable:
        """The function's batch latencies after this window; a table learned on another slice
        is carried to this one at the slice's speed (on_slice), then moved by what it runs.
        Returned seeded by the last probe of its replicas (metrics.seed_batch_latency, carried to
        this slice too, its sizes up to `max_rows`, while the windows' rows per request, summed,
        read one), which is kept apart: a window's learning never mixes with it."""
        learned_on, table = self.batch.get(name, (slice_fraction, ()))
        if learned_on != slice_fraction:
            table = on_slice(table, learned_on, slice_fraction)
        if window is not None:
            table = learn_batch_latency(table, *window)
        self.batch[name] = (slice_fraction, table)
        if probe is not None:
            self.probe[name] = (slice_fraction if probe[0] is None else probe[0], probe[1])
        if rows is not None:
            counted = self.rows.get(name, (0.0, 0.0))
            self.rows[name] = (counted[0] + rows[0], counted[1] + rows[1])
        if name not in self.probe:
            return table
        probed_on, points = self.probe[name]
        return seed_batch_latency(table, on_slice(points, probed_on, slice_fraction),
                                  rows_per_request(*self.rows.get(name, (0.0, 0.0))), max_rows)

    def keep_only(self, names: set[str]) -> None:
        forget_others(names, self.policy, self.batch, self.probe, self.rows, self.initialized)
        self.cold.keep_only(names)

    def clear(self) -> None:
        self.policy.clear()
        self.batch.clear()
        self.probe.clear()
        self.rows.clear()
        self.cold.clear()  # `initialized` is no window: a leader again does not raise a function anew


def on_slice(table: BatchTable, learned_on: float, slice_fraction: float) -> BatchTable:
    """A table learned on one slice as another would run it: each batch's seconds scaled by
    learned_on / slice_fraction, the speed the policy's slice hint assumes (a replica on half
    the slice serves at twice the time: policy._with_slice_hint). Dropping it instead left a
    function that batches read as one that does not until two sizes were learned again, its
    need jumping (0.05 to 0.5-0.8 replicas at 2-12 requests a second: docs/simlive.md, "Why
    at 1x") and the jump held as a rise. E.g. ((1, .040), (8, .120)) from 1/4 to 1/8:
    ((1, .080), (8, .240)). Empty for a slice not above zero."""
    if not (learned_on > 0 and slice_fraction > 0):
        return ()
    speed = learned_on / slice_fraction
    return tuple((rows, seconds * speed) for rows, seconds in table)


def policy_table(table: BatchTable, max_rows: int = 1) -> BatchTable:
    """A learned table as decide() reads it (the simulator reads its learned tables the same
    way): one of a single size says nothing of how a batch grows, so none until two; one whose
    largest size is under half the function's largest batch (`max_rows`, its max_batch_size:
    its replicas never had a queue) is carried on to it along the line through its smallest
    and largest sizes. A batcher with no queue delay runs the batches its load forms, so
    replicas that never had more than two requests queued teach nothing of batches of 8;
    sized on what they taught, the load is spread thinner and the batches get smaller still
    (docs/policy-changes.md, "shoal up's batcher"). The line overstates a batch that grows cheaper
    per row, and a larger batch, once one runs, is learned; two sizes close together carry
    their timing noise far (docs/benchmarks.md says how far). A table that reached half the
    largest batch, or whose larger size ran no slower, is read as learned. E.g. ((1, .040),
    (1.5, .0457)), max 8: .0457 + (8 - 1.5) x .0114 = .1198 s for 8 rows; ((1, .040),
    (4, .074)), max 8: as learned."""
    if len(table) < 2:
        return ()
    (r0, s0), (r1, s1) = table[0], table[-1]
    if 2 * r1 >= max_rows or r1 <= r0 or s1 <= s0:  # only a batch seen to grow is carried on
        return table
    return table + ((float(max_rows), s1 + (s1 - s0) / (r1 - r0) * (max_rows - r1)),)


class LoopMetrics:
    def __init__(self, registry: CollectorRegistry, policy: str):
        self.replicas = Gauge("shoal_function_replicas", "Replicas by state", ["function", "state"], registry=registry)
        self.decisions = Counter("shoal_scale_decisions", "Scale decisions that changed the replica count",
                                 ["function", "reason"], registry=registry)
        # one meaning of "cold start" for the controller, the load-test report and the simulator's
        # comparison: a function raised from zero replicas (replica starts are the scaler's events)
        self.from_zero = Counter("shoal_scale_from_zero", "Cold starts: a function raised from zero replicas",
                                 ["function"], registry=registry)
        # the same counts by function, read without collecting the registry (a status of 60
        # functions read through get_sample_value collected it 60 times: 94 % of shoal up's CPU)
        self.cold_starts: dict[str, int] = {}
        Gauge("shoal_controller_policy", "The scaling policy this controller runs (1)", ["policy"],
              registry=registry).labels(policy).set(1)


@dataclass
class TickResult:
    decisions: dict[str, ScaleDecision] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)  # functions whose metrics could not be read
    changed: dict[str, int] = field(default_factory=dict)  # function -> the count it had, where it changed


# ---------------------------------------------------------------------- the tick


class Loop:
    def __init__(self, functions: FunctionSource, metrics: MetricsSource, scaler: Scaler, events: EventSink,
                 registry: CollectorRegistry, policy: Policy = Shoal()):
        self.functions, self.metrics, self.scaler, self.events = functions, metrics, scaler, events
        self.policy = policy
        self.exported = LoopMetrics(registry, policy.name)
        self.memory = Memory()
        self.snapshots: dict[str, MetricsSnapshot] = {}
        self.decisions: dict[str, ScaleDecision] = {}
        self.looked_at: dict[str, float] = {}  # when each function's last decision was made
        self.ticked_at: float | None = None  # when the last full tick (not a poke) began, on its clock
        self._wake = asyncio.Event()
        self._poked: set[str] = set()
        self._stopping = False
        self._clock: Callable[[], float] | None = None  # run()'s: how long after its look an event came

    async def tick(self, now: float, only: set[str] | None = None) -> TickResult:
        """One look at every function (or only those in `only`: a poke), decided and applied.
        A poked function with a replica already starting is left to the next tick, as the
        simulator looks between ticks only at a function with no replica (`_hold_cold`): every
        request held through a cold start pokes, and a look for each would add the held count to
        the KPA's second once per request (`Buckets.record`) and weigh Shoal's next sample by the
        milliseconds since the last poke. E.g. 60 requests held in the 2 s a replica starts: one
        poked look, at the first, not 60 (and the two ticks' looks, as ever)."""
        if only is None:
            self.ticked_at = now
        functions = self.functions.functions()
        broken = frozenset(self.functions.broken)
        fleets = self.scaler.observe(functions)
        self.memory.keep_only(set(functions) | broken)
        names = sorted(functions) if only is None else sorted(
            n for n in only if n in functions and not (n in fleets and fleets[n].starting))
        readings = await self.metrics.read({n: (functions[n][0], fleets.get(n, Fleet())) for n in names}, now,
                                           between_ticks=only is not None)
        result = TickResult()
        targets = {n: self._target(n, *functions[n], fleets.get(n), readings.get(n), now, result) for n in names}
        # what this tick did not look at (unreadable specs, functions a poke left out) is kept as it runs
        result.changed = await self.scaler.apply(targets, broken | frozenset(set(functions) - set(names)))
        self._record(targets, result.changed)
        self._export(set(functions) | set(fleets), fleets)
        return result

    def _target(self, name: str, spec: FunctionSpec, revision: int, fleet: Fleet | None, reading: Reading | None,
                now: float, result: TickResult) -> Target:
        self.memory.cold.observe(name, now, fleet.ready if fleet else 0)  # also while metrics are unread
        if reading is None:  # metrics unreadable is not zero load: keep the count
            result.unread.append(name)
            return Target(spec, revision, fleet.replicas if fleet else spec.scaling.min_replicas)
        fleet = fleet or Fleet()
        snapshot = self._complete(name, spec, fleet, reading)
        state = self.memory.policy.get(name)
        raising, fresh = self._raising(name, spec.scaling, revision, fleet, now)
        if state is None or fresh:  # as if the initial replicas ran (KPA keeps its scale), or were ready now
            state = self.policy.initial(spec.scaling, max(fleet.ready, raising), now)
        decision, self.memory.policy[name] = self.policy.decide(snapshot, spec.scaling, state, now)
        if raising > decision.desired:
            decision = decision._replace(desired=raising, reason="INITIAL", detail=(
                f"initial scale {raising}: {fleet.ready} ready, {fleet.starting} starting"))
        self.memory.cold.ask(name, now, decision.desired, fleet.replicas, fleet.ready)
        self.snapshots[name] = snapshot
        self.decisions[name] = result.decisions[name] = decision
        self.looked_at[name] = now
        return Target(spec, revision, decision.desired, decision,
                      self.policy.keep_alive_s(self.memory.policy[name], spec.scaling))

    def _raising(self, name: str, scaling: ScalingSpec, revision: int, fleet: Fleet,
                 now: float) -> tuple[int, bool]:
        """(count, fresh): the count a new revision is held at, its initial_replicas until that
        many are ready at once, then 0, the policy's decision standing (Knative's initial-scale,
        applied per revision: the revision reaches it before it is Ready, then autoscales; Ray
        Serve's initial_replicas at each deploy); and whether the policy starts again at this
        look, as Knative's revision gets a decider of its own: when a hold begins (a new
        revision; the function's first look) and when it ends with the replicas ready, so its
        grace period or keep-alive counts from then (a model load longer than a keep-alive does
        not end in a stop the moment it is ready). A revision that does not reach it within
        INITIAL_DEADLINE_S of its first look (no slice, a replica that fails) is given up to its
        policy, with an event. With no request the replicas go as an idle function's do. E.g.
        initial 1: deploy at t = 0, a look at 0 asks 1 (the policy 0), ready at the look at 3 s,
        where the policy starts again; no request, idle_to_zero_s 60: to zero at the look at
        63 s. Kept per process: a controller started again (shoal up's restart, another leader's
        pod) raises a revision it has not seen ready once more, at most a keep-alive of idle
        replicas."""
        want = scaling.initial_replicas
        held = self.memory.initialized.get(name)
        fresh = False
        if held is None or held[0] != revision:
            held = self.memory.initialized[name] = (revision, now if want else None)
            fresh = want > 0
        since = held[1]
        if since is None:
            return 0, False
        if fleet.ready >= want:
            self.memory.initialized[name] = (revision, None)
            return 0, True
        if now - since >= INITIAL_DEADLINE_S:
            self.memory.initialized[name] = (revision, None)
            self.events("initial", f"initial scale {want} not reached in {INITIAL_DEADLINE_S:g} s ({fleet.ready} "
                                   f"ready): the policy decides from now on", function=name,
                        data={"initial_replicas": want, "ready": fleet.ready, "revision": revision})
            return 0, False
        return want, fresh

    def explain(self, name: str) -> dict[str, float]:
        """The policy's numbers behind `name`'s last decision (Policy.explain), at that look's
        time; empty before its first look."""
        state, at = self.memory.policy.get(name), self.looked_at.get(name)
        return {} if state is None or at is None else self.policy.explain(state, at)

    def _complete(self, name: str, spec: FunctionSpec, fleet: Fleet, reading: Reading) -> MetricsSnapshot:
        """The reading with what the loop learned: batch latencies (policy_table), the cold
        start, the slice."""
        slice_fraction = float(self.scaler.slice_for(spec))
        table = self.memory.learn(name, slice_fraction, reading.batch, reading.probe, reading.rows,
                                  spec.batching.max_batch_size)
        cold_s = fleet.started_s if fleet.started_s is not None else self.memory.cold.latest.get(name)
        return reading.snapshot._replace(slice_fraction=slice_fraction, deployed_slice=float(spec.slice.fraction),
                                         cold_start_s=cold_s,
                                         batch_latency_s=policy_table(table, spec.batching.max_batch_size))

    def _record(self, targets: dict[str, Target], changed: dict[str, int]) -> None:
        """An event and a count only when something was done."""
        for name, before in changed.items():
            decision = targets[name].decision
            if decision is None:
                continue
            self.exported.decisions.labels(name, decision.reason).inc()
            snapshot = self.snapshots.get(name)
            if before == 0 and decision.desired > 0 and snapshot is not None and snapshot.activator_queue > 0:
                # a cold start: a start from zero that requests waited for (a pre-warm is none), as
                # the simulator counts them
                self.exported.from_zero.labels(name).inc()
                self.exported.cold_starts[name] = self.exported.cold_starts.get(name, 0) + 1
            data = {"from": before, "to": decision.desired, "reason": decision.reason, "policy": self.policy.name}
            if self._clock is not None and name in self.looked_at:
                # the look's instant, as the seconds before this event (a replay's poke lag:
                # loadtests.bench.simlive.live_poke_lag_s)
                data["after_look_s"] = round(max(0.0, self._clock() - self.looked_at[name]), 6)
            self.events("scale", f"{before} -> {decision.desired} replicas: {decision.reason} {decision.detail}".strip(),
                        function=name, data=data)

    def _export(self, names: set[str], fleets: dict[str, Fleet]) -> None:
        for name in names:
            fleet = fleets.get(name, Fleet())
            for state, n in (("starting", fleet.starting), ("ready", fleet.ready), ("draining", fleet.draining)):
                self.exported.replicas.labels(name, state).set(n)

    # ------------------------------------------------------------------ shoal up's timing

    def poke(self, function: str) -> None:
        """Requests are waiting for `function`: reconcile it now, not at the next tick."""
        self._poked.add(function)
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self, tick_s: float, clock: Callable[[], float]) -> None:
        """A tick every `tick_s`; a poked function at once, without starving the others' tick."""
        self._clock = clock
        last_full = clock()
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, last_full + tick_s - clock()))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            poked, self._poked = self._poked, set()
            full = clock() - last_full >= tick_s
            if full:
                last_full = clock()
            try:
                await self.tick(clock(), only=None if full else poked)
            except Exception:  # a bad tick must not stop the control loop
                log.exception("controller tick failed")
