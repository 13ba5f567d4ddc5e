"""`Inventory`: the devices and what is allocated on them, as a frozen value.

Placement happens on a `SliceCluster`; an inventory is what goes into one (the
devices and any replicas already running: `SliceCluster.from_inventory`) and what
comes out of one (`to_inventory`) for whoever only reads it. It places nothing.

Pure: stdlib only; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from autoscaler.placement.types import Allocation, Device


@dataclass(frozen=True, slots=True)
class Inventory:
    """Also what has run where (`warm`, for the warm-cache scorer) and what was observed
    busy (`busy`, for the least-busy one)."""

    devices: tuple[Device, ...]
    allocations: tuple[Allocation, ...] = ()
    warm: frozenset[tuple[str, str]] = frozenset()  # (function, node) pairs that have run a replica
    busy: Mapping[str, float] = field(default_factory=dict, hash=False)  # device id -> observed duty 0..1
