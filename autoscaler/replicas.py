"""The controller: the async loop from metrics to policy to placement to backend.

Every tick (1 s by default), or at once when the gateway pokes a function that
has requests waiting, it builds each function's MetricsSnapshot (the gateway's
in-flight and held counts, and each ready replica's /metrics), asks `decide()`
for the number of replicas, and reconciles: places and starts new replicas,
drains and stops surplus ones (newest first, so warm replicas keep serving).

It is written against narrow interfaces declared here and implemented in
`deploy/` (the local or Kubernetes backend, the gateway's routing table, the
registry): autoscaler imports nothing from serving or deploy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from autoscaler.metrics import (
    MetricsSnapshot,
    ReplicaStat,
    advance_window,
    batch_window,
    bucket_delta,
    duty_cycle,
    fraction_over,
    learn_batch_latency,
    merge_buckets,
    quantile,
    request_rate,
)
from autoscaler.placement import Demand, Inventory, Placement, Unplaceable, place
from autoscaler.policy import PolicyState, ScaleDecision, decide
from functions.spec import LIMITS, FunctionSpec, same_runtime

log = logging.getLogger("shoal.controller")


# ---------------------------------------------------------------------- what the controller needs


class ReplicaHandle(Protocol):
    host: str
    port: int


class ReplicaBackend(Protocol):
    async def create(self, replica_id: str, spec: FunctionSpec, placement: Placement) -> ReplicaHandle: ...
    async def wait_ready(self, handle: ReplicaHandle, timeout_s: float) -> tuple[float, float]:
        """Seconds from create to live (HTTP answering) and to ready (model loaded)."""
    async def stop(self, handle: ReplicaHandle, grace_s: float) -> None: ...
    def exited(self, handle: ReplicaHandle) -> int | None: ...


class Router(Protocol):
    def add_endpoint(self, function: str, replica: str, host: str, port: int,
                     spawn_s: float | None = None, load_s: float | None = None, uds: str | None = None) -> None: ...
    async def drain_endpoint(self, function: str, replica: str, timeout_s: float) -> bool: ...
    def remove_endpoint(self, function: str, replica: str) -> None: ...
    def forget(self, function: str) -> None: ...
    def fail_waiters(self, function: str, message: str) -> None: ...
    def held(self, function: str) -> int: ...
    def outstanding(self, function: str) -> int: ...


class MetricsSource(Protocol):
    # True when a failed scrape means the replica did not answer (a direct scrape), not
    # that a metrics store has no sample yet: the controller then judges liveness by it
    probes: bool

    async def scrape(self, replica: str, host: str, port: int, at: float) -> ReplicaStat | None: ...


class FunctionSource(Protocol):
    def functions(self) -> dict[str, tuple[FunctionSpec, int]]:
        """Every registered function with its revision."""


EventSink = Callable[..., None]  # (kind, message, function=None, data=None)


# ---------------------------------------------------------------------- state


@dataclass(eq=False)
class Replica:
    id: str
    function: str
    revision: int
    placement: Placement
    state: str = "starting"  # starting | ready | draining | stopped | failed
    handle: Any = None
    created_at: float = 0.0
    ready_at: float | None = None
    spec: FunctionSpec | None = None  # what it was started with
    seen_at: float = 0.0  # when it last answered a scrape
    stats: list[ReplicaStat] = field(default_factory=list)  # the last two scrapes


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    tick_s: float = 1.0
    ready_timeout_s: float = 120.0
    # a drain must outlast the longest request, or scale-down would cut requests off
    drain_timeout_s: float = LIMITS.request_timeout_s + 5.0
    stop_grace_s: float = LIMITS.graceful_shutdown_s
    # a ready replica that answers no scrape for this long is replaced (a liveness probe)
    unresponsive_s: float = 10.0

    def __post_init__(self) -> None:
        if self.drain_timeout_s < LIMITS.request_timeout_s:
            raise ValueError(f"drain_timeout_s ({self.drain_timeout_s}) must be >= request_timeout_s "
                             f"({LIMITS.request_timeout_s})")
        if self.tick_s <= 0:
            raise ValueError(f"tick_s ({self.tick_s}) must be > 0")


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.replicas = Gauge("shoal_function_replicas", "Replicas by state", ["function", "state"], registry=registry)
        self.decisions = Counter("shoal_scale_decisions", "Scale decisions that changed the replica count",
                                 ["function", "reason"], registry=registry)
        self.allocated = Gauge("shoal_slice_allocated_ratio", "Share of each device allocated to slices",
                               ["device", "emulated"], registry=registry)


class Controller:
    def __init__(
        self,
        source: FunctionSource,
        backend: ReplicaBackend,
        router: Router,
        metrics_source: MetricsSource,
        inventory: Inventory,
        events: EventSink,
        registry: CollectorRegistry,
        config: ControllerConfig = ControllerConfig(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.source = source
        self.backend = backend
        self.router = router
        self.metrics_source = metrics_source
        self.inventory = inventory
        self.events = events
        self.config = config
        self.clock = clock
        self.metrics = ControllerMetrics(registry)
        self.replicas: dict[str, Replica] = {}
        self.policy_state: dict[str, PolicyState] = {}
        self.last_decision: dict[str, ScaleDecision] = {}
        self.snapshots: dict[str, MetricsSnapshot] = {}
        self.cold_starts: dict[str, float] = {}
        self.batch_latency: dict[str, tuple[tuple[float, float], ...]] = {}  # learned from the replicas' batches
        self.slices: dict[str, Fraction] = {}  # the policy's slice-size hint, for replicas started from now on
        self.failures: dict[str, tuple[int, float]] = {}  # function -> (consecutive failures, retry not before)
        self._wake = asyncio.Event()
        self._poked: set[str] = set()
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        for device in inventory.devices:
            self.metrics.allocated.labels(device.id, str(device.emulated).lower()).set_function(
                lambda d=device.id: self.inventory.allocated_ratio(d)
            )

    # ------------------------------------------------------------------ loop

    def poke(self, function: str) -> None:
        """Requests are waiting for `function`: reconcile it now, not at the next tick."""
        self._poked.add(function)
        self._wake.set()

    async def run(self) -> None:
        last_full = self.clock()
        while not self._stopping:
            timeout = max(0.0, last_full + self.config.tick_s - self.clock())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            poked, self._poked = self._poked, set()
            # pokes reconcile their functions at once, but never starve the others' tick
            full = self.clock() - last_full >= self.config.tick_s
            if full:
                last_full = self.clock()
            try:
                await self.tick(only=None if full else poked)
            except Exception:  # a bad tick must not stop the control loop
                log.exception("controller tick failed")

    async def tick(self, only: set[str] | None = None) -> None:
        functions = self.source.functions()
        self._reap(functions)
        names = functions.keys() if only is None else [n for n in only if n in functions]
        await asyncio.gather(*(self.reconcile(n, *functions[n]) for n in names))
        self._export_counts(functions)

    async def reconcile(self, name: str, spec: FunctionSpec, revision: int) -> None:
        now = self.clock()
        snapshot = await self.snapshot(name, now, spec)
        self.snapshots[name] = snapshot
        state = self.policy_state.get(name, PolicyState())
        decision, self.policy_state[name] = decide(snapshot, spec.scaling, state, now)
        self._note_slice_hint(name, spec, decision)
        mine = self._live(name)
        current = len(mine)
        self.last_decision[name] = decision
        count, not_before = self.failures.get(name, (0, 0.0))
        if decision.desired > current and now < not_before:
            # crash-loop back-off: a replica of this revision failed to start moments ago
            self.router.fail_waiters(name, f"function {name!r} could not start a replica moments ago; "
                                           f"retrying in {not_before - now:.0f} s (see shoal events {name})")
            return
        if decision.desired != current:  # an event only when something is done
            self.metrics.decisions.labels(name, decision.reason).inc()
            self.events("scale", f"{current} -> {decision.desired} replicas: {decision.reason} {decision.detail}".strip(),
                        function=name, data={"from": current, "to": decision.desired, "reason": decision.reason})
        for _ in range(decision.desired - current):
            self._spawn_task(self.start_replica(name, spec, revision))
        if decision.desired < current:
            # newest first: the oldest replicas are warm and keep serving
            for replica in sorted(mine, key=lambda r: r.created_at, reverse=True)[: current - decision.desired]:
                self._spawn_task(self.stop_replica(replica, decision.reason))

    def slice_for(self, spec: FunctionSpec) -> Fraction:
        return self.slices.get(spec.name, Fraction(spec.slice.fraction))

    def _note_slice_hint(self, name: str, spec: FunctionSpec, decision: ScaleDecision) -> None:
        if decision.slice_fraction is None:
            return
        wanted = Fraction(decision.slice_fraction).limit_denominator(64)
        if wanted != self.slice_for(spec):
            self.slices[name] = wanted
            self.batch_latency.pop(name, None)  # measured on the old slice
            self.events("slice", f"new replicas get a {wanted.numerator}/{wanted.denominator} slice: {decision.detail}",
                        function=name, data={"slice": str(wanted), "reason": decision.reason})

    async def snapshot(self, name: str, now: float, spec: FunctionSpec | None = None) -> MetricsSnapshot:
        mine = self._live(name)
        ready = [r for r in mine if r.state == "ready"]
        stats = await asyncio.gather(*(self._scrape(r, now) for r in ready))
        duties, rps, deltas, queued = [], 0.0, [], 0.0
        busy = answered = batches = windows = 0.0
        moved = False  # some replica's window moved on: a scrape newer than the last look's
        for replica, stat in zip(ready, stats):
            if self._dead(replica, stat, now):
                continue
            if stat is None:
                continue
            moved = moved or not replica.stats or stat.at > replica.stats[-1].at
            replica.stats = advance_window(replica.stats, stat)
            stat = replica.stats[-1]
            prev = replica.stats[0] if len(replica.stats) == 2 else None
            queued += stat.queued
            if prev is not None:
                duties.append(duty_cycle(prev, stat))
                rps += request_rate(prev, stat)
                windows += stat.at - prev.at
                busy += max(0.0, stat.busy_s - prev.busy_s)
                answered += max(0.0, stat.completed - prev.completed)
                batches += max(0.0, stat.batches - prev.batches)
            deltas.append(bucket_delta(prev, stat))
        outstanding = self.router.outstanding(name)
        failed = sum(1 for r in ready if r.state == "failed")
        window = batch_window(batches, answered, busy)  # in requests, the unit of rps and in-flight
        if window is not None:
            self.batch_latency[name] = learn_batch_latency(self.batch_latency.get(name, ()), *window)
        learned = self.batch_latency.get(name, ())
        merged = merge_buckets(deltas)
        return MetricsSnapshot(
            function=name, at=now, ready=len(ready) - failed, starting=len(mine) - len(ready),
            inflight=float(outstanding), queued=queued, activator_queue=self.router.held(name),
            # the window's length, only when it is a new window: the same rates read again (Prometheus
            # has not scraped since) are no second measurement of the rate's variance
            duty=tuple(duties), rps=rps, window_s=windows / len(duties) if duties and moved else 0.0,
            p95_s=quantile(merged, 0.95),
            cold_start_s=self.cold_starts.get(name),
            slice_fraction=float(self.slice_for(spec)) if spec is not None else None,
            service_s=busy / answered if answered else None,
            batch_latency_s=learned if len(learned) > 1 else (),
            over_slo=fraction_over(merged, spec.scaling.slo_p95_ms / 1000.0) if spec is not None else 0.0,
        )

    def _dead(self, replica: Replica, stat: ReplicaStat | None, now: float) -> bool:
        """Liveness: a replica whose model has been inside one call past its function's
        timeout, or that has answered no scrape for `unresponsive_s`, is failed; the policy
        then starts another. Its requests were answered 504 by its own timer."""
        why = None
        timeout_s = replica.spec.timeout_s if replica.spec is not None else LIMITS.request_timeout_s
        if stat is not None:
            replica.seen_at = now
            if stat.stalled_s > timeout_s:
                why = f"its model has been inside one call for {stat.stalled_s:.1f} s (timeout {timeout_s:g} s)"
        elif getattr(self.metrics_source, "probes", False) and now - replica.seen_at > max(
                self.config.unresponsive_s, timeout_s):
            # silent: a frozen process, or a model call that holds the GIL; a busy replica gets
            # at least its function's timeout before it is judged
            why = f"it answered no scrape for {now - replica.seen_at:.1f} s"
        if why is None:
            return False
        replica.state = "failed"  # not counted from now on: the policy replaces it in this very tick
        self._spawn_task(self._fail(replica, f"{replica.id} is not live: {why}; replacing it"))
        return True

    async def _scrape(self, replica: Replica, now: float) -> ReplicaStat | None:
        try:
            return await self.metrics_source.scrape(replica.id, replica.handle.host, replica.handle.port, now)
        except Exception as exc:  # a replica that cannot be scraped is judged by its process state
            log.debug("scrape of %s failed: %s", replica.id, exc)
            return None

    # ------------------------------------------------------------------ replicas

    def _live(self, name: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.function == name and r.state in ("starting", "ready")]

    def _spawn_task(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def demand_for(self, spec: FunctionSpec, replica_id: str) -> Demand:
        kinds = ("emulated",) if _is_profile(spec) else ("gpu", "cpu")
        return Demand(replica_id, spec.name, self.slice_for(spec), spec.slice.memory_mib, kinds)

    async def start_replica(self, name: str, spec: FunctionSpec, revision: int) -> Replica | None:
        replica_id = f"{name}-{next(self._ids)}"
        placed = place(self.demand_for(spec, replica_id), self.inventory)
        if isinstance(placed, Unplaceable):
            message = f"cannot place a replica of {name}: {placed.message}"
            self.events("unplaceable", message, function=name, data={"reasons": list(placed.reasons)})
            if not self._live(name):  # nothing else will serve the held requests: say so now
                self._back_off(name)
                self.router.fail_waiters(name, message)
            return None
        self.inventory = self.inventory.allocate(placed)
        replica = Replica(replica_id, name, revision, placed, created_at=self.clock(), spec=spec)
        self.replicas[replica_id] = replica
        try:
            replica.handle = await self.backend.create(replica_id, spec, placed)
            if replica.state == "starting":
                live_s, ready_s = await self.backend.wait_ready(replica.handle, self.config.ready_timeout_s)
        except Exception as exc:
            if replica.state != "starting":  # stopped on purpose while starting: not a failure
                await self._finish_stop(replica, "stopped while starting")
                return None
            message = f"replica {replica_id} failed to start: {exc}"
            await self._fail(replica, message)
            if not self._live(name):
                self._back_off(name)
                self.router.fail_waiters(name, message)
            return None
        if replica.state != "starting":  # stopped while it was starting
            await self._finish_stop(replica, "stopped while starting")
            return None
        self.failures.pop(name, None)
        replica.state, replica.ready_at = "ready", self.clock()
        replica.seen_at = replica.ready_at
        self.cold_starts[name] = ready_s
        self.router.add_endpoint(name, replica_id, replica.handle.host, replica.handle.port,
                                 spawn_s=live_s, load_s=max(0.0, ready_s - live_s),
                                 uds=getattr(replica.handle, "uds", None))
        self.events("replica_ready", f"{replica_id} ready in {ready_s:.3f} s on {placed.device.id} "
                    f"slice {_slice(placed)}{' (emulated)' if placed.device.emulated else ''}",
                    function=name, data={"replica": replica_id, "ready_s": ready_s, "spawn_s": live_s,
                                         "device": placed.device.id, "cpus": list(placed.cpus)})
        return replica

    def _back_off(self, name: str) -> None:
        """Wait 1, 2, 4 ... 30 s before trying again, like a Kubernetes CrashLoopBackOff."""
        count = self.failures.get(name, (0, 0.0))[0] + 1
        self.failures[name] = (count, self.clock() + min(30.0, 2.0 ** (count - 1)))

    async def stop_replica(self, replica: Replica, reason: str) -> None:
        if replica.state in ("draining", "stopped", "failed"):
            return
        was_ready = replica.state == "ready"
        replica.state = "draining"
        if not was_ready:
            return  # still starting: start_replica sees the state and finishes the stop
        # a drain outlasts the longest request the function allows
        drain_s = max(self.config.drain_timeout_s, (replica.spec.timeout_s + 5.0) if replica.spec else 0.0)
        drained = await self.router.drain_endpoint(replica.function, replica.id, drain_s)
        if not drained:
            log.warning("%s did not drain in %.0f s", replica.id, drain_s)
        self.router.remove_endpoint(replica.function, replica.id)
        await self._finish_stop(replica, reason)

    async def _finish_stop(self, replica: Replica, reason: str) -> None:
        if replica.handle is not None:
            await self.backend.stop(replica.handle, self.config.stop_grace_s)
        replica.state = "stopped"
        self.inventory = self.inventory.release(replica.id)
        self.replicas.pop(replica.id, None)
        self.events("replica_stopped", f"{replica.id} stopped ({reason})", function=replica.function,
                    data={"replica": replica.id, "reason": reason})

    async def _fail(self, replica: Replica, message: str) -> None:
        replica.state = "failed"
        self.router.remove_endpoint(replica.function, replica.id)
        if replica.handle is not None and self.backend.exited(replica.handle) is None:
            await self.backend.stop(replica.handle, 1.0)
        self.inventory = self.inventory.release(replica.id)
        self.replicas.pop(replica.id, None)
        self.events("replica_failed", message, function=replica.function, data={"replica": replica.id})

    def _reap(self, functions: dict[str, tuple[FunctionSpec, int]]) -> None:
        """Replicas whose process died, or whose function was removed or changed."""
        for replica in list(self.replicas.values()):
            if replica.state not in ("starting", "ready"):
                continue
            if replica.function not in functions:
                self._spawn_task(self.stop_replica(replica, "function removed"))
            elif functions[replica.function][1] != replica.revision and not self._keeps(replica, functions):
                self._spawn_task(self.stop_replica(replica, "function updated"))
            elif replica.handle is not None and (code := self.backend.exited(replica.handle)) is not None:
                self._spawn_task(self._fail(replica, f"{replica.id} exited with status {code}"))
        for name in list(self.policy_state):
            if name not in functions:
                self.policy_state.pop(name, None)
                self.slices.pop(name, None)
                self.router.forget(name)

    @staticmethod
    def _keeps(replica: Replica, functions: dict[str, tuple[FunctionSpec, int]]) -> bool:
        """A new revision that only changes scaling keeps the running replicas."""
        spec, revision = functions[replica.function]
        if replica.spec is None or not same_runtime(replica.spec, spec):
            return False
        replica.revision, replica.spec = revision, spec
        return True

    def _export_counts(self, functions) -> None:
        for name in functions:
            counts = {"starting": 0, "ready": 0, "draining": 0}
            for r in self.replicas.values():
                if r.function == name and r.state in counts:
                    counts[r.state] += 1
            for state, n in counts.items():
                self.metrics.replicas.labels(name, state).set(n)

    async def shutdown(self) -> None:
        """Drain and stop every replica (graceful `shoal up` exit)."""
        self._stopping = True
        self._wake.set()
        await asyncio.gather(*(self.stop_replica(r, "shutdown") for r in list(self.replicas.values())),
                             return_exceptions=True)

    # ------------------------------------------------------------------ views

    def status(self) -> dict[str, Any]:
        out = {}
        for name, snap in self.snapshots.items():
            decision = self.last_decision.get(name)
            out[name] = {
                "ready": snap.ready, "starting": snap.starting, "inflight": snap.inflight,
                "held": snap.activator_queue, "rps": snap.rps, "p95_s": snap.p95_s,
                "desired": decision.desired if decision else None,
                "reason": decision.reason if decision else None,
                "replicas": [self._replica_view(r) for r in self.replicas.values() if r.function == name],
            }
        return out

    def _replica_view(self, r: Replica) -> dict[str, Any]:
        duty = duty_cycle(r.stats[0], r.stats[1]) if len(r.stats) == 2 else None
        return {
            "id": r.id, "state": r.state, "device": r.placement.device.id,
            "emulated": r.placement.device.emulated, "slice": _slice(r.placement), "cpus": list(r.placement.cpus),
            "port": getattr(r.handle, "port", None), "duty": duty,
            "inflight": r.stats[-1].inflight if r.stats else 0.0,
        }


def _slice(placement: Placement) -> str:
    f = placement.fraction
    return f"{f.numerator}/{f.denominator}"


def _is_profile(spec: FunctionSpec) -> bool:
    if spec.loader is not None:
        return spec.loader == "profile"
    return spec.artifact.lower().endswith((".yaml", ".yml"))
