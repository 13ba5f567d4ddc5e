"""Replicas that shoal up starts itself: the loop's Scaler (`ReplicaScaler`) for the local platform.

It places each new replica on a slice, starts it through a `ReplicaBackend`, adds it to the
gateway's routing table when ready, and drains and stops surplus ones, newest first (warm replicas
keep serving); a replica that cannot be placed takes slices back in the same tick from other
functions' idle replicas (autoscaler.lending chooses them), and a function's first replica that
still cannot, with requests waiting, time-shares a device whose compute is held but mostly not
busy (`SliceCluster.place_shared`, by the duty its replicas were scraped at), else takes a busy
function's replica: its headroom above its need, read from its replicas' scrapes, else a needed
one, never its floor (a further replica within its function's need takes only headroom); a
ready replica on a larger slice than its policy now asks is moved (a replica on the asked slice
starts, then the old one drains: lending.to_move); it reaps replicas that died or whose function
went away, and backs off a function whose replicas fail to start.
Written against interfaces declared here and implemented in `deploy.local` (the backend) and
`serving` (the gateway): imports neither.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily

from autoscaler.lending import (
    HEADROOM, IDLE, NEED, RANKS, Hold, Idle, Rate, Short, TakeBack, Want, held_need, idle_holds, need_of,
    observe_rate, replica_rank, share, to_move, trim_to_window, want_asks,
)
from autoscaler.loop import EventSink, Fleet, Target
from autoscaler.metrics import ReplicaStat, duty_cycle, request_rate
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.placement import Demand, Inventory, Placement, SliceCluster, Status, Unplaceable
from autoscaler.policy import DEFAULT_CONFIG, ScaleDecision
from functions.spec import LIMITS, FunctionSpec, same_runtime

log = logging.getLogger("shoal.controller")
MOVE_RETRY_S = 60.0  # a replica that failed to start on a smaller slice: the next move not before this
UNSERVED_GRACE_S = 1.0  # SIGTERM to SIGKILL for a replica that serves nothing: never ready, or failed
# a busy replica is ranked by its function's most need over this (lending.held_need): the delay
# window of the policy's defaults, as need_of's max duty is read from them (the simulator reads
# both from the policy it runs)
NEED_WINDOW_S = DEFAULT_CONFIG.scale_down_delay_s


# ---------------------------------------------------------------------- what the scaler needs


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
    def inflight_seconds(self, function: str) -> tuple[float, float]: ...


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
    active_at: float = 0.0  # when a scrape last saw it answer or hold a request (from ready on)
    counted: float = 0.0  # its answered requests already added to its function's rate
    moving_from: str | None = None  # the replica it replaces on a smaller slice, until it is ready (_move)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # set once stopped or failed
    stop_reason: str = ""  # why it stops, where its bring-up says it (a start called off: _take)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    tick_s: float = 1.0
    ready_timeout_s: float = 120.0
    # a drain must outlast the longest request, or scale-down would cut requests off
    drain_timeout_s: float = LIMITS.request_timeout_s + 5.0
    stop_grace_s: float = LIMITS.graceful_shutdown_s
    # a ready replica that answers no scrape for this long is replaced (a liveness probe)
    unresponsive_s: float = 10.0
    # a replica that cannot be placed takes slices back from other functions' idle replicas, or
    # busy ones ranked below it (autoscaler.lending.share)
    take_back: bool = True
    # a function's first replica that nothing frees a slice for time-shares a device whose
    # replicas are busy at most this share of its compute (0: never)
    time_share_busy: float = 0.5
    # a ready replica on a larger slice than its function's replicas now get (the policy's slice
    # hint) is moved to that slice: one starts on it, then the old one drains (lending.to_move)
    move_to_slice: bool = True
    rate_window_s: float = 120.0  # a function's request rate, for the cost of taking its slice, over this

    def __post_init__(self) -> None:
        if self.drain_timeout_s < LIMITS.request_timeout_s:
            raise ValueError(f"drain_timeout_s ({self.drain_timeout_s}) must be >= request_timeout_s "
                             f"({LIMITS.request_timeout_s})")
        if self.tick_s <= 0:
            raise ValueError(f"tick_s ({self.tick_s}) must be > 0")
        if not 0 <= self.time_share_busy <= 1:
            raise ValueError(f"time_share_busy ({self.time_share_busy}) must be within [0, 1]")


class ReplicaScaler:
    """The loop's Scaler for replicas it starts itself: places them, starts them through the
    backend, drains and stops them, newest first (warm replicas keep serving)."""

    def __init__(
        self,
        backend: ReplicaBackend,
        router: Router,
        inventory: Inventory,
        events: EventSink,
        registry: CollectorRegistry,
        config: ControllerConfig = ControllerConfig(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.backend = backend
        self.router = router
        self.cluster = SliceCluster.from_inventory(inventory)  # the one placement state
        self.events = events
        self.config = config
        self.clock = clock
        self.replicas: dict[str, Replica] = {}
        self.cold_starts: dict[str, float] = {}  # function -> create to ready of its newest replica
        self.slices: dict[str, Fraction] = {}  # the policy's slice-size hint, for replicas started from now on
        self.failures: dict[str, tuple[int, float]] = {}  # function -> (consecutive failures, retry not before)
        self.unplaced: dict[str, float] = {}  # function -> since when its replica waits for a slice to be lent
        self.rates: dict[str, Rate] = {}  # function -> its answered requests, weighted over rate_window_s
        self.keep_alive: dict[str, float] = {}  # function -> how long its policy keeps an idle replica
        # function -> when a scrape last saw one of its replicas answer or hold a request (kept across
        # scale-to-zero, as its rate is; none before its first request, as the simulator's _active_at):
        # what a replica of it still starting is priced from (_idle)
        self.active_at: dict[str, float] = {}
        self.short_said: dict[str, float] = {}  # function -> when a held_short event last said it
        self.no_move_before: dict[str, float] = {}  # function -> a move failed to start: none again until
        self.device_busy: dict[str, float] = {}  # device -> its replicas' duty x slice, summed, at the last look
        # function -> its need (_traffic_and_need) at each look over the policy's delay window: what its
        # busy replicas are ranked by when the cluster is shared (lending.held_need)
        self.needs: dict[str, deque[tuple[float, float]]] = {}
        self._seen: dict[str, tuple[FunctionSpec, int]] = {}  # the functions of the last look
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self.takebacks = Counter("shoal_slice_takebacks", "Slices taken back from another function's replica "
                                 "(idle, or busy and ranked below the ask) for a replica that could not be "
                                 "placed, by function and role (took or gave)",
                                 ["function", "role"], registry=registry)
        self.time_shared = Counter("shoal_time_shared", "First replicas placed beyond a device's compute, "
                                   "time-sharing it, for requests no free or lent slice could serve",
                                   ["function", "device"], registry=registry)
        self.held_short = Counter("shoal_held_short", "Replicas a function wanted that the full cluster could not "
                                  "place, by function and rank (floor, headroom: what the replica would serve)",
                                  ["function", "rank"], registry=registry)
        # function -> slice-seconds its replicas held until their slices were freed (_release)
        self.released_slice_s: dict[str, float] = {}
        registry.register(_SliceSeconds(self.slice_use))
        allocated = Gauge("shoal_slice_allocated_ratio", "Share of each device allocated to slices",
                          ["device", "emulated"], registry=registry)
        for device in inventory.devices:
            allocated.labels(device.id, str(device.emulated).lower()).set_function(
                lambda d=device.id: self.cluster.allocated_ratio(d)
            )

    # ------------------------------------------------------------------ the loop's Scaler

    def observe(self, functions: dict[str, tuple[FunctionSpec, int]]) -> dict[str, Fleet]:
        self._reap(functions)
        return {name: self._fleet(name) for name in functions}

    def _fleet(self, name: str) -> Fleet:
        counts = {"starting": 0, "ready": 0, "draining": 0}
        for r in self.replicas.values():
            if r.function == name and r.state in counts and r.moving_from is None:
                counts[r.state] += 1
        return Fleet(counts["starting"] + counts["ready"], counts["ready"], counts["draining"],
                     self.cold_starts.get(name))

    async def apply(self, targets: dict[str, Target], keep: frozenset[str] = frozenset()) -> dict[str, int]:
        changed = {}
        starts: list[tuple[str, FunctionSpec, int]] = []
        self._note_activity(self.clock())
        # each function's traffic and need from the replicas' last scrapes, read once a look: kept
        # for the delay window and, with starts, what ranks the busy replicas they may take
        measured = self._traffic_and_need() if self.config.take_back else None
        if measured is not None:
            self._note_needs(self.clock(), measured[1])
        moves: list[tuple[str, FunctionSpec, int]] = []
        for name, target in targets.items():
            if target.keep_alive_s is not None:
                self.keep_alive[name] = target.keep_alive_s
            before = self._scale(name, target, starts, moves)
            if before is not None:
                changed[name] = before
        self._start(starts, measured)
        for move in moves:  # in the room the tick's starts left
            self._move(*move)
        for name, before in list(changed.items()):  # a start held short (no slice yet) changed nothing
            decision = targets[name].decision
            if decision is not None and decision.desired > before and len(self.live(name)) == before:
                del changed[name]
        return changed

    def _scale(self, name: str, target: Target, starts: list[tuple[str, FunctionSpec, int]],
               moves: list[tuple[str, FunctionSpec, int]]) -> int | None:
        """Stop replicas of one function (as tasks), or add the ones to start to `starts`, or a
        move to its slice to `moves` (a move under way called off if the look changes it); the
        count it had, if it changes."""
        decision, spec = target.decision, target.spec
        if decision is None:
            return None
        self._note_slice_hint(name, spec, decision)
        mine = self.live(name)
        current = len(mine)
        count, not_before = self.failures.get(name, (0, 0.0))
        now = self.clock()
        if decision.desired > current and now < not_before:
            # crash-loop back-off: a replica of this revision failed to start moments ago
            self.router.fail_waiters(name, f"function {name!r} could not start a replica moments ago; "
                                           f"retrying in {not_before - now:.0f} s (see shoal events {name})")
            return None
        steady = decision.desired == current
        if self.config.move_to_slice and not self._moving(name, spec, steady) and steady:
            moves.append((name, spec, target.revision))
        starts += [(name, spec, target.revision)] * max(0, decision.desired - current)
        if decision.desired < current:
            # newest first: the oldest replicas are warm and keep serving
            for replica in sorted(mine, key=lambda r: r.created_at, reverse=True)[: current - decision.desired]:
                self._spawn_task(self.stop_replica(replica, decision.reason))
        return current if decision.desired != current else None

    def _moving(self, name: str, spec: FunctionSpec, steady: bool) -> bool:
        """Whether a move of the function goes on (steady, to the slice asked, from a replica
        still ready); one that does not is called off at once, before its replica can take over
        (_bring_up), so a look that scales the function never loses the old replica with it."""
        asked = self.slice_for(spec)
        going = False
        for r in self.replicas.values():
            if r.function == name and r.moving_from is not None and r.state == "starting":
                old = self.replicas.get(r.moving_from)
                if steady and r.placement.fraction == asked and old is not None and old.state == "ready":
                    going = True
                else:
                    r.state = "draining"  # stop_replica's, for one starting: _bring_up finishes the stop
        return going

    def _move(self, name: str, spec: FunctionSpec, revision: int) -> None:
        """A ready replica on a larger slice than the function's replicas now get, moved to that
        slice (lending.to_move), for a function whose look this tick neither scaled it nor has a
        replica of it starting: a replica on it starts where a slice is free after the tick's
        starts, unseen by the policy (not live, not in the fleet) until it is ready; then it
        serves and the old one drains and stops (_bring_up). A look that scales the function, or
        asks another slice, or the old replica gone calls the move off (_moving); a move whose
        replica failed is not tried again for MOVE_RETRY_S."""
        if self.clock() < self.no_move_before.get(name, -math.inf):
            return
        mine = self.live(name)
        if not all(r.state == "ready" for r in mine):
            return
        i = to_move([float(r.placement.fraction) for r in mine], float(self.slice_for(spec)))
        if i is None:
            return
        old = mine[i]
        placed = self.cluster.place(self.demand_for(spec, f"{name}-{next(self._ids)}"))
        if isinstance(placed, Unplaceable):
            return
        replica = self._register(placed, spec, revision)
        replica.moving_from = old.id
        self.events("slice", f"{replica.id} starts on a {_slice(placed)} slice to take over from {old.id} "
                             f"on {_slice(old.placement)}, which then drains", function=name,
                    data={"replica": replica.id, "from": old.id, "slice": _slice(placed)})
        self._spawn_task(self._bring_up(replica))

    # ------------------------------------------------------------------ starts, with slices lent back

    def _start(self, starts: list[tuple[str, FunctionSpec, int]],
               measured: tuple[dict[str, float], dict[str, float]] | None) -> None:
        """Place this tick's new replicas as autoscaler.lending.share grants them: first replicas of
        functions before further ones, then the most requests held first; one that does not fit
        takes slices back from other functions' idle replicas (`_idle`; drained and stopped, it
        starts once they are), so keep-alive holds only capacity nobody is waiting for. A
        function's first replica that only a kept replica (one whose loss likely costs a late
        request) or a busy one could make room for time-shares a quiet device instead, if there is
        one (`_time_share`); else it takes them, lowest rank first: a busy function's replica above
        its need (its headroom: `_busy_holds`), then a kept one, then a busy function's needed
        replica; never a floor. A further replica is ranked as the simulator ranks it
        (_further_ranks): one within its function's need of now takes cheap idle replicas and
        another busy function's headroom (a replica above that function's most need over the delay
        window: held_need), one above it only cheap idle ones. One held short is said (a
        `held_short` event, at most every 30 s per function, and a metric). The first of a
        function's asks that cannot be placed ends its tries for the tick, said once with the
        count left (the simulator's _start stops at its first too): a policy that asks for
        hundreds more than fit (kpa's panic mode) costs one placement and one event a tick.
        `measured`: the look's _traffic_and_need (None without take-backs)."""
        if not starts:
            return
        now = self.clock()
        first = {name for name, _, _ in starts if not self.live(name)}
        wants: dict[str, tuple[Want, FunctionSpec, int]] = {}
        for name, spec, rev in starts:
            want = Want(self.demand_for(spec, f"{name}-{next(self._ids)}"), self.router.held(name), name in first)
            wants[want.demand.replica] = (want, spec, rev)
            first.discard(name)
        asks = want_asks([w for w, _, _ in wants.values()],
                         self._further_ranks(wants.values(), *measured) if measured is not None else None)
        holds, found = (idle_holds(self._idle(now, {name for name, _, _ in starts}), now) if self.config.take_back
                        else ([], {}))  # nothing taken back: the same order, every ask as it fits
        if measured is not None:  # busy replicas: ranked headroom or need by their function's held need
            traffic, need = measured
            ranked = {name: held_need(n, self.needs.get(name, ()), now, NEED_WINDOW_S) for name, n in need.items()}
            holds += self._busy_holds(traffic, ranked, {h.replica for h in holds})
        # first replicas: what is cheap to take first; then a quiet device time-shared; then what was
        # kept, or busy above or within its function's need. Further replicas go in the last pass,
        # after them: a needed one takes idle replicas and busy headroom, headroom only idle ones
        pools = [[h for h in holds if h.rank == IDLE], holds] if self.config.time_share_busy > 0 else [holds]
        later = [a for a in asks if not wants[a.demand.replica][0].first] if len(pools) > 1 else []
        asks = [a for a in asks if a not in later]
        for k, pool in enumerate(pools):
            last = k == len(pools) - 1
            shares = share(self.cluster, asks + later if last else asks, [h for h in pool if h.replica in self.cluster])
            short = {h.demand.replica for h in shares.short}
            for g in shares.grants:
                self._grant(wants[g.demand.replica], g.victims, found)
            unplaced: set[str] = set()
            for i, held in enumerate(shares.short):
                want, spec, revision = wants[held.demand.replica]
                name = held.demand.function
                if k == 0 and (replica := self._time_share(want, spec, revision, held)) is not None:
                    self._spawn_task(self._bring_up(replica))
                    short.discard(held.demand.replica)
                elif last:
                    self._say_held_short(held, want, now)  # counted for each, said every 30 s
                    if name in unplaced:
                        # the same slice as an ask of this tick that did not fit: not tried
                        # (placing only uses room up), and said with that one's count
                        continue
                    left = sum(1 for h in shares.short[i:] if h.demand.function == name)
                    if (replica := self._place(want.demand, spec, revision, left)) is not None:
                        self._spawn_task(self._bring_up(replica))
                    else:  # says why
                        unplaced.add(name)
            asks = [a for a in asks if a.demand.replica in short]

    def _further_ranks(self, wants: Iterable[tuple[Want, FunctionSpec, int]], traffic: dict[str, float],
                       need: dict[str, float]) -> dict[str, tuple[int, float]]:
        """Each further replica's rank and value as the simulator ranks its asks
        (lending.replica_rank: the k-th of its function, k counting its live replicas and then
        this tick's asks in turn, at the function's need of now, the cold start measured), by
        replica; none for a function not measured yet (no replica scraped twice): want_asks
        ranks it headroom. E.g. f at 40 requests a second needing 2, with one replica, asks two
        more: the 2nd NEED, the 3rd HEADROOM."""
        ranked: dict[str, tuple[int, float]] = {}
        placed: dict[str, int] = {}
        for want, spec, _ in wants:
            name = want.demand.function
            if name not in traffic:
                continue
            k = placed.get(name, len(self.live(name))) + 1
            placed[name] = k
            if want.first:
                continue
            ranked[want.demand.replica] = replica_rank(
                k, traffic[name], need[name], float(want.demand.fraction),
                self.cold_starts.get(name, DEFAULT_CONFIG.default_cold_start_s), spec.scaling.slo_p95_ms / 1000.0)
        return ranked

    def _traffic_and_need(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per function with ready replicas scraped twice: the requests a second that reached its
        replicas in their last window (answered, plus the rise of those in flight or queued: each
        request counted once, however long it runs) with those held at the gateway now, and the
        replicas that carry its work at the policy's max duty (lending.need_of), as the simulator
        reads both from its tick (Simulation._traffic_and_need). The work is what the window's
        arrivals brought: their rate x the seconds a request kept a replica busy (busy seconds
        over requests answered), not the replicas' duty, which a backlog holds at 1 whatever the
        arrivals (a function draining one would read a replica more than it has, and none of its
        replicas would be headroom); with nothing answered in the window, its busy seconds. E.g.
        41 requests a second of 20 ms: 0.82 busy seconds a second, at max duty 0.9 one replica."""
        busy: dict[str, float] = {}
        answered: dict[str, float] = {}
        arrived: dict[str, float] = {}
        for r in self.replicas.values():
            if r.state != "ready" or len(r.stats) < 2 or r.stats[1].at <= r.stats[0].at:
                continue
            prev, cur = r.stats
            elapsed = cur.at - prev.at
            came = cur.completed - prev.completed + cur.inflight + cur.queued - prev.inflight - prev.queued
            busy[r.function] = busy.get(r.function, 0.0) + max(0.0, cur.busy_s - prev.busy_s) / elapsed
            answered[r.function] = answered.get(r.function, 0.0) + request_rate(prev, cur)
            arrived[r.function] = arrived.get(r.function, 0.0) + max(0.0, came) / elapsed
        traffic = {name: rps + self.router.held(name) / self.config.tick_s for name, rps in arrived.items()}
        work = {name: arrived[name] * busy[name] / answered[name] if answered[name] > 0 else busy[name]
                for name in arrived}
        need = {name: need_of(work[name], DEFAULT_CONFIG.max_duty, traffic[name] > 0) for name in traffic}
        return traffic, need

    def _note_needs(self, now: float, needs: dict[str, float]) -> None:
        """Each deployed function's need at this look (`needs`, _traffic_and_need's; only those of
        the last observe(): a removed function's replicas still serve until they have drained),
        kept over the policy's scale-down delay (as the simulator keeps each tick's:
        Simulation._needs), for lending.held_need."""
        need = {name: n for name, n in needs.items() if name in self._seen}
        for name in set(need) | set(self.needs):
            kept = self.needs.setdefault(name, deque())
            if name in need:
                kept.append((now, need[name]))
            trim_to_window(kept, now, NEED_WINDOW_S)
            if not kept:
                del self.needs[name]

    def _busy_holds(self, traffic: dict[str, float], need: dict[str, float], idle: set[str]) -> list[Hold]:
        """The replicas, ready or starting, of functions with requests, but for the idle ones
        (`idle`: idle_holds has them), ranked by what they serve (lending.replica_rank, `need`
        each function's most over the policy's delay window: lending.held_need), as the
        simulator ranks a function's replicas in a tick with traffic (Simulation._holds): a
        function's replicas with a request in flight or queued at their last scrape counted
        first, ready oldest first, those between requests last (live's own order: the simulator
        counts ready ones oldest first whatever they run), so those are its headroom and a busy
        one is its floor while it has one (two asks in a tick cannot take a replica between
        requests and its busy floor both; the one taken has no request to drain). Only NEED and
        HEADROOM ones: a floor is never taken, and one a window of no requests would rank idle is
        not lent here (_idle says when one is). Until 2026-12-01 a busy function's replica
        between requests was lent as idle, priced by its take-back cost (IDLE or KEPT by the
        scrape's moment), where the simulator ranks it by its function's need.
        A replica still starting counts after the busy ready ones, as the simulator counts it
        after the ready ones (Simulation._holds), so it is its function's newest busy one: taken,
        its start is called off (_take). (Before one between requests, unlike the simulator: a
        function with a replica between requests and one starting keeps the starting one as its
        floor, and the other may be lent.) One that takes over from another (_move) is not
        ranked."""
        mine: dict[str, list[Replica]] = {}
        for r in self.replicas.values():
            if (r.state in ("starting", "ready") and r.moving_from is None and r.id in self.cluster
                    and traffic.get(r.function, 0.0) > 0):
                mine.setdefault(r.function, []).append(r)
        holds = []
        for name, replicas in mine.items():
            replicas.sort(key=lambda r: (r.id in idle or _between_requests(r), r.state != "ready", r.ready_at or 0.0,
                                         r.created_at))
            cold_s = self.cold_starts.get(name, DEFAULT_CONFIG.default_cold_start_s)
            newest = max((r for r in replicas if r.spec is not None), key=lambda r: r.revision, default=None)
            if newest is None:
                continue  # no spec to value it by: not lent
            slo_s = newest.spec.scaling.slo_p95_ms / 1000.0
            for k, r in enumerate(replicas, 1):
                rank, value = replica_rank(k, traffic[name], need[name], float(r.placement.fraction), cold_s, slo_s)
                if r.id not in idle and rank in (NEED, HEADROOM):
                    holds.append(Hold(r.id, name, rank, value))
        return holds

    def _grant(self, wanted: tuple[Want, FunctionSpec, int], victims: tuple[Hold, ...], found: dict) -> None:
        """Take `victims` back (drained and stopped in tasks) and place and start the wanted replica
        on the room they leave, once they stopped where a device's memory is real."""
        want, spec, revision = wanted
        stopping = []
        for v in victims:
            device = self.replicas[v.replica].placement.device
            if v.replica in found:  # idle: priced by its take-back cost
                task = self._take_back(TakeBack(found[v.replica][0], want.demand, want.waiting, *found[v.replica][1]))
            else:  # busy: a first replica's, or a needed further replica's (headroom)
                task = self._take_busy(v, want)
            if not device.emulated:  # a real device's memory is free once the victim stopped
                stopping.append(task)
        replica = self._place(want.demand, spec, revision)
        if replica is not None:
            self._spawn_task(self._bring_up(replica, stopping))

    def _time_share(self, want: Want, spec: FunctionSpec, revision: int, held: Short) -> Replica | None:
        """A function's first replica, requests waiting, that no free or lent slice could take:
        placed beyond the compute of a device whose replicas are little busy (`place_shared`),
        where it shares the compute with them, rather than leave the requests waiting for a
        replica to go idle. None when time-sharing is off, it is not such a replica, or no device
        is quiet enough."""
        if not (self.config.time_share_busy > 0 and want.first and want.waiting > 0):
            return None
        placed = self.cluster.place_shared(want.demand, self.config.time_share_busy)
        if isinstance(placed, Unplaceable):
            return None
        name, device = want.demand.function, placed.device
        replica = self._register(placed, spec, revision)
        self.time_shared.labels(name, device.id).inc()
        used, _ = self.cluster.used(device.id)
        busy = self.device_busy.get(device.id, 0.0)
        self.events("time_share", f"{name} time-shares {device.id}{' (emulated)' if device.emulated else ''}: "
                    f"{want.waiting} request(s) waiting and no slice to be had ({held.reason.split(' (held')[0]}); "
                    f"the device's replicas were busy {busy:.0%} of its compute, its slices now hold "
                    f"{float(used):.0%} of it", function=name,
                    data={"replica": replica.id, "device": device.id, "waiting": want.waiting, "busy": busy,
                          "allocated": float(used), "why_no_slice": held.reason})
        return replica

    def _say_held_short(self, held: Short, want: Want, now: float) -> None:
        name = held.demand.function
        self.held_short.labels(name, RANKS[held.rank]).inc()
        if now - self.short_said.get(name, -math.inf) < 30.0:
            return
        self.short_said[name] = now
        self.events("held_short", f"{name} held short of a replica ({RANKS[held.rank]}, {want.waiting} request(s) "
                    f"waiting): {held.reason}", function=name,
                    data={"replica": held.demand.replica, "rank": RANKS[held.rank], "reason": held.reason,
                          "waiting": want.waiting})

    def _lendable(self, name: str, placed: Unplaceable) -> bool:
        """Whether a slice may yet be lent to `name`: taking back is on, room is what it lacks
        (not a slice no device could hold) and another function's replica holds some."""
        return (self.config.take_back and placed.status == Status.UNSCHEDULABLE
                and any(r.function != name and r.state in ("starting", "ready") for r in self.replicas.values()))

    def _note_activity(self, now: float) -> None:
        """When each ready replica last answered or held a request, from its last two scrapes, and
        each function's request rate (its replicas' answers since the last look, kept across
        scale-to-zero), and each device's busy compute: its replicas' duty times their slice,
        summed (two 1/8 replicas busy half the time: 2 x 0.5 x 1/8 = 0.125 of the device)."""
        answered: dict[str, float] = {}
        busy: dict[str, float] = {}
        for r in self.replicas.values():
            if len(r.stats) == 2 and (r.stats[1].completed > r.stats[0].completed or r.stats[1].inflight > 0):
                r.active_at = max(r.active_at, r.stats[1].at)
                self.active_at[r.function] = max(self.active_at.get(r.function, 0.0), r.active_at)
            if len(r.stats) == 2 and r.id in self.cluster:
                device = r.placement.device.id
                busy[device] = busy.get(device, 0.0) + duty_cycle(r.stats[0], r.stats[1]) * float(r.placement.fraction)
            if r.stats:
                answered[r.function] = answered.get(r.function, 0.0) + max(0.0, r.stats[-1].completed - r.counted)
                r.counted = max(r.counted, r.stats[-1].completed)
        for device in set(busy) | set(self.device_busy):
            self.device_busy[device] = busy.get(device, 0.0)
            self.cluster.set_device_busy(device, self.device_busy[device])
        for name in set(answered) | set(self.rates):
            self.rates[name] = observe_rate(self.rates.get(name), answered.get(name, 0.0), now,
                                            self.config.rate_window_s)

    def _idle(self, now: float, excluded: set[str]) -> list[Idle]:
        """The replicas, ready or starting, of quiet functions not in `excluded`, as many as are
        above their min_replicas (starting ones first, then the newest ready): a quiet function
        has nothing held at the gateway, and each of its ready replicas was scraped twice since
        ready, had nothing in flight or queued at the last scrape and answered nothing between the
        two (the simulator's function without traffic in the tick: Simulation._holds). A busy function's replica between two requests is not idle but
        ranked by its function's need (_busy_holds); one just ready (it may have just answered
        the requests held through its cold start) makes its function not quiet. A request that
        reaches an idle one after the scrape is answered before it stops (the drain waits). The
        rate is the function's (`rates`); the keep-alive the policy's last (Target.keep_alive_s),
        else the spec's idle_to_zero_s. A ready one is priced from its own last activity, one
        still starting (a pre-warm ahead of a function's next onset, a scale-up whose requests
        stopped) from its function's (`active_at`), as the simulator prices it; taken, its start
        is called off (_take). Until 2026-12-01 a starting one was never lent, and a busy
        function's ready one between requests was (IDLE or KEPT by its cost at the scrape's
        moment), where the simulator ranks it by need."""
        live: dict[str, int] = {}
        busy: set[str] = set()  # functions with traffic in their replicas' last window
        for r in self.replicas.values():
            if r.state in ("starting", "ready") and r.moving_from is None:
                live[r.function] = live.get(r.function, 0) + 1
            if r.state == "ready" and (len(r.stats) < 2 or not _between_requests(r)
                                       or r.stats[-1].completed > r.stats[0].completed):
                busy.add(r.function)
        out = []
        lendable: dict[str, int] = {}  # function -> how many more it may lend: live above its min_replicas
        # those starting first (they serve nothing yet), then the newest ready ones, so a floor of
        # min_replicas keeps its oldest ready replicas and two asks cannot take it below that
        for r in sorted(self.replicas.values(), key=lambda r: (r.state == "ready", -r.created_at)):
            if (r.function in excluded or r.function in busy or r.state not in ("starting", "ready")
                    or r.moving_from is not None or self.router.held(r.function) > 0 or r.spec is None):
                continue
            left = lendable.setdefault(r.function, live[r.function] - r.spec.scaling.min_replicas)
            if left <= 0:  # its floor is not lent
                continue
            lendable[r.function] = left - 1
            active_at = self.active_at.get(r.function, 0.0) if r.state == "starting" else r.active_at
            scaling = r.spec.scaling
            cold_s = self.cold_starts.get(r.function, DEFAULT_CONFIG.default_cold_start_s)
            rate = self.rates[r.function].per_s if r.function in self.rates else 0.0
            out.append(Idle(r.id, r.function, rate, active_at, self.keep_alive.get(r.function, scaling.idle_to_zero_s),
                            cold_s, scaling.slo_p95_ms / 1000.0))
        return out

    def _take_back(self, tb: TakeBack) -> asyncio.Task:
        """An idle victim, priced by its take-back cost: _take."""
        victim = self.replicas[tb.victim.replica]
        idle = f"idle {self.clock() - tb.victim.active_at:.0f} s" if tb.victim.active_at > 0 else "no request yet"
        starting = ", still starting" if victim.state == "starting" else ""
        return self._take(victim, tb.demand, f"{idle}{starting}", f"{tb.waiting} request(s) of "
                          f"{tb.demand.function} waiting and no free slice; cost {tb.cost:.3f} = P(request "
                          f"before keep-alive ends) {tb.chance:.3f} x {tb.misses:.2f} cold-start misses",
                          {"waiting": tb.waiting, "cost": tb.cost, "chance": tb.chance, "misses": tb.misses})

    def _take_busy(self, hold: Hold, want: Want) -> asyncio.Task:
        """A busy victim of a lower rank than the ask (lending.share): another function's headroom
        or need for a function's first replica, its headroom for a replica within a function's
        need: _take. Its requests in flight finish in the drain; its function's next look sees
        one replica fewer and asks again."""
        victim = self.replicas[hold.replica]
        mine = "its first replica" if want.first else "a replica within its need"
        starting = ", still starting" if victim.state == "starting" else ""
        return self._take(victim, want.demand,
                          f"{RANKS[hold.rank]}{starting}, {hold.value:.1f} late requests per slice if lost",
                          f"{want.waiting} request(s) of {want.demand.function} waiting and no room from free "
                          f"slices or idle replicas alone; {mine} goes before another function's "
                          f"{RANKS[hold.rank]}",
                          {"waiting": want.waiting, "rank": RANKS[hold.rank], "value": hold.value})

    def _take(self, victim: Replica, demand: Demand, what: str, why: str, data: dict) -> asyncio.Task:
        """Stop routing to the victim and free its slice now; drain and stop it in a task (one
        still starting: its start called off, _call_off); say so."""
        starting = victim.state == "starting"
        victim.state = "draining"
        self._release(victim)
        taker = demand.function
        self.takebacks.labels(taker, "took").inc()
        self.takebacks.labels(victim.function, "gave").inc()
        self.events("takeback", f"{taker} took {victim.placement.device.id} slice {_slice(victim.placement)} from "
                    f"{victim.function} ({victim.id}, {what}): {why}",
                    function=taker, data={"from": victim.function, "replica": victim.id, "for": demand.replica,
                                          "device": victim.placement.device.id, **data})
        if starting:
            victim.stop_reason = f"its start called off: slice taken back by {taker}"
            return self._spawn_task(self._call_off(victim))
        return self._spawn_task(self._drain_and_stop(victim, f"slice taken back by {taker}"))

    async def _call_off(self, replica: Replica) -> None:
        """A replica taken back while it starts: its process stopped now (UNSERVED_GRACE_S, 1 s:
        it serves nothing, so no drain's grace), so its wait for ready ends, and done once its
        bring-up has finished the stop (_bring_up sees the state), so a real device's memory is
        free for the replica placed on its slice."""
        if replica.handle is not None and not replica.stopped.is_set() and self.backend.exited(replica.handle) is None:
            await self.backend.stop(replica.handle, UNSERVED_GRACE_S)
        await replica.stopped.wait()

    def slice_for(self, spec: FunctionSpec) -> Fraction:
        return self.slices.get(spec.name, Fraction(spec.slice.fraction))

    def _note_slice_hint(self, name: str, spec: FunctionSpec, decision: ScaleDecision) -> None:
        if decision.slice_fraction is None:
            return
        wanted = Fraction(decision.slice_fraction).limit_denominator(64)
        if wanted != self.slice_for(spec):
            self.slices[name] = wanted
            self.events("slice", f"new replicas get a {wanted.numerator}/{wanted.denominator} slice: {decision.detail}",
                        function=name, data={"slice": str(wanted), "reason": decision.reason})

    def fail(self, replica: Replica, message: str) -> None:
        """Not live: not counted from now on (the policy replaces it in this very tick), stopped."""
        replica.state = "failed"
        self._spawn_task(self._fail(replica, message))

    # ------------------------------------------------------------------ replicas

    def live(self, name: str) -> list[Replica]:
        """Its replicas starting or ready, but one starting to take over from another (_move)."""
        return [r for r in self.replicas.values()
                if r.function == name and r.state in ("starting", "ready") and r.moving_from is None]

    def _spawn_task(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def demand_for(self, spec: FunctionSpec, replica_id: str) -> Demand:
        kinds = ("emulated",) if _is_profile(spec) else ("gpu", "cpu")
        return Demand(replica_id, spec.name, self.slice_for(spec), spec.slice.memory_mib, kinds)

    async def start_replica(self, name: str, spec: FunctionSpec, revision: int) -> Replica | None:
        replica = self._place(self.demand_for(spec, f"{name}-{next(self._ids)}"), spec, revision)
        return None if replica is None else await self._bring_up(replica)

    def _place(self, demand: Demand, spec: FunctionSpec, revision: int, wanted: int = 1) -> Replica | None:
        """Hold a slice for a new replica now, or say why none can be had (of the `wanted` this
        tick asked for)."""
        name = demand.function
        placed = self.cluster.place(demand)
        if isinstance(placed, Unplaceable):
            what = "a replica" if wanted == 1 else f"{wanted} replicas"
            message = f"cannot place {what} of {name}: {placed.message}"
            if self._lendable(name, placed):
                # other functions' replicas hold the slices: once one is idle it is lent (a later
                # tick), so the requests wait (up to the hold timeout); said every 30 s of a wait
                if self.clock() - self.unplaced.get(name, -math.inf) >= 30.0:
                    self.unplaced[name] = self.clock()
                    self.events("unplaceable", f"{message}; waiting for an idle replica to give a slice back",
                                function=name, data={"reasons": list(placed.reasons), "waiting": True, "wanted": wanted})
                return None
            self.events("unplaceable", message, function=name, data={"reasons": list(placed.reasons), "wanted": wanted})
            if not self.live(name):  # nothing else will serve the held requests: say so now
                self._back_off(name)
                self.router.fail_waiters(name, message)
            return None
        return self._register(placed, spec, revision)

    def _register(self, placed: Placement, spec: FunctionSpec, revision: int) -> Replica:
        """A replica for a slice just held, starting from now (its function waits no more)."""
        self.unplaced.pop(placed.function, None)
        replica = Replica(placed.replica, placed.function, revision, placed, created_at=self.clock(), spec=spec)
        self.replicas[placed.replica] = replica
        return replica

    def _release(self, replica: Replica) -> None:
        """Free its slice, once, and count the slice-seconds it held: from its placement (when
        it was registered) until now, times its slice."""
        if self.cluster.release(replica.id):
            held = (self.clock() - replica.created_at) * float(replica.placement.fraction)
            self.released_slice_s[replica.function] = self.released_slice_s.get(replica.function, 0.0) + held

    def slice_use(self) -> dict[str, tuple[float, float]]:
        """Per function, (the slice-seconds its replicas have held since this scaler began, the
        slices they hold now): each replica's slice times its time from placement to the release
        of its slice, or to now while it holds it; exact, as the allocator held it, where a
        once-a-second sample of the replicas' states rounds a state shorter than a second to a
        whole second or none. A replica taken back frees its slice at the take, while it drains
        (the taker's from then: _take); one scaled down holds it until it has stopped. E.g. a 1/8
        replica placed at 10.0 s and stopped at 12.5 s: 0.3125 slice-seconds."""
        now = self.clock()
        out = {name: (held, 0.0) for name, held in self.released_slice_s.items()}
        for r in self.replicas.values():
            if r.id in self.cluster:
                fraction = float(r.placement.fraction)
                held, holds = out.get(r.function, (0.0, 0.0))
                out[r.function] = (held + (now - r.created_at) * fraction, holds + fraction)
        return out

    async def _bring_up(self, replica: Replica, after: list[asyncio.Task] | tuple = ()) -> Replica | None:
        """Create a placed replica (once the replicas that gave its slice back have stopped,
        so a real device's memory is free) and wait until it is ready."""
        name, spec, replica_id, placed = replica.function, replica.spec, replica.id, replica.placement
        if after:
            await asyncio.gather(*after, return_exceptions=True)
            if replica.state != "starting":  # stopped while it waited
                await self._finish_stop(replica, "stopped while starting")
                return None
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
            if replica.moving_from is None and not self.live(name):  # a move's: the old one serves on
                self._back_off(name)
                self.router.fail_waiters(name, message)
            return None
        if replica.state != "starting":  # stopped while it was starting
            await self._finish_stop(replica, "stopped while starting")
            return None
        if replica.moving_from is not None:
            old = self.replicas.get(replica.moving_from)
            if old is None or old.state != "ready":  # gone meanwhile (taken back, exited): called off
                await self._finish_stop(replica, f"move called off: {replica.moving_from} went first")
                return None
        else:
            self.failures.pop(name, None)
        replica.state, replica.ready_at = "ready", self.clock()
        replica.seen_at = replica.active_at = replica.ready_at
        self.cold_starts[name] = ready_s
        self.router.add_endpoint(name, replica_id, replica.handle.host, replica.handle.port,
                                 spawn_s=live_s, load_s=max(0.0, ready_s - live_s),
                                 uds=getattr(replica.handle, "uds", None))
        self.events("replica_ready", f"{replica_id} ready in {ready_s:.3f} s on {placed.device.id} "
                    f"slice {_slice(placed)}{' (emulated)' if placed.device.emulated else ''}",
                    function=name, data={"replica": replica_id, "ready_s": ready_s, "spawn_s": live_s,
                                         "device": placed.device.id, "cpus": list(placed.cpus)})
        if replica.moving_from is not None:  # it takes over: the old one drains, at once out of the fleet
            old = self.replicas[replica.moving_from]
            replica.moving_from = None
            old.state = "draining"
            self._spawn_task(self._drain_and_stop(old, f"moved to {replica_id} on a {_slice(placed)} slice"))
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
        await self._drain_and_stop(replica, reason)

    async def _drain_and_stop(self, replica: Replica, reason: str) -> None:
        # a drain outlasts the longest request the function allows
        drain_s = max(self.config.drain_timeout_s, (replica.spec.timeout_s + 5.0) if replica.spec else 0.0)
        drained = await self.router.drain_endpoint(replica.function, replica.id, drain_s)
        if not drained:
            log.warning("%s did not drain in %.0f s", replica.id, drain_s)
        self.router.remove_endpoint(replica.function, replica.id)
        await self._finish_stop(replica, reason)

    async def _finish_stop(self, replica: Replica, reason: str) -> None:
        """Stop its process (not again if _call_off has), free its slice, forget it, say so; a
        replica never ready is stopped without the grace in-flight requests get, and one whose
        stop fails is still freed and forgotten (_call_off waits for this)."""
        reason = replica.stop_reason or reason
        try:
            if replica.handle is not None and self.backend.exited(replica.handle) is None:
                grace = self.config.stop_grace_s if replica.ready_at is not None else UNSERVED_GRACE_S
                await self.backend.stop(replica.handle, grace)
        finally:
            replica.state = "stopped"
            replica.stopped.set()
            self._release(replica)
            self.replicas.pop(replica.id, None)
        self.events("replica_stopped", f"{replica.id} stopped ({reason})", function=replica.function,
                    data={"replica": replica.id, "reason": reason})

    async def _fail(self, replica: Replica, message: str) -> None:
        if replica.moving_from is not None:  # a move's replica: no other move of its function for a while
            self.no_move_before[replica.function] = self.clock() + MOVE_RETRY_S
        replica.state = "failed"
        self.router.remove_endpoint(replica.function, replica.id)
        try:
            if replica.handle is not None and self.backend.exited(replica.handle) is None:
                await self.backend.stop(replica.handle, UNSERVED_GRACE_S)
        finally:
            self._release(replica)
            self.replicas.pop(replica.id, None)
            replica.stopped.set()
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
        for name, (spec, revision) in functions.items():
            before, seen = self._seen.get(name, (spec, revision))
            hinted = self.slices.get(name)
            # a new revision whose replicas are replaced starts on the slice it declares, as a new
            # function would; one that changes only scaling keeps its replicas, and their slice
            if hinted is not None and seen != revision and not same_runtime(before, spec):
                del self.slices[name]
                self.events("slice", f"revision {revision}: new replicas get the {spec.slice.name} slice it "
                                     f"declares (the hint {hinted.numerator}/{hinted.denominator} was for "
                                     f"revision {seen}'s replicas)", function=name, data={"slice": spec.slice.name, "revision": revision})
        for name in set(self._seen) - set(functions):
            self.slices.pop(name, None)
            self.unplaced.pop(name, None)
            self.short_said.pop(name, None)
            self.rates.pop(name, None)
            self.keep_alive.pop(name, None)
            self.active_at.pop(name, None)
            self.no_move_before.pop(name, None)
            self.needs.pop(name, None)  # a function deployed again under its name starts with none
            self.router.forget(name)
        self._seen = dict(functions)

    @staticmethod
    def _keeps(replica: Replica, functions: dict[str, tuple[FunctionSpec, int]]) -> bool:
        """A new revision that only changes scaling keeps the running replicas."""
        spec, revision = functions[replica.function]
        if replica.spec is None or not same_runtime(replica.spec, spec):
            return False
        replica.revision, replica.spec = revision, spec
        return True

    async def shutdown(self) -> None:
        """Drain and stop every replica (graceful `shoal up` exit)."""
        await asyncio.gather(*(self.stop_replica(r, "shutdown") for r in list(self.replicas.values())),
                             return_exceptions=True)

    # ------------------------------------------------------------------ views

    def status(self, snapshots: dict[str, MetricsSnapshot], decisions: dict[str, ScaleDecision]) -> dict[str, Any]:
        """What the loop last saw and decided, per function, with these replicas."""
        out = {}
        for name, snap in snapshots.items():
            decision = decisions.get(name)
            out[name] = {
                "ready": snap.ready, "starting": snap.starting, "inflight": snap.inflight,
                "held": snap.activator_queue, "rps": snap.rps, "p95_s": snap.p95_s,
                # the batches as the policy reads them, ((requests, seconds), ...): learned, probed
                "batch_latency_s": [list(row) for row in snap.batch_latency_s],
                "desired": decision.desired if decision else None,
                "reason": decision.reason if decision else None,
                "detail": decision.detail if decision else None,
                "replicas": [self._replica_view(r) for r in self.replicas.values() if r.function == name],
            }
        return out

    def _replica_view(self, r: Replica) -> dict[str, Any]:
        duty = duty_cycle(r.stats[0], r.stats[1]) if len(r.stats) == 2 else None
        return {
            "id": r.id, "state": r.state, "device": r.placement.device.id,
            "emulated": r.placement.device.emulated, "slice": _slice(r.placement), "cpus": list(r.placement.cpus),
            "port": getattr(r.handle, "port", None), "duty": duty, "moving_from": r.moving_from,
            "inflight": r.stats[-1].inflight if r.stats else 0.0,
        }


class _SliceSeconds:
    """shoal_replica_slice_seconds_total{function}: ReplicaScaler.slice_use at scrape time."""

    def __init__(self, source: Callable[[], dict[str, tuple[float, float]]]):
        self.source = source

    def collect(self):
        family = CounterMetricFamily("shoal_replica_slice_seconds", "Slice-seconds held by each function's "
                                     "replicas, from placement to the release of their slices (1.0: a whole "
                                     "device for one second)", labels=["function"])
        for name, (held, _) in sorted(self.source().items()):
            family.add_metric([name], held)
        yield family

    def describe(self):
        return []


def _between_requests(r: Replica) -> bool:
    """Ready, and nothing in flight or queued at its last scrape."""
    return r.state == "ready" and bool(r.stats) and r.stats[-1].inflight <= 0 and r.stats[-1].queued <= 0


def _slice(placement: Placement) -> str:
    f = placement.fraction
    return f"{f.numerator}/{f.denominator}"


def _is_profile(spec: FunctionSpec) -> bool:
    if spec.loader is not None:
        return spec.loader == "profile"
    return spec.artifact.lower().endswith((".yaml", ".yml"))
