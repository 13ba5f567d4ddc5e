"""Filter and score plugins, after the Kubernetes scheduler framework.

A filter says, for every device at once, whether it can take a demand: an array
of `Status` codes (SUCCESS, UNSCHEDULABLE, UNRESOLVABLE), never an exception. A
scorer ranks the devices from 0 to 100 (the framework's MinNodeScore ..
MaxNodeScore); a `Profile` names the filters and the scorers with their weights,
like a KubeSchedulerProfile, and the device with the highest weighted sum wins.

Every plugin works on numpy arrays with one entry per device (`Devices`), so the
immutable `Inventory` (a few devices) and the mutable `SliceCluster` (thousands)
run the same code. Arithmetic is in integers: compute in `UNITS` per device,
memory in MiB, scores floored like the framework's int64 scores.

Pure: stdlib and numpy only; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

from autoscaler.placement.types import Demand, Status, to_units

SUCCESS, UNSCHEDULABLE, UNRESOLVABLE = int(Status.SUCCESS), int(Status.UNSCHEDULABLE), int(Status.UNRESOLVABLE)
# Constants the arithmetic uses are 0-d arrays: numpy converts a Python int operand
# afresh on every operation (about 0.35 us; place() does about twenty of them).
MAX_SCORE = np.array(100, np.int32)


@dataclass(slots=True)
class Devices:
    """What the plugins know of the devices (the framework's NodeInfo), one entry each.
    A capacity is one 0-d array when every device has the same (numpy broadcasts it)."""

    capacity_units: np.ndarray  # UNITS for a whole device; 0-d when all devices are alike
    free_units: np.ndarray
    capacity_mib: np.ndarray  # 0-d when all devices are alike
    free_mib: np.ndarray
    least_units: int = 0  # the smallest capacity: a need within it fits some day on every device,
    least_mib: int = 0  # so the filters need no array step to tell "never"
    busy_pct: np.ndarray | None = None  # int64 0..100, the observed duty of the physical device; None: none observed


@dataclass(slots=True)
class Request:
    """One demand as the plugins see it (the framework's CycleState): what it needs,
    per device where that differs (a slice's share of each device's memory), and
    what `prepare` works out once for every plugin."""

    demand: Demand
    units: int
    mib: np.ndarray | int
    preference: np.ndarray  # int64 per device: 0 = kind not allowed, else len(kinds) - rank
    kind_status: np.ndarray | int | None = None  # fits_kind's answer when the caller keeps it per kinds
    same_function: np.ndarray | None = None  # replicas of this function per device (anti-affinity on)
    warm: np.ndarray | None = None  # bool per device: its node has run this function's artifact
    left_units: np.ndarray | None = None  # compute free after placing (below 0: does not fit)
    left_mib: np.ndarray | None = None
    left_units_pct: np.ndarray | None = None  # the same as a share of the device, 0..100
    left_mib_pct: np.ndarray | None = None


def prepare(devices: Devices, request: Request) -> Request:
    """The framework's PreFilter and PreScore: what would be left on each device after
    placing, in units and as a share, computed once for every filter and scorer."""
    request.left_units = devices.free_units - request.units
    request.left_mib = devices.free_mib - request.mib
    request.left_units_pct = free_pct(request.left_units, devices.capacity_units)
    request.left_mib_pct = free_pct(request.left_mib, devices.capacity_mib)
    return request


# ---- filters: Devices x Request x Profile -> status per device ------------------------------
# A status array may be boolean (True = 1 = UNSCHEDULABLE) or a plain SUCCESS for all:
# on 1,000 devices every numpy call costs about a microsecond, so none is spared.


def fits_kind(devices: Devices, request: Request, profile: "Profile") -> np.ndarray:
    """UNRESOLVABLE where the device's kind is not one the demand may run on
    (a `profile` model needs an emulated device; a CPU never becomes a GPU)."""
    if request.kind_status is not None:
        return request.kind_status
    return kind_status(request.preference)


def kind_status(preference: np.ndarray) -> np.ndarray | int:
    """fits_kind for a preference array; SUCCESS (a plain 0) when every kind is allowed,
    so later steps skip it."""
    return (preference == 0) * UNRESOLVABLE if not preference.all() else SUCCESS


def fits_compute(devices: Devices, request: Request, profile: "Profile") -> np.ndarray:
    """The framework's NodeResourcesFit for compute: UNSCHEDULABLE when the slice is
    more than what is free (others could leave), UNRESOLVABLE when it is more than
    the whole device. E.g. 3/4 used, a 1/2 slice: 1/2 > 1/4 free -> UNSCHEDULABLE."""
    return _fit(request.units, request.left_units, devices.capacity_units, devices.least_units)


def fits_memory(devices: Devices, request: Request, profile: "Profile") -> np.ndarray:
    """NodeResourcesFit for memory. E.g. 81920 MiB, 60000 used, 30000 asked:
    30000 > 21920 free -> UNSCHEDULABLE; 92160 asked: > 81920 -> UNRESOLVABLE."""
    return _fit(request.mib, request.left_mib, devices.capacity_mib, devices.least_mib)


def fits_anti_affinity(devices: Devices, request: Request, profile: "Profile") -> np.ndarray | int:
    """At most `profile.max_per_device` replicas of one function per device, so one
    device's failure takes few of them (the framework's InterPodAffinity, anti side).
    E.g. at most 2, the device runs 2 already -> UNSCHEDULABLE. Off: SUCCESS everywhere."""
    if profile.max_per_device is None or request.same_function is None:
        return SUCCESS
    return (request.same_function >= profile.max_per_device) * UNSCHEDULABLE


def _fit(need, left, capacity, least: int) -> np.ndarray:
    """`left`: what would be free after placing; below 0 it does not fit now
    (UNSCHEDULABLE), and never where the need is over the capacity (UNRESOLVABLE).
    In the usual case (a plain need within the smallest capacity) the answer is the
    boolean array `left < 0` itself: True is 1 is UNSCHEDULABLE, False is 0 is SUCCESS."""
    full = left < 0
    if isinstance(need, int) and need <= least:
        return full
    return full * (UNSCHEDULABLE + (need > capacity))  # UNSCHEDULABLE (1) + True = UNRESOLVABLE (2)


# ---- tiny scorers: arithmetic only, on ints or arrays ------------------------------------------


def free_pct(left, capacity):
    """The framework's LeastAllocated for one resource, from what is left after placing.
    // 1/2 used + 1/4 asked: 180180 of 720720 units left: (180180 * 100) // 720720 = 25"""
    return left * MAX_SCORE // capacity


def stranded_pct(left_units, left_mib, left_units_pct, left_mib_pct, smallest_units, smallest_mib):
    """The share of a device (0..100, compute and memory averaged) that placing would
    leave in pieces no slice can use: free compute is stranded when less than the
    smallest slice of it, or too little memory for one, is left; free memory is
    stranded when less than the smallest slice of compute is left.
    // 80 GiB device, after placing: 0 compute left, 32768 MiB left (smallest slice 1/8):
    //   memory stranded: 32768 * 100 // 81920 = 40; compute: 0; (0 + 40) // 2 = 20
    // 1/8 compute and 32768 MiB left: both usable by a 1/8 slice: 0"""
    tiny = left_units < smallest_units
    starved = left_mib < smallest_mib
    return ((tiny | starved) * left_units_pct + tiny * left_mib_pct) // 2


def duty_pct(duty: float) -> int:
    """An observed duty 0..1 as whole percent, clamped: 0.304 -> 30; 1.7 -> 100."""
    return round(100 * min(1.0, max(0.0, duty)))


def idle_score(busy_pct):
    """// a physical device busy 30 % of the time: 100 - 30 = 70"""
    return MAX_SCORE - busy_pct


def warm_score(warm):
    """The framework's ImageLocality, for artifacts: 100 where the node has run this
    function before (its artifact is on local disk), else 0."""
    return warm * MAX_SCORE


# ---- score plugins: Devices x Request x Profile -> 0..100 per device ---------------------------


def spread(devices: Devices, request: Request, profile: "Profile"):
    """LeastAllocated over compute and memory (weight 1 each) after placing: emptier
    devices first, so replicas share few devices.
    // 1/2 used + 1/4 asked: 25 of compute left; 20480 of 81920 MiB left: 25; (25 + 25) // 2 = 25"""
    return (request.left_units_pct + request.left_mib_pct) // 2


def binpack(devices: Devices, request: Request, profile: "Profile"):
    """The reverse of spread (the framework's MostAllocated, up to rounding): fuller
    devices first, so whole devices stay idle.
    // 1/2 used + 1/4 asked (25 left), 61440 of 81920 MiB used (25 left): 100 - (25 + 25) // 2 = 75"""
    return MAX_SCORE - spread(devices, request, profile)


def least_fragmentation(devices: Devices, request: Request, profile: "Profile"):
    """Prefer placements that leave the free space in usable pieces: 0 left, or at
    least a smallest slice with memory for it. // 100 - stranded 20 = 80"""
    return MAX_SCORE - stranded_pct(request.left_units, request.left_mib, request.left_units_pct,
                                    request.left_mib_pct, profile.smallest_units, profile.smallest_mib)


def least_busy(devices: Devices, request: Request, profile: "Profile"):
    """Prefer the physical device that was observed least busy (its duty cycle);
    the same for all (0) until some duty is observed."""
    return 0 if devices.busy_pct is None else idle_score(devices.busy_pct)


def warm_cache(devices: Devices, request: Request, profile: "Profile"):
    """Prefer a node where this function's artifact has run before (no fetch, warm page cache)."""
    return 0 if request.warm is None else warm_score(request.warm)


# ---- the profile and the framework's steps ---------------------------------------------------

Plugin = Callable[[Devices, Request, "Profile"], object]

# How a device that fails a filter is counted in "cannot place": (filter, status) -> words.
LABELS: dict[tuple[str, int], str] = {
    ("fits_kind", UNRESOLVABLE): "wrong kind",
    ("fits_compute", UNSCHEDULABLE): "compute full",
    ("fits_compute", UNRESOLVABLE): "slice larger than the device",
    ("fits_memory", UNSCHEDULABLE): "memory full",
    ("fits_memory", UNRESOLVABLE): "memory larger than the device",
    ("fits_anti_affinity", UNSCHEDULABLE): "at the per-device limit of its function",
}


@dataclass(frozen=True, slots=True)
class Profile:
    """Which filters run, which scorers with what weight, and their arguments
    (the framework's KubeSchedulerProfile with its pluginConfig). The default
    packs: binpack weighs 3, so fuller devices win unless the others agree."""

    filters: tuple[Plugin, ...] = (fits_kind, fits_compute, fits_memory, fits_anti_affinity)
    scores: tuple[tuple[Plugin, int], ...] = ((binpack, 3), (least_fragmentation, 1), (least_busy, 1), (warm_cache, 1))
    max_per_device: int | None = None  # anti-affinity: replicas of one function per device
    smallest_slice: Fraction = Fraction(1, 8)  # below this, free compute is stranded
    smallest_memory_mib: int = 1024  # below this, free memory is stranded
    smallest_units: np.ndarray = field(init=False, repr=False, compare=False)  # 0-d, like MAX_SCORE
    smallest_mib: np.ndarray = field(init=False, repr=False, compare=False)
    max_total: int = field(init=False, repr=False, compare=False)  # 100 x sum(weights)
    active: tuple[tuple[Plugin, np.ndarray | None], ...] = field(init=False, repr=False, compare=False)  # weight > 0

    def __post_init__(self) -> None:
        negative = [f"{p.__name__} {w}" for p, w in self.scores if not isinstance(w, int) or w < 0]
        if negative:
            raise ValueError(f"score weights must be whole numbers >= 0, got {', '.join(negative)}")
        object.__setattr__(self, "smallest_units", np.array(to_units(self.smallest_slice)))
        object.__setattr__(self, "smallest_mib", np.array(self.smallest_memory_mib))
        object.__setattr__(self, "max_total", int(MAX_SCORE) * sum(w for _, w in self.scores))
        # weight 1 as None (no multiplication), others as 0-d arrays
        object.__setattr__(self, "active", tuple((p, None if w == 1 else np.array(w, np.int32))
                                                 for p, w in self.scores if w))

    def weight(self, plugin: Plugin) -> int:
        return sum(w for p, w in self.scores if p is plugin)

    def with_scores(self, **weights: int) -> "Profile":
        """E.g. BINPACK.with_scores(warm_cache=0): the same plugins, other weights."""
        known = {p.__name__ for p, _ in self.scores}
        unknown = set(weights) - known
        if unknown:
            raise ValueError(f"no score plugin {sorted(unknown)} in this profile; it has {sorted(known)}")
        return Profile(self.filters, tuple((p, weights.get(p.__name__, w)) for p, w in self.scores),
                       self.max_per_device, self.smallest_slice, self.smallest_memory_mib)


BINPACK = Profile()
SPREAD = Profile(scores=((spread, 3), (least_fragmentation, 1), (least_busy, 1), (warm_cache, 1)))


def run_filters(profile: Profile, devices: Devices, request: Request) -> list[np.ndarray]:
    """Every filter's status per device (all run: the failure path reports the first that failed)."""
    return [f(devices, request, profile) for f in profile.filters]


def passing(statuses: list, devices: int) -> np.ndarray:
    """True where every filter said SUCCESS."""
    worst = SUCCESS
    for s in statuses:
        if s is not SUCCESS:  # a filter with nothing to say (anti-affinity off) costs nothing
            worst = s if worst is SUCCESS else worst | s
    if worst is SUCCESS:
        return np.ones(devices, bool)
    return ~worst if worst.dtype == bool else worst == SUCCESS


def weighted_total(profile: Profile, devices: Devices, request: Request):
    """The framework's score step: sum of weight x score, 0 .. 100 x sum(weights).
    // binpack 75 x 3 + fragmentation 100 x 1 + idle 70 x 1 + warm 0 x 1 = 395"""
    total = 0
    for plugin, weight in profile.active:
        score = plugin(devices, request, profile)
        total = total + (score if weight is None else weight * score)
    return total


def tie_break(preference: np.ndarray, id_rank: np.ndarray, profile: Profile) -> np.ndarray:
    """What decides beside the scores, as one integer per device: the preferred kind
    first (a real model takes a GPU over the CPU whatever the scores), then (after
    the weighted total) the highest id, so ties stay deterministic.
    // key = (preference x (max_total + 1) + total) x devices + id_rank"""
    return preference * ((profile.max_total + 1) * len(id_rank)) + id_rank


def choose(ok: np.ndarray, total, base: np.ndarray) -> int | None:
    """The index of the device to use, or None when no device passed the filters."""
    # int64: large weights on many devices would overflow the scores' int32
    key = (total * np.int64(len(base)) + base) * ok  # a device that passed has key > 0: its preference is >= 1
    best = int(key.argmax())
    return best if key[best] > 0 else None


def first_failures(profile: Profile, statuses: list, devices: int) -> tuple[list[tuple[str, int]], Status]:
    """How many devices failed on which filter, in words, and whether waiting can help:
    UNSCHEDULABLE when some device failed only UNSCHEDULABLE filters.
    E.g. [("compute full", 998), ("memory full", 2)]. A device is counted once, under
    its worst failure (one that can never pass before one that could: "memory larger
    than the device" says more than "compute full"), then under the first filter.
    Each device's statuses are read as the digits of one base-4 number (first filter
    first), so one bincount over the devices finds the few distinct patterns.
    // kind ok, compute full, memory ok, anti-affinity off: 0 1 0 0 (base 4) = 16"""
    pattern = 0
    for status in statuses:
        pattern = pattern * 4 + status
    bins = np.bincount(np.broadcast_to(pattern, (devices,)), minlength=4 ** len(statuses))
    counts: dict[str, int] = {}
    waiting_helps = False
    for value in np.flatnonzero(bins):
        digits = [int(value) // 4 ** (len(statuses) - 1 - i) % 4 for i in range(len(statuses))]
        code = max(digits)
        if code == SUCCESS:
            continue  # passed every filter (left out by the caller)
        name = profile.filters[digits.index(code)].__name__
        label = LABELS.get((name, code), f"{name} {Status(code).name.lower()}")
        counts[label] = counts.get(label, 0) + int(bins[value])
        waiting_helps |= code == UNSCHEDULABLE
    most_first = sorted(counts.items(), key=lambda item: -item[1])
    return most_first, Status.UNSCHEDULABLE if waiting_helps else Status.UNRESOLVABLE


def kind_preference(kinds_of_devices: np.ndarray, kind_names: list[str], wanted: tuple[str, ...]) -> np.ndarray:
    """Per device: len(wanted) - rank of its kind in `wanted`, 0 when not wanted.
    E.g. wanted (gpu, cpu): a gpu 2, a cpu 1, an emulated device 0."""
    table = np.zeros(len(kind_names), np.int64)
    for i, name in enumerate(kind_names):
        if name in wanted:
            table[i] = len(wanted) - wanted.index(name)
    return table[kinds_of_devices]
