"""Placement: an inventory of devices cut into slices, and where a replica goes (pure).

Filters say whether a device can take a replica (kind, compute, memory) and
return a reason when not; scorers rank the devices that pass (binpack: the
fullest device first, so whole devices stay free). "Cannot place" is a result
with the reasons, not an exception. First version (issue 3); issue 4 grows the
plugin set (spread, least fragmentation, warm artifact cache) and the planner.

Device kinds: `gpu` (found by NVML), `cpu` (this machine; a slice is a share of
its cores) and `emulated` (exists only here, for `profile` models; always
labelled emulated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable


@dataclass(frozen=True, slots=True)
class Device:
    id: str  # "gpu:0", "cpu:0", "emulated:2"
    kind: str  # gpu | cpu | emulated
    memory_mib: int
    cpus: tuple[int, ...] = ()  # for kind cpu: the cores a slice is cut from
    node: str = "local"
    name: str = ""

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"


@dataclass(frozen=True, slots=True)
class Allocation:
    replica: str
    device: str
    fraction: Fraction
    memory_mib: int
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Demand:
    replica: str
    function: str
    fraction: Fraction
    memory_mib: int | None  # None: the slice's share of the device's memory
    kinds: tuple[str, ...]  # device kinds it may run on, in order of preference


@dataclass(frozen=True, slots=True)
class Placement:
    replica: str
    device: Device
    fraction: Fraction
    memory_mib: int
    cpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Unplaceable:
    replica: str
    reasons: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True, slots=True)
class Inventory:
    devices: tuple[Device, ...]
    allocations: tuple[Allocation, ...] = ()

    def used(self, device_id: str) -> tuple[Fraction, int]:
        mine = [a for a in self.allocations if a.device == device_id]
        return sum((a.fraction for a in mine), Fraction(0)), sum(a.memory_mib for a in mine)

    def allocate(self, placement: Placement) -> "Inventory":
        alloc = Allocation(placement.replica, placement.device.id, placement.fraction, placement.memory_mib, placement.cpus)
        return replace(self, allocations=self.allocations + (alloc,))

    def release(self, replica: str) -> "Inventory":
        return replace(self, allocations=tuple(a for a in self.allocations if a.replica != replica))

    def allocated_ratio(self, device_id: str) -> float:
        return float(self.used(device_id)[0])


Filter = Callable[[Demand, Device, Inventory], str | None]  # None: passes; else the reason


def fits_kind(demand: Demand, device: Device, inventory: Inventory) -> str | None:
    if device.kind not in demand.kinds:
        return f"{device.id}: kind {device.kind}, needs {' or '.join(demand.kinds)}"
    return None


def fits_compute(demand: Demand, device: Device, inventory: Inventory) -> str | None:
    used, _ = inventory.used(device.id)
    if used + demand.fraction > 1:
        return f"{device.id}: {float(1 - used):.0%} of compute free, needs {float(demand.fraction):.0%}"
    return None


def fits_memory(demand: Demand, device: Device, inventory: Inventory) -> str | None:
    _, used = inventory.used(device.id)
    need = memory_for(demand, device)
    if used + need > device.memory_mib:
        return f"{device.id}: {device.memory_mib - used} MiB free, needs {need} MiB"
    return None


FILTERS: tuple[Filter, ...] = (fits_kind, fits_compute, fits_memory)


def memory_for(demand: Demand, device: Device) -> int:
    return demand.memory_mib if demand.memory_mib is not None else int(device.memory_mib * demand.fraction)


def binpack_score(demand: Demand, device: Device, inventory: Inventory) -> float:
    """Higher for fuller devices (after placing), so replicas pack and whole devices stay idle;
    ties go to the preferred kind. E.g. a device 50 % used taking a 1/4 slice scores 0.75."""
    used, _ = inventory.used(device.id)
    kind_rank = demand.kinds.index(device.kind) if device.kind in demand.kinds else len(demand.kinds)
    return float(used + demand.fraction) - kind_rank


def place(demand: Demand, inventory: Inventory) -> Placement | Unplaceable:
    reasons: list[str] = []
    candidates: list[Device] = []
    for device in inventory.devices:
        failed = next((r for f in FILTERS if (r := f(demand, device, inventory)) is not None), None)
        if failed is None:
            candidates.append(device)
        else:
            reasons.append(failed)
    if not candidates:
        return Unplaceable(demand.replica, tuple(reasons) or ("no devices in the inventory",))
    best = max(candidates, key=lambda d: (binpack_score(demand, d, inventory), d.id))
    return Placement(
        demand.replica, best, demand.fraction, memory_for(demand, best), pick_cpus(demand.fraction, best, inventory)
    )


def pick_cpus(fraction: Fraction, device: Device, inventory: Inventory) -> tuple[int, ...]:
    """For a CPU slice: its share of the cores, the least used cores first.
    E.g. 1/4 of 8 cores = 2 cores; 1/4 of 2 cores rounds up to 1."""
    if device.kind != "cpu" or not device.cpus:
        return ()
    count = max(1, math.ceil(float(fraction) * len(device.cpus) - 1e-9))
    load = {c: 0 for c in device.cpus}
    for a in inventory.allocations:
        for c in a.cpus:
            if c in load:
                load[c] += 1
    return tuple(sorted(sorted(device.cpus, key=lambda c: (load[c], c))[:count]))


def parse_devices(text: str, cpus: tuple[int, ...], memory_mib: int, gpus: list[Device] | None = None) -> tuple[Device, ...]:
    """`auto` (GPUs found by NVML, else this machine's CPU), `cpu`, or `emulated:4x80GiB`
    (adds emulated devices, plus the CPU for real models); parts join with ','."""
    devices: list[Device] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "auto":
            devices.extend(gpus or [])
            if not gpus:
                devices.append(cpu_device(cpus, memory_mib))
        elif part == "cpu":
            devices.append(cpu_device(cpus, memory_mib))
        elif part.startswith("emulated:"):
            devices.extend(_emulated(part))
            if not any(d.kind == "cpu" for d in devices):
                devices.append(cpu_device(cpus, memory_mib))
        else:
            raise ValueError(f"--devices {part!r} is invalid: expected auto, cpu or emulated:NxMEM (e.g. emulated:4x80GiB)")
    return tuple(devices)


def cpu_device(cpus: tuple[int, ...], memory_mib: int) -> Device:
    """This machine's CPU as one device whose slices are shares of `cpus` (the cores
    the control plane may use: its affinity mask, not every core of the machine)."""
    return Device("cpu:0", "cpu", memory_mib, cpus=tuple(cpus), name=f"{len(cpus)} CPU cores")


def _emulated(part: str) -> list[Device]:
    spec = part.split(":", 1)[1]
    count_text, _, mem_text = spec.partition("x")
    units = {"gib": 1024, "gb": 1024, "mib": 1, "mb": 1}
    mem_text = mem_text.strip().lower()
    unit = next((u for u in units if mem_text.endswith(u)), None)
    try:
        count = int(count_text)
        memory = int(float(mem_text[: -len(unit)] if unit else mem_text) * (units[unit] if unit else 1))
    except ValueError:
        raise ValueError(f"--devices {part!r} is invalid: expected emulated:NxMEM such as emulated:4x80GiB") from None
    if count < 1 or memory < 1:
        raise ValueError(f"--devices {part!r}: count and memory must be positive")
    return [Device(f"emulated:{i}", "emulated", memory, name=f"emulated {memory // 1024} GiB") for i in range(count)]
