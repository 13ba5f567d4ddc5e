"""Placement: devices cut into slices, and where each replica goes (DESIGN.md section 7).

Owns, after the Kubernetes scheduler framework:
- `types`: Device, Demand, Placement, Unplaceable, Status, compute `UNITS`;
- `plugins`: filters (kind, compute, memory, anti-affinity) that return a status
  per device, scorers (binpack or spread, least fragmentation, least busy,
  warm artifact cache) that return 0..100, the `Profile` that weighs them, and
  the one compiled pass (numba) that runs them over all devices;
- `cluster`: `SliceCluster`, the devices as arrays and the one `place()`, for
  the controller, the simulator and the planner alike;
- `inventory`: `Inventory`, a frozen snapshot of devices and allocations (no placing);
- `planner`: `plan()` (best-fit decreasing over a batch) and `lower_bound()`.

"Cannot place" is a result with reasons (`Unplaceable`), never an exception.

Pure: stdlib, numpy and numba. It must not import asyncio, httpx, subprocess,
kubernetes, socket or time (checked by the import-linter contract in pyproject.toml).
"""

from autoscaler.placement.cluster import SliceCluster
from autoscaler.placement.inventory import Inventory
from autoscaler.placement.planner import Plan, lower_bound, plan
from autoscaler.placement.plugins import (
    BINPACK, SPREAD, Profile, binpack, fits_anti_affinity, fits_compute, fits_kind, fits_memory, least_busy,
    least_fragmentation, spread, warm_cache,
)
from autoscaler.placement.types import (
    UNITS, Allocation, Demand, Device, Placement, Status, Unplaceable, cpu_device, memory_for, parse_devices, to_units,
)

__all__ = [
    "BINPACK", "SPREAD", "UNITS", "Allocation", "Demand", "Device", "Inventory", "Placement", "Plan", "Profile",
    "SliceCluster", "Status", "Unplaceable", "binpack", "cpu_device", "fits_anti_affinity", "fits_compute",
    "fits_kind", "fits_memory", "least_busy", "least_fragmentation", "lower_bound", "memory_for", "parse_devices",
    "plan", "spread", "to_units", "warm_cache",
]
