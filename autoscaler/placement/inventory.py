"""The immutable inventory the controller keeps, and `place()`: one demand, one decision.

`place(demand, inventory)` runs the profile's filter and score plugins over the
inventory's devices (the same plugins `SliceCluster` runs at scale) and returns a
`Placement`, or an `Unplaceable` with one reason per device in words.
`allocate` and `release` return a new inventory; nothing is mutated.

Pure: stdlib and numpy only; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Mapping

import numpy as np

from autoscaler.placement import plugins
from autoscaler.placement.plugins import BINPACK, Devices, Profile, Request
from autoscaler.placement.types import (
    UNITS, Allocation, Demand, Device, Placement, Status, Unplaceable, invalid, least_used_cores, memory_for, to_units,
)


@dataclass(frozen=True, slots=True)
class Inventory:
    """The devices and what is allocated on them, as a value: the controller's snapshot.
    Also what has run where (`warm`, for the warm-cache scorer) and what was observed
    busy (`busy`, for the least-busy one)."""

    devices: tuple[Device, ...]
    allocations: tuple[Allocation, ...] = ()
    warm: frozenset[tuple[str, str]] = frozenset()  # (function, node) pairs that have run a replica
    busy: Mapping[str, float] = field(default_factory=dict, hash=False)  # device id -> observed duty 0..1
    # device id -> (compute, MiB, units) in use: built once per inventory, so used() is O(1)
    _used: dict[str, tuple[Fraction, int, int]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        used: dict[str, tuple[Fraction, int, int]] = {}
        for a in self.allocations:
            f, m, u = used.get(a.device, (Fraction(0), 0, 0))
            used[a.device] = (f + a.fraction, m + a.memory_mib, u + to_units(a.fraction))
        object.__setattr__(self, "_used", used)

    def used(self, device_id: str) -> tuple[Fraction, int]:
        f, m, _ = self._used.get(device_id, (Fraction(0), 0, 0))
        return f, m

    def used_units(self, device_id: str) -> int:
        return self._used.get(device_id, (0, 0, 0))[2]

    def allocate(self, placement: Placement) -> "Inventory":
        alloc = Allocation(placement.replica, placement.device.id, placement.fraction, placement.memory_mib,
                           placement.cpus, placement.function)
        warm = self.warm | {(placement.function, placement.device.node)} if placement.function else self.warm
        return replace(self, allocations=self.allocations + (alloc,), warm=warm)

    def release(self, replica: str) -> "Inventory":
        return replace(self, allocations=tuple(a for a in self.allocations if a.replica != replica))

    def with_busy(self, device_id: str, duty: float) -> "Inventory":
        """The observed duty (0..1) of a physical device, for the least-busy scorer."""
        return replace(self, busy={**self.busy, device_id: duty})

    def allocated_ratio(self, device_id: str) -> float:
        return float(self.used(device_id)[0])


def place(demand: Demand, inventory: Inventory, profile: Profile = BINPACK) -> Placement | Unplaceable:
    """Filter, score, choose (the framework's scheduling cycle) for one demand."""
    if (problem := invalid(demand)) is not None:
        return Unplaceable(demand.replica, (problem,), Status.ERROR)
    if not inventory.devices:
        return Unplaceable(demand.replica, ("no devices in the inventory",), Status.UNRESOLVABLE)
    devices, request = _arrays(demand, inventory, profile)
    statuses = plugins.run_filters(profile, devices, request)
    ok = plugins.passing(statuses, len(inventory.devices))
    if not ok.any():
        return _unplaceable(demand, inventory, profile, statuses)
    total = plugins.weighted_total(profile, devices, request)
    best = plugins.choose(ok, total, plugins.tie_break(request.preference, _id_rank(inventory.devices), profile))
    device = inventory.devices[best]
    cpus = pick_cpus(demand.fraction, device, inventory)
    return Placement(demand.replica, device, demand.fraction, memory_for(demand, device), cpus, demand.function)


def pick_cpus(fraction: Fraction, device: Device, inventory: Inventory) -> tuple[int, ...]:
    """For a CPU slice: its share of the cores, the least used cores first.
    E.g. 1/4 of 8 cores = 2 cores; 1/4 of 2 cores rounds up to 1."""
    if device.kind != "cpu" or not device.cpus:
        return ()
    load: dict[int, int] = {}
    for a in inventory.allocations:
        for c in a.cpus:
            load[c] = load.get(c, 0) + 1
    return least_used_cores(fraction, device.cpus, load)


def _arrays(demand: Demand, inventory: Inventory, profile: Profile) -> tuple[Devices, Request]:
    ds = inventory.devices
    devices = Devices(
        capacity_units=np.array(UNITS),
        free_units=np.array([UNITS - inventory.used_units(d.id) for d in ds], np.int64),
        capacity_mib=np.array([d.memory_mib for d in ds], np.int64),
        free_mib=np.array([d.memory_mib - inventory.used(d.id)[1] for d in ds], np.int64),
        least_units=UNITS, least_mib=min(d.memory_mib for d in ds),
    )
    if inventory.busy:
        devices.busy_pct = np.array([plugins.duty_pct(inventory.busy.get(d.id, 0.0)) for d in ds], np.int64)
    kinds = sorted({d.kind for d in ds})
    preference = plugins.kind_preference(np.array([kinds.index(d.kind) for d in ds]), kinds, demand.kinds)
    request = Request(demand, to_units(demand.fraction), np.array([memory_for(demand, d) for d in ds], np.int64),
                      preference)
    plugins.prepare(devices, request)
    if profile.max_per_device is not None:
        mine = [a.device for a in inventory.allocations if a.function == demand.function]
        request.same_function = np.array([mine.count(d.id) for d in ds], np.int64)
    if profile.weight(plugins.warm_cache):
        request.warm = np.array([(demand.function, d.node) in inventory.warm for d in ds])
    return devices, request


def _id_rank(devices: tuple[Device, ...]) -> np.ndarray:
    """Each device's place in id order: the tie-break (the highest id wins)."""
    rank = np.empty(len(devices), np.int64)
    rank[np.argsort([d.id for d in devices], kind="stable")] = np.arange(len(devices))
    return rank


def _unplaceable(demand: Demand, inventory: Inventory, profile: Profile, statuses: list[np.ndarray]) -> Unplaceable:
    """One reason per device with the numbers, from its worst failure (as the counts
    are: one that can never pass before one that could), then the first filter."""
    n = len(inventory.devices)
    statuses = [np.broadcast_to(s, (n,)) for s in statuses]  # a filter may answer one plain SUCCESS for all
    reasons = []
    for i, device in enumerate(inventory.devices):
        codes = [int(s[i]) for s in statuses]
        if max(codes) != plugins.SUCCESS:
            failed = profile.filters[codes.index(max(codes))]
            reasons.append(_reason(failed.__name__, demand, device, inventory, profile))
    counts, status = plugins.first_failures(profile, statuses, len(inventory.devices))
    return Unplaceable(demand.replica, tuple(reasons), status, tuple(counts))


def _reason(filter_name: str, demand: Demand, device: Device, inventory: Inventory, profile: Profile) -> str:
    used, used_mib = inventory.used(device.id)
    if filter_name == "fits_kind":
        return f"{device.id}: kind {device.kind}, needs {' or '.join(demand.kinds)}"
    if filter_name == "fits_compute":
        return f"{device.id}: {float(1 - used):.0%} of compute free, needs {float(demand.fraction):.0%}"
    if filter_name == "fits_memory":
        return f"{device.id}: {device.memory_mib - used_mib} MiB free, needs {memory_for(demand, device)} MiB"
    if filter_name == "fits_anti_affinity":
        limit = profile.max_per_device
        return f"{device.id}: runs {limit} replicas of {demand.function} already, at most {limit}"
    return f"{device.id}: {filter_name} failed"
