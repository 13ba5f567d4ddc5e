"""Idle capacity is lent, not owned: which idle replicas of other functions give their slices back
when a replica that a function waits for cannot be placed (`choose_takebacks`, pure). An idle
replica's loss costs the chance that its function gets a request before its keep-alive ends
(1 - exp(-rate x keep-alive left), a Poisson arrival) times the requests that would then miss the
SLO during its cold start; the cheapest go first, ties in the placement's consolidating order
(`SliceCluster.release_order`, the one scale-down uses), so whole devices go idle. Keep-alive, in
the spirit of "Serverless in the Wild" (Shahrad et al., USENIX ATC 2020: a warm instance is kept
while the next arrival is likely), becomes a loan of capacity nobody waits for. A full cluster is
shared by the same arbiter (`share`): every replica ranked by what it serves (a function's floor,
its need, headroom, idle), asks granted highest first, each taking back only lower-ranked
replicas of other functions, and those held short said with why; what a busy replica serves is
`replica_rank` over its function's `need_of` (its most over the policy's scale-down delay:
`held_need`), valued by the late requests its loss would cost
through a cold start, per slice (an idle one's take-back cost counts the same late requests,
weighted by the chance of a request and not per slice). The scaler (autoscaler.replicas) and
the simulator act on it and rank busy replicas alike; the simulator also ranks further asks by
need, the scaler asks them as headroom; a kept replica goes to a first replica only, in both.
A slice held but not asked for is given back too: a replica on a larger slice than its
function's replicas now get is moved (`to_move`).
Pure: stdlib, placement and policy's cold_start_misses; no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from autoscaler.policy import cold_start_misses, window_start
from autoscaler.placement import Demand, Placement, SliceCluster, Status


class Idle(NamedTuple):
    """A ready replica with nothing in flight, as the scaler saw it."""

    replica: str
    function: str
    rate_rps: float  # its function's recent request rate
    active_at: float  # when it last had a request
    keep_alive_s: float  # how long its function keeps an idle replica
    cold_start_s: float  # its function's measured cold start (create to ready)
    slo_s: float  # its function's latency SLO


class Want(NamedTuple):
    """A replica to place, the requests held at the gateway for its function, and whether its
    function has no replica (then its requests wait for this one, whatever it costs; a further
    replica only takes slices whose loss costs less than `max_scale_up_cost`)."""

    demand: Demand
    waiting: int = 0
    first: bool = True


class Rate(NamedTuple):
    """A function's request rate as an exponentially weighted count over an exponentially
    weighted time, so a short history is its plain mean (no bias toward zero at the start)."""

    at: float
    count: float = 0.0  # requests, each weighted exp(-age / window)
    seconds: float = 0.0  # the time observed, weighted the same way

    @property
    def per_s(self) -> float:
        return self.count / max(self.seconds, 1.0)


def observe_rate(rate: Rate | None, count: float, now: float, window_s: float) -> Rate:
    """`rate` after `count` more requests answered by `now`.
    // 1 request a second for 10 s, window 120 s: count = sum of e^(-k/120), k = 0..9 = 9.63;
    // seconds = 120 x (1 - e^(-10/120)) = 9.59: 1.004 per s; after 120 s of silence the count is
    // e^-1 x 9.63 = 3.54 and the time 9.59 e^-1 + 120 (1 - e^-1) = 79.4 s: 0.045 per s"""
    if rate is None:
        return Rate(now, max(0.0, count), 0.0)
    return Rate(now, *decay_rate(rate.count, rate.seconds, max(0.0, count), max(0.0, now - rate.at), window_s))


def decay_rate(count: Any, seconds: Any, added: Any, elapsed_s: float, window_s: float) -> tuple[Any, Any]:
    """observe_rate's step on floats or numpy arrays alike (the simulator keeps every function's
    at once): (count x decay + added, seconds x decay + window x (1 - decay)), decay = e^(-elapsed
    / window)."""
    decay = math.exp(-elapsed_s / window_s)
    return count * decay + added, seconds * decay + window_s * (1.0 - decay)


class TakeBack(NamedTuple):
    victim: Idle
    demand: Demand  # the replica placed on the slice it gave back
    waiting: int
    cost: float  # chance x misses
    chance: float  # of a request before the victim's keep-alive ends
    misses: float  # requests that would miss the SLO during its cold start, if one comes


def chance_of_request(rate_rps: float, left_s: float) -> float:
    """P(at least one Poisson arrival within `left_s`) = 1 - exp(-rate x left).
    // 0.1 rps, 10 s left: 1 - exp(-1) = 0.632; no keep-alive left: 0"""
    if rate_rps <= 0 or left_s <= 0:
        return 0.0
    return 1.0 - math.exp(-rate_rps * left_s)


def takeback_cost(idle: Idle, now: float) -> tuple[float, float, float]:
    """(cost, chance, misses) of taking `idle`'s slice at `now`.
    // 0.1 rps, keep-alive 60 s, active 50 s ago: 10 s left, chance 0.632; cold 2 s, SLO 0.5 s:
    // misses 1 + 0.1 x 1.5 = 1.15; cost 0.632 x 1.15 = 0.727"""
    chance = chance_of_request(idle.rate_rps, idle.active_at + idle.keep_alive_s - now)
    misses = cold_start_misses(idle.rate_rps, idle.cold_start_s, idle.slo_s)
    return chance * misses, chance, misses


def choose_takebacks(cluster: SliceCluster, wants: Sequence[Want], idle: Sequence[Idle], now: float,
                     max_scale_up_cost: float = 1.0) -> list[TakeBack]:
    """The take-backs that let `wants` be placed, on a copy of `cluster` (unchanged), as `share`
    grants them: a want that fits as things are takes nothing; one that cannot be placed for want of
    room (UNSCHEDULABLE) takes the cheapest set of other functions' idle replicas on one device that
    makes room for it (a function's first replica whatever they cost; a further replica of a
    running function only replicas costing less than `max_scale_up_cost` each: less than one late
    request, so a busy function's momentary idleness is not traded for another's extra replica); a
    want nothing can make room for is left out. First replicas go before further ones, then the
    most requests waiting (stable); placing the grants in `share`'s order after releasing the
    victims gives the placements this found."""
    holds, found = idle_holds(idle, now, max_scale_up_cost)
    shares = share(cluster, want_asks(wants), holds)
    waiting = {w.demand.replica: w.waiting for w in wants}
    return [TakeBack(found[v.replica][0], g.demand, waiting[g.demand.replica], *found[v.replica][1])
            for g in shares.grants for v in g.victims]


def idle_holds(idle: Sequence[Idle], now: float, max_scale_up_cost: float = 1.0
               ) -> tuple[list[Hold], dict[str, tuple[Idle, tuple[float, float, float]]]]:
    """Idle replicas as holds: IDLE when taking one costs less than `max_scale_up_cost` (less than
    one late request), else KEPT; the value is the cost. With each one's Idle and (cost, chance,
    misses) by replica."""
    holds, found = [], {}
    for i in idle:
        cost = takeback_cost(i, now)
        found[i.replica] = (i, cost)
        holds.append(Hold(i.replica, i.function, idle_rank(cost[0], max_scale_up_cost), cost[0]))
    return holds, found


def idle_rank(cost: float, max_scale_up_cost: float = 1.0) -> int:
    """An idle replica's rank by its take-back cost: IDLE under `max_scale_up_cost` (less than one
    late request: any ask may take it), else KEPT (only a function's first replica takes it), its
    function's first replica or a further one alike: a busy function's momentary idleness is not
    traded for another's further replica. The scaler (idle_holds) and the simulator
    (Simulation._holds) rank idle replicas by it alike.
    // cost 0.727 -> IDLE; 375 (50 rps, an 8 s cold start, SLO 0.5 s: 1 + 50 x 7.5 ~ 376 misses
    // at a chance near 1) -> KEPT"""
    return IDLE if cost < max_scale_up_cost else KEPT


def want_asks(wants: Sequence[Want], ranked: Mapping[str, tuple[int, float]] | None = None) -> list[Ask]:
    """The scaler's wants as asks: a function's first replica is its FLOOR, the requests waiting
    ordering floors; a further one is ranked and valued as `ranked` has it by replica
    (replica_rank at its function's need of now, as the simulator ranks its asks), HEADROOM by the
    requests waiting where `ranked` has none (a function not yet measured). Ranked by need, the
    further replicas of two busy functions took each other's in turn while a placed replica was
    ranked by the need of the moment; held_need ended that (docs/policy-changes.md, "A needed further
    replica live")."""
    ranked = ranked or {}
    asks = []
    for w in wants:
        rank, value = ((FLOOR, float(w.waiting)) if w.first
                       else ranked.get(w.demand.replica, (HEADROOM, float(w.waiting))))
        asks.append(Ask(w.demand, rank, value, w.waiting))
    return asks


# ---------------------------------------------------------------------- a full cluster shared


# What a slice serves, lowest first: a replica is taken back only for an ask of a higher rank.
IDLE, HEADROOM, KEPT, NEED, FLOOR = range(5)
RANKS = ("idle", "headroom", "kept", "need", "floor")


def need_of(busy_per_s: Any, max_duty: float, active: Any) -> Any:
    """The replicas that carry a function's work at `max_duty`: its replicas' busy seconds per
    second over it, rounded up, at least one while requests come; on floats or numpy arrays
    alike (the simulator's every function at once), so the ceiling is -(-x // 1).
    // 0.45 busy s/s at 0.9: 1; 2.0: ceil(2.22) = 3; nothing busy, requests coming: 1"""
    n = -(-(busy_per_s / max_duty - 1e-9) // 1)
    return n + (n < 1) * active


def held_need(need: Any, past: Iterable[tuple[float, Any]], now: float, window_s: float) -> Any:
    """The need a function's placed replicas are ranked by when the cluster is shared: the most
    of `need` (now's, from need_of) and the past needs, (at, need) pairs, inside the window of
    `window_s` ending at `now` (the policy's scale-down delay, its edge the policy's:
    policy.window_start); floats or numpy arrays alike (the simulator's every function at once),
    so the larger of two is picked by multiplying with comparisons. A replica its function
    needed within the window would not yet be scaled down by its own policy, so it is no
    headroom to another's ask either: ranked by the need of the moment, a bursty function's
    further replica was taken between its bursts and started again cold for the next
    (docs/policy-changes.md, "A replica needed within the delay window is no headroom"). An ask
    keeps the need of now.
    // now 41, need 2, past ((10, 1), (25, 3)): window 30 s holds 25's 3; window 16 s too (25 is
    // at its edge); window 10 s: 2"""
    cutoff = window_start(now, window_s)
    most = need
    for at, then in past:
        if at > cutoff:
            most = (most >= then) * most + (most < then) * then
    return most


def trim_to_window(kept: deque, now: float, window_s: float) -> None:
    """Drop from the front of `kept`, (at, ...) pairs oldest first, those outside the window of
    `window_s` ending at `now` (held_need's edge: policy.window_start), so a deque of past needs
    holds only what held_need reads; the simulator's and the scaler's alike."""
    cutoff = window_start(now, window_s)
    while kept and kept[0][0] <= cutoff:
        kept.popleft()


def replica_rank(k: int, rate: float, need: float, slice_fraction: float, cold_start_s: float,
                 slo_s: float) -> tuple[int, float]:
    """The rank and value of a function's k-th replica (1 the first) while requests come at `rate`
    a second and `need` replicas carry them (need_of): FLOOR for its first, NEED up to its need,
    HEADROOM above. Its value is what losing it would cost, per slice: its share of the rate
    (rate / need within the need, rate / k above it) through one cold start of its function, in
    requests that miss the SLO (cold_start_misses, as an idle replica's take-back cost counts
    them). None where the cold start is within the SLO: such replicas tie at 0 and go in the
    placement's consolidating order, and such a first replica's ask comes after other floors, its
    function's requests waiting no longer than the SLO. So of two functions' headroom with the
    same share at the same slice, the one whose replacement takes longer is kept. IDLE, value 0,
    without requests (an idle replica is valued by its take-back cost instead: takeback_cost).
    The simulator and the scaler rank busy replicas by it alike.
    // 40 rps, need 2, slice 1/4, cold 2.0 s, SLO 0.5 s: the 2nd NEED, (1 + 20 x 1.5) / 0.25 = 124;
    // the 3rd HEADROOM, (1 + 13.3 x 1.5) / 0.25 = 84; with an 8 s cold start, 10 rps: the 2nd
    // HEADROOM (1 + 5 x 7.5) / 0.25 = 154, kept before the first function's"""
    if rate <= 0:
        return IDLE, 0.0
    rank = FLOOR if k == 1 else NEED if k <= need else HEADROOM
    share = rate / max(need if k <= need else k, 1)
    return rank, cold_start_misses(share, cold_start_s, slo_s) / slice_fraction


class Hold(NamedTuple):
    """A placed replica and what its slice serves: `rank` FLOOR (a function's one replica while
    requests come), NEED (within the replicas its load needs), KEPT (idle, but taking it would
    likely cost a late request), HEADROOM (above its need: the policy's headroom, reserve, spare)
    or IDLE (idle and cheap to take); `value` orders within a rank (higher is kept first: the
    late requests its loss would cost, per slice: replica_rank, or an idle one's take-back cost)."""

    replica: str
    function: str
    rank: int
    value: float


class Ask(NamedTuple):
    """A replica to place, ranked and valued as a Hold would be once placed (higher: granted
    first), and the requests waiting for its function."""

    demand: Demand
    rank: int
    value: float = 0.0
    waiting: int = 0


class Grant(NamedTuple):
    demand: Demand
    victims: tuple[Hold, ...]  # released before it is placed (none: it fits as things are)


class Short(NamedTuple):
    """An ask held short, and why."""

    demand: Demand
    rank: int
    reason: str


class Shares(NamedTuple):
    grants: list[Grant]  # in the order to place them
    short: list[Short]


def share(cluster: SliceCluster, asks: Sequence[Ask], holds: Sequence[Hold]) -> Shares:
    """A full cluster divided by what each slice serves: `asks` are granted highest first (rank,
    then value; stable), on a copy of `cluster` (unchanged). One that fits takes nothing; one that
    cannot be placed for want of room (UNSCHEDULABLE) takes, on one device, the set of other
    functions' `holds` of a lower rank that makes room at the least loss (the lowest rank taken,
    then the least value, then the fewest, then the consolidating order of
    `SliceCluster.release_order`, so whole devices go idle); one nothing can make room for is held
    short, with why. A KEPT hold (the idle replica a function keeps) goes only to a FLOOR ask: a
    function's further replica, needed or not, never makes another go cold. So every function
    with requests gets its floor before any gets a needed replica, and needed replicas before
    headroom, each granted by its value (replica_rank). Pure."""
    scratch = cluster.copy()
    pool = {h.replica: h for h in holds if h.replica in cluster}
    grants: list[Grant] = []
    short: list[Short] = []
    for ask in sorted(asks, key=lambda a: (-a.rank, -a.value)):
        placed = scratch.place(ask.demand)
        if isinstance(placed, Placement):
            grants.append(Grant(ask.demand, ()))
            continue
        if placed.status != Status.UNSCHEDULABLE:
            short.append(Short(ask.demand, ask.rank, f"no device can hold it: {placed.message}"))
            continue
        lower = [h for h in pool.values() if h.function != ask.demand.function and h.rank < ask.rank
                 and (h.rank != KEPT or ask.rank == FLOOR)]
        victims = _cheapest_room(scratch, ask.demand, lower)
        if victims is None:
            short.append(Short(ask.demand, ask.rank, _why_short(ask, lower)))
            continue
        for v in victims:
            scratch.release(v.replica)
            del pool[v.replica]
        scratch.place(ask.demand)
        grants.append(Grant(ask.demand, tuple(victims)))
    return Shares(grants, short)


def _why_short(ask: Ask, lower: list[Hold]) -> str:
    rank = RANKS[ask.rank]
    if not lower:
        article = "an" if rank[0] in "aeiou" else "a"
        return f"no free slice, and every slice serves {article} {rank} or more (held for {rank})"
    return (f"no free slice; the {len(lower)} replica(s) of lower rank than {rank} free no room on one "
            f"device (held for {rank})")


def _cheapest_room(cluster: SliceCluster, demand: Demand, candidates: list[Hold]) -> list[Hold] | None:
    """The holds of one device whose release lets `demand` be placed, at the least loss: the
    lowest rank taken, then the least value, then fewer victims, then the device first in the
    consolidating order. On each device the lowest are taken first until the demand fits there."""
    if not candidates:
        return None
    order = {r: k for k, r in enumerate(cluster.release_order([c.replica for c in candidates]))}
    by_device: dict[str, list[Hold]] = {}
    for c in candidates:
        by_device.setdefault(cluster.device_of(c.replica).id, []).append(c)
    best: tuple | None = None
    for on_device in by_device.values():
        on_device.sort(key=lambda c: (c.rank, c.value, order[c.replica]))
        trial = cluster.copy()
        for n, c in enumerate(on_device, 1):
            trial.release(c.replica)
            if isinstance(trial.place(replace(demand, replica=f"{demand.replica}#trial")), Placement):
                chosen = on_device[:n]
                key = (max(v.rank for v in chosen), sum(v.value for v in chosen), n,
                       min(order[v.replica] for v in chosen))
                if best is None or key < best[0]:
                    best = (key, chosen)
                break
    return None if best is None else best[1]


def to_move(slices: Sequence[float], asked: float) -> int | None:
    """Which replica of a function to move to the slice `asked` (the one its replicas get now),
    if any: the first on the largest slice above it. The callers move one only while the function
    is steady (its last look did not scale it, no replica of it starting or moving). Shrinks only: the
    policy asks a smaller slice for a lone idle replica, which never goes to zero while requests
    keep coming, so the hint would reach no replica and the idle slice-seconds it prices would be
    the old slice's (the Azure-like population: a third of Shoal's, docs/benchmarks.md). A slice
    is set when a replica starts (an MPS client's thread share, the emulated device's speed), so a
    move is a new replica: it starts on the asked slice where one is free, and once it is ready the
    old one drains and stops, its requests answered. E.g. slices (0.5,), asked 0.125: 0; asked
    0.5: None."""
    best = None
    for i, fraction in enumerate(slices):
        if fraction > asked + 1e-9 and (best is None or fraction > slices[best]):
            best = i
    return best
