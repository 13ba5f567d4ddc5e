"""Placing a batch of demands at once, and how few devices any packing could use.

`plan()` is best-fit decreasing: the largest demands first, each placed by
`SliceCluster.place` (the one placement) on a copy of the cluster, so with the
binpack profile on the fullest device that still fits. It never changes what it
is given: the result carries the new cluster. `lower_bound()` is what it is
measured against.

Pure: stdlib and numpy; no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable

from autoscaler.placement.cluster import SliceCluster
from autoscaler.placement.plugins import Profile
from autoscaler.placement.types import Demand, Placement, Unplaceable


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]
    unplaceable: tuple[Unplaceable, ...]
    cluster: SliceCluster  # after the placements; the one given is unchanged

    @property
    def devices_used(self) -> int:
        return self.cluster.devices_in_use()


def plan(demands: Iterable[Demand], cluster: SliceCluster, profile: Profile | None = None) -> Plan:
    """Place `demands`, largest first, on a copy of `cluster`, with `profile` (by default
    the cluster's own)."""
    demands = list(demands)
    largest_mib = max((d.memory_mib for d in cluster.devices), default=1)
    work = cluster.copy()
    if profile is not None:
        work.profile = profile
    placed, refused = [], []
    for demand in sorted(demands, key=lambda d: _size(d, largest_mib), reverse=True):
        result = work.place(demand)
        (placed if isinstance(result, Placement) else refused).append(result)
    return Plan(tuple(placed), tuple(refused), work)


def _size(demand: Demand, largest_mib: int) -> tuple[Fraction, Fraction]:
    """Decreasing by the larger of a demand's two dimensions, each as a share of a
    device, then by their sum. E.g. 1/8 compute with 40960 of 81920 MiB: (1/2, 5/8)."""
    memory = Fraction(demand.memory_mib, largest_mib) if demand.memory_mib is not None else demand.fraction
    return max(demand.fraction, memory), demand.fraction + memory


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
