"""Placing a batch of demands at once, and how few devices any packing could use.

`plan()` is best-fit decreasing: the largest demands first, each on the device
the binpack profile ranks highest (the fullest one that still fits). It works on
the immutable `Inventory` (the controller's) and on a `SliceCluster` (thousands
of devices), and never changes what it is given: the result carries the new
inventory. `lower_bound()` is what it is measured against.

Pure: stdlib and numpy only; no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from autoscaler.placement.cluster import SliceCluster
from autoscaler.placement.inventory import Inventory, place
from autoscaler.placement.plugins import BINPACK, Profile
from autoscaler.placement.types import Demand, Placement, Unplaceable


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]
    unplaceable: tuple[Unplaceable, ...]
    inventory: Inventory | SliceCluster  # after the placements; the one given is unchanged

    @property
    def devices_used(self) -> int:
        if isinstance(self.inventory, SliceCluster):
            return self.inventory.devices_in_use()
        return len({a.device for a in self.inventory.allocations})


def plan(demands: Iterable[Demand], inventory: Inventory | SliceCluster, profile: Profile | None = None) -> Plan:
    """Place `demands`, largest first, on a copy of `inventory`. `profile` defaults to
    the cluster's own (a SliceCluster) or BINPACK (an Inventory)."""
    demands = list(demands)
    largest_mib = max((d.memory_mib for d in inventory.devices), default=1)
    ordered = sorted(demands, key=lambda d: _size(d, largest_mib), reverse=True)
    if isinstance(inventory, SliceCluster):
        return _plan_on_cluster(ordered, inventory, profile)
    return _plan_on_inventory(ordered, inventory, profile or BINPACK)


def _size(demand: Demand, largest_mib: int) -> tuple[Fraction, Fraction]:
    """Decreasing by the larger of a demand's two dimensions, each as a share of a
    device, then by their sum. E.g. 1/8 compute with 40960 of 81920 MiB: (1/2, 5/8)."""
    memory = Fraction(demand.memory_mib, largest_mib) if demand.memory_mib is not None else demand.fraction
    return max(demand.fraction, memory), demand.fraction + memory


def _plan_on_cluster(ordered: list[Demand], cluster: SliceCluster, profile: Profile | None) -> Plan:
    work = cluster.copy()
    if profile is not None:
        work.profile = profile
    placed, refused = [], []
    for demand in ordered:
        result = work.place(demand)
        (placed if isinstance(result, Placement) else refused).append(result)
    return Plan(tuple(placed), tuple(refused), work)


def _plan_on_inventory(ordered: list[Demand], inventory: Inventory, profile: Profile) -> Plan:
    placed, refused = [], []
    for demand in ordered:
        result = place(demand, inventory, profile)
        if isinstance(result, Placement):
            inventory = inventory.allocate(result)
            placed.append(result)
        else:
            refused.append(result)
    return Plan(tuple(placed), tuple(refused), inventory)


def lower_bound(demands: Iterable[Demand], capacity_compute: Fraction | int = 1,
                capacity_memory_mib: int | None = None) -> int:
    """The fewest identical devices any packing could use: in each dimension, the total
    asked over one device's capacity, rounded up; the larger of the two (the L1 bound
    of vector bin packing; it assumes every device is alike, and a slice without its
    own memory figure takes its share of `capacity_memory_mib`).
    E.g. slices 1/2 + 1/2 + 1/4: ceil(1.25 / 1) = 2; memory 30 + 30 + 30 GiB on
    80 GiB devices: ceil(90 / 80) = 2."""
    demands = list(demands)
    compute = sum((Fraction(d.fraction) for d in demands), Fraction(0))
    bound = math.ceil(compute / Fraction(capacity_compute))
    if capacity_memory_mib:
        memory = sum((d.memory_mib if d.memory_mib is not None else d.fraction * capacity_memory_mib for d in demands),
                     Fraction(0))
        bound = max(bound, math.ceil(memory / capacity_memory_mib))
    return bound
