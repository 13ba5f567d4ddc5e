"""Filter and score plugins, after the Kubernetes scheduler framework, and the one pass that runs them.

A filter says whether one device can take a demand: a `Status` code (SUCCESS,
UNSCHEDULABLE, UNRESOLVABLE), never an exception. A scorer ranks one device from
0 to 100 (the framework's MinNodeScore .. MaxNodeScore); a `Profile` names the
filters and the scorers with their weights, like a KubeSchedulerProfile. Each
plugin is written once, on one device's numbers (`Fit`, `Left`), in the subset of
Python that numba compiles: `best_device` runs a profile's plugins over every
device in one compiled loop, `filter_statuses` runs its filters alone for the
"cannot place" reasons, and a test calls a plugin as plain Python. The plugins and
the passes live in this one file because numba's cache of a compiled function is
keyed by the file it is in alone. Arithmetic is in integers: compute in `UNITS`
per device, memory in MiB, scores floored like the framework's int64 scores.

Pure: numpy and numba; no I/O, no clock.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np
from numba import njit
from numba.extending import register_jitable

from autoscaler.placement import types
from autoscaler.placement.types import Status, to_units

# Written as numbers, not read from types: compiled code freezes the globals it reads into
# numba's cache of this file, so a change there must change this file too. UNITS as a constant
# also lets the compiler turn "x 100 // UNITS" into a multiplication.
SUCCESS, UNSCHEDULABLE, UNRESOLVABLE = 0, 1, 2
UNITS = 720720
if (SUCCESS, UNSCHEDULABLE, UNRESOLVABLE, UNITS) != (Status.SUCCESS, Status.UNSCHEDULABLE, Status.UNRESOLVABLE,
                                                     types.UNITS):
    raise ImportError("placement.plugins' status codes or UNITS differ from placement.types': make them agree")
MAX_SCORE = 100

# One device as the filters see it for one demand (the framework's NodeInfo with what its
# PreFilter works out): the need, what would be left after placing (below 0: it does not
# fit), the capacity; preference 0: a kind the demand may not run on.
Fit = namedtuple("Fit", "preference units left_units capacity_units mib left_mib capacity_mib same_function")
# A device that passed, as the scorers see it: what is left, also as shares 0..100.
Left = namedtuple("Left", "left_units left_mib units_pct mib_pct busy_pct warm")
# The profile's arguments (the framework's pluginConfig); max_per_device -1: no limit.
Args = namedtuple("Args", "max_per_device smallest_units smallest_mib")


# ---- filters: (Fit, Args) -> Status code ---------------------------------------------------


@register_jitable
def fits_kind(fit, args):
    """UNRESOLVABLE where the device's kind is not one the demand may run on
    (a `profile` model needs an emulated device; a CPU never becomes a GPU)."""
    return UNRESOLVABLE if fit.preference == 0 else SUCCESS


@register_jitable
def fits_compute(fit, args):
    """The framework's NodeResourcesFit for compute. E.g. 3/4 used, a 1/2 slice:
    1/2 > 1/4 free -> UNSCHEDULABLE; a 3/2 slice: > the whole device -> UNRESOLVABLE."""
    return fits(fit.units, fit.left_units, fit.capacity_units)


@register_jitable
def fits_memory(fit, args):
    """NodeResourcesFit for memory. E.g. 81920 MiB, 60000 used, 30000 asked:
    30000 > 21920 free -> UNSCHEDULABLE; 92160 asked: > 81920 -> UNRESOLVABLE."""
    return fits(fit.mib, fit.left_mib, fit.capacity_mib)


@register_jitable
def fits_anti_affinity(fit, args):
    """At most `max_per_device` replicas of one function per device, so one device's
    failure takes few of them (the framework's InterPodAffinity, anti side).
    E.g. at most 2, the device runs 2 already -> UNSCHEDULABLE."""
    if args.max_per_device < 0 or fit.same_function < args.max_per_device:
        return SUCCESS
    return UNSCHEDULABLE


@register_jitable
def fits(need, left, capacity):
    """`left` below 0 does not fit now (UNSCHEDULABLE: others could leave), and never
    where the need is over the whole device (UNRESOLVABLE)."""
    if left >= 0:
        return SUCCESS
    return UNRESOLVABLE if need > capacity else UNSCHEDULABLE


# ---- scorers: (Left, Args) -> 0..100 ----------------------------------------------------------


@register_jitable
def free_pct(left, capacity):
    """The framework's LeastAllocated for one resource, from what is left after placing.
    // 1/2 used + 1/4 asked: 180180 of 720720 units left: (180180 * 100) // 720720 = 25"""
    return left * MAX_SCORE // capacity


@register_jitable
def spread(left, args):
    """LeastAllocated over compute and memory (weight 1 each) after placing: emptier
    devices first, so replicas share few devices.
    // 1/2 used + 1/4 asked: 25 of compute left; 20480 of 81920 MiB left: 25; (25 + 25) // 2 = 25"""
    return (left.units_pct + left.mib_pct) // 2


@register_jitable
def binpack(left, args):
    """The reverse of spread (the framework's MostAllocated, up to rounding): fuller
    devices first, so whole devices stay idle. // 100 - (25 + 25) // 2 = 75"""
    return MAX_SCORE - spread(left, args)


@register_jitable
def least_fragmentation(left, args):
    """100 less the share of the device (compute and memory averaged) that placing would
    leave in pieces no slice can use: free compute is stranded when less than the
    smallest slice of it, or too little memory for one, is left; free memory is
    stranded when less than the smallest slice of compute is left.
    // 0 compute and 32768 of 81920 MiB left: memory stranded 40, compute 0: 100 - (0 + 40) // 2 = 80
    // 1/8 compute and 32768 MiB left: a 1/8 slice can use both: 100"""
    tiny = left.left_units < args.smallest_units
    starved = left.left_mib < args.smallest_mib
    stranded = ((left.units_pct if tiny or starved else 0) + (left.mib_pct if tiny else 0)) // 2
    return MAX_SCORE - stranded


@register_jitable
def least_busy(left, args):
    """Prefer the physical device observed least busy (its duty cycle, 0 until observed).
    // busy 30 % of the time: 100 - 30 = 70"""
    return MAX_SCORE - left.busy_pct


@register_jitable
def warm_cache(left, args):
    """The framework's ImageLocality, for artifacts: 100 where the node has run this
    function before (its artifact is on local disk), else 0."""
    return MAX_SCORE if left.warm else 0


def duty_pct(duty: float) -> int:
    """An observed duty 0..1 as whole percent, clamped: 0.304 -> 30; 1.7 -> 100."""
    return round(100 * min(1.0, max(0.0, duty)))


# ---- the framework's steps on one device, by a plugin's place in FILTERS and SCORERS --------

FILTERS = (fits_kind, fits_compute, fits_memory, fits_anti_affinity)
SCORERS = (binpack, spread, least_fragmentation, least_busy, warm_cache)


@register_jitable
def run_filter(k, fit, args):
    """FILTERS[k] on one device."""
    if k == 0:
        return fits_kind(fit, args)
    if k == 1:
        return fits_compute(fit, args)
    if k == 2:
        return fits_memory(fit, args)
    return fits_anti_affinity(fit, args)


@register_jitable
def passes(fit, args):
    """True when every filter says SUCCESS (every profile runs them all; their order only
    says which failure "cannot place" counts a device under)."""
    return (fits_kind(fit, args) == SUCCESS and fits_compute(fit, args) == SUCCESS
            and fits_memory(fit, args) == SUCCESS and fits_anti_affinity(fit, args) == SUCCESS)


@register_jitable
def weighted_total(weights, left, args):
    """The framework's score step: sum of weight x score, weights per SCORERS.
    // binpack 75 x 3 + fragmentation 100 x 1 + idle 70 x 1 + warm 0 x 1 = 395"""
    total = 0
    if weights[0]:
        total += weights[0] * binpack(left, args)
    if weights[1]:
        total += weights[1] * spread(left, args)
    if weights[2]:
        total += weights[2] * least_fragmentation(left, args)
    if weights[3]:
        total += weights[3] * least_busy(left, args)
    if weights[4]:
        total += weights[4] * warm_cache(left, args)
    return total


@register_jitable
def choice_key(preference, total, id_rank, devices, max_total):
    """What ranks the devices that passed, as one integer: the preferred kind first (a
    real model takes a GPU over the CPU whatever the scores), then the weighted total,
    then the highest id, so ties stay deterministic; above 0, as preference is >= 1.
    // key = (preference x (max_total + 1) + total) x devices + id_rank"""
    return (preference * (max_total + 1) + total) * devices + id_rank


@register_jitable
def fit_of(preference, units, free_units, capacity_units, mib, free_mib, capacity_mib, same_function):
    """The framework's PreFilter for one device: what would be left after placing."""
    return Fit(preference, units, free_units - units, capacity_units, mib, free_mib - mib, capacity_mib, same_function)


@register_jitable
def left_of(fit, busy_pct, warm):
    """The framework's PreScore for a device that passed: what is left as shares."""
    return Left(fit.left_units, fit.left_mib, free_pct(fit.left_units, fit.capacity_units),
                free_pct(fit.left_mib, fit.capacity_mib), busy_pct, warm)


# ---- the compiled passes over all devices -----------------------------------------------------

# Arguments: the cluster's per-device state (free compute units and MiB, MiB capacity, duty in
# percent, place in id order); the demand's per-device arrays (kind preference, MiB needed on
# each, warm node, its replicas there, the caller's mask; an empty array: not given) and its
# units and MiB; the profile's `filter_places` (filter_statuses' columns: best_device runs every
# filter), `weights` and `numbers`.
SIGNATURE = ("(int32[::1], int32[::1], int32[::1], int64[::1], int64[::1], int64[::1], int32[::1], bool[::1], "
             "int64[::1], bool[::1], int64, int64, int64[::1], int64[::1], int64[::1])")
JIT = dict(cache=True, nogil=True, error_model="numpy")  # numpy's: a division by 0 gives 0, not an exception
NONE_I32, NONE_I64, NONE_BOOL = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.bool_)
# The passes read the arrays and hand the plugins scalars and tuples only: an array handed to a
# function is reference-counted on every call (a pass about 4x slower on 1,000 devices); and the
# filters are called in a fixed order, not by a loop over the profile's (about 2.5x slower).


def _best_device(free_units, free_mib, capacity_mib, busy_pct, id_rank, preference, mib_each, warm,
                 same_function, allowed, units, mib, filters, weights, numbers):
    """Filter, score and choose for one demand: the index of the device with the highest
    choice_key among those that pass every filter and `allowed`, or -1 when none does."""
    args = Args(numbers[0], numbers[1], numbers[2])
    w = (weights[0], weights[1], weights[2], weights[3], weights[4])  # len(SCORERS)
    n = free_units.shape[0]
    best, best_key = -1, 0
    for i in range(n):
        fit = fit_of(preference[i], units, free_units[i], UNITS, mib_each[i] if mib_each.shape[0] else mib,
                     free_mib[i], capacity_mib[i], same_function[i] if same_function.shape[0] else 0)
        if not passes(fit, args) or (allowed.shape[0] and not allowed[i]):
            continue
        left = left_of(fit, busy_pct[i] if busy_pct.shape[0] else 0, warm.shape[0] > 0 and warm[i])
        key = choice_key(fit.preference, weighted_total(w, left, args), id_rank[i], n, numbers[3])
        if key > best_key:
            best, best_key = i, key
    return best


def _filter_statuses(free_units, free_mib, capacity_mib, busy_pct, id_rank, preference, mib_each, warm,
                     same_function, allowed, units, mib, filters, weights, numbers):
    """Every filter's status on every device, one column per entry of `filters`."""
    args = Args(numbers[0], numbers[1], numbers[2])
    out = np.empty((free_units.shape[0], filters.shape[0]), np.int8)
    for i in range(free_units.shape[0]):
        fit = fit_of(preference[i], units, free_units[i], UNITS, mib_each[i] if mib_each.shape[0] else mib,
                     free_mib[i], capacity_mib[i], same_function[i] if same_function.shape[0] else 0)
        for j in range(filters.shape[0]):
            out[i, j] = run_filter(filters[j], fit, args)
    return out


def _compile(function, signature: str):
    try:
        return njit(signature, **JIT)(function)
    except RuntimeError:  # numba found no writable cache directory: compile in this process instead
        return njit(signature, **{**JIT, "cache": False})(function)


best_device = _compile(_best_device, "int64" + SIGNATURE)
filter_statuses = _compile(_filter_statuses, "int8[:, ::1]" + SIGNATURE)


# ---- the profile ----------------------------------------------------------------------------

Plugin = Callable[..., int]

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
    """Which filters run, which scorers with what weight, and their arguments (the
    framework's KubeSchedulerProfile with its pluginConfig), drawn from FILTERS and
    SCORERS. The default packs: binpack weighs 3, so fuller devices win unless the
    others agree."""

    filters: tuple[Plugin, ...] = FILTERS
    scores: tuple[tuple[Plugin, int], ...] = ((binpack, 3), (least_fragmentation, 1), (least_busy, 1), (warm_cache, 1))
    max_per_device: int | None = None  # anti-affinity: replicas of one function per device
    smallest_slice: Fraction = Fraction(1, 8)  # below this, free compute is stranded
    smallest_memory_mib: int = 1024  # below this, free memory is stranded
    # what the compiled passes take: places in FILTERS in this profile's order, weights per
    # SCORERS, and [max_per_device or -1, smallest units, smallest MiB, 100 x sum(weights)]
    filter_places: np.ndarray = field(init=False, repr=False, compare=False)
    weights: np.ndarray = field(init=False, repr=False, compare=False)
    numbers: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        negative = [f"{p.__name__} {w}" for p, w in self.scores if not isinstance(w, int) or w < 0]
        if negative:
            raise ValueError(f"score weights must be whole numbers >= 0, got {', '.join(negative)}")
        if sorted(FILTERS.index(p) if p in FILTERS else -1 for p in self.filters) != list(range(len(FILTERS))):
            names = ", ".join(p.__name__ for p in FILTERS)
            raise ValueError(f"filters must be {names} in some order (every one guards the placement), got "
                             f"{', '.join(getattr(p, '__name__', repr(p)) for p in self.filters)}")
        _known_scorers([p for p, _ in self.scores])
        weights = [self.weight(p) for p in SCORERS]
        limit = -1 if self.max_per_device is None else self.max_per_device
        numbers = [limit, to_units(self.smallest_slice), self.smallest_memory_mib, MAX_SCORE * sum(weights)]
        object.__setattr__(self, "filter_places", np.array([FILTERS.index(p) for p in self.filters], np.int64))
        object.__setattr__(self, "weights", np.array(weights, np.int64))
        object.__setattr__(self, "numbers", np.array(numbers, np.int64))

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


def _known_scorers(plugins: list[Plugin]) -> None:
    """A scorer runs compiled, so it must be one written here (and added to SCORERS)."""
    unknown = [getattr(p, "__name__", repr(p)) for p in plugins if p not in SCORERS]
    if unknown:
        names = ", ".join(p.__name__ for p in SCORERS)
        raise ValueError(f"{', '.join(unknown)} is not a score plugin of placement.plugins; they are {names}")


BINPACK = Profile()
SPREAD = Profile(scores=((spread, 3), (least_fragmentation, 1), (least_busy, 1), (warm_cache, 1)))


# ---- "cannot place" and kinds, in numpy ------------------------------------------------------


def first_failures(profile: Profile, statuses: np.ndarray) -> tuple[list[tuple[str, int]], Status]:
    """How many devices failed on which filter, in words, and whether waiting can help:
    UNSCHEDULABLE when some device failed only UNSCHEDULABLE filters.
    E.g. [("compute full", 998), ("memory full", 2)]. A device is counted once, under
    its worst failure (one that can never pass before one that could: "memory larger
    than the device" says more than "compute full"), then under the first filter.
    Each row of `statuses` (filter_statuses) is read as the digits of one base-4 number,
    first filter first, so one bincount over the devices finds the few distinct patterns.
    // kind ok, compute full, memory ok, anti-affinity ok: 0 1 0 0 (base 4) = 16"""
    width = statuses.shape[1]
    bins = np.bincount(statuses.astype(np.int64) @ 4 ** np.arange(width - 1, -1, -1), minlength=4 ** width)
    counts: dict[str, int] = {}
    waiting_helps = False
    for value in np.flatnonzero(bins):
        digits = [int(value) // 4 ** (width - 1 - i) % 4 for i in range(width)]
        code = max(digits)
        if code == SUCCESS:
            continue  # passed every filter (left out by the caller)
        label = failure_label(profile.filters[digits.index(code)], code)
        counts[label] = counts.get(label, 0) + int(bins[value])
        waiting_helps |= code == UNSCHEDULABLE
    most_first = sorted(counts.items(), key=lambda item: -item[1])
    return most_first, Status.UNSCHEDULABLE if waiting_helps else Status.UNRESOLVABLE


def failure_label(plugin: Plugin, code: int) -> str:
    return LABELS.get((plugin.__name__, code), f"{plugin.__name__} {Status(code).name.lower()}")


def kind_preference(kinds_of_devices: np.ndarray, kind_names: list[str], wanted: tuple[str, ...]) -> np.ndarray:
    """Per device: len(wanted) - rank of its kind in `wanted`, 0 when not wanted.
    E.g. wanted (gpu, cpu): a gpu 2, a cpu 1, an emulated device 0."""
    table = np.zeros(len(kind_names), np.int64)
    for i, name in enumerate(kind_names):
        if name in wanted:
            table[i] = len(wanted) - wanted.index(name)
    return table[kinds_of_devices]
