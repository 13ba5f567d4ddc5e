"""The nouns of placement: devices, demands, placements, "cannot place", and compute units.

Device kinds: `gpu` (found by NVML), `cpu` (this machine; a slice is a share of
its cores) and `emulated` (exists only here, for `profile` models; always
labelled emulated).

Pure: stdlib only; no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from fractions import Fraction

# A device's compute, in integer units, so that sums of slices never drift:
# lcm(1..16) = 720720, so 1/2 ... 1/16 (and 1/7 for MIG-like cuts) are exact.
# A fraction that is not a whole number of units is rounded up, never down, so
# the units of the slices on a device add up to at most UNITS only when their
# fractions add up to at most 1.
UNITS = 720720


def to_units(fraction: Fraction) -> int:
    """E.g. 1/4 -> 720720 / 4 = 180180 units; 1/17 -> ceil(42395.29) = 42396."""
    return math.ceil(Fraction(fraction) * UNITS)


class Status(IntEnum):
    """What a filter says about one device, after the Kubernetes scheduler framework's
    `framework.Code`: UNSCHEDULABLE could pass once other replicas leave (their
    `Unschedulable`); UNRESOLVABLE never passes on this device (their
    `UnschedulableAndUnresolvable`: wrong kind, a slice bigger than the device);
    ERROR is a bad request, kept apart from both."""

    SUCCESS = 0
    UNSCHEDULABLE = 1
    UNRESOLVABLE = 2
    ERROR = 3


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
    function: str = ""


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
    function: str = ""


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """"Cannot place" as a result. `reasons` are for people; `status` says whether
    waiting can help (UNSCHEDULABLE: some device could take it once others leave)
    or not (UNRESOLVABLE, ERROR); `counts` are the devices per reason, e.g.
    (("compute full", 998), ("memory full", 2))."""

    replica: str
    reasons: tuple[str, ...]
    status: Status = Status.UNSCHEDULABLE
    counts: tuple[tuple[str, int], ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


def memory_for(demand: Demand, device: Device) -> int:
    """The MiB a demand takes on a device: its own figure, else its slice's share,
    rounded down (e.g. 1/4 of 81920 MiB = 20480 MiB)."""
    if demand.memory_mib is not None:
        return demand.memory_mib
    return device.memory_mib * demand.fraction.numerator // demand.fraction.denominator


def invalid(demand: Demand) -> str | None:
    """The Kubernetes framework's PreFilter step: a demand no device could ever take
    because it is malformed (ERROR), rather than because devices are full."""
    f = demand.fraction  # a Fraction's sign is its numerator's (comparing Fractions costs microseconds)
    if not (f.numerator > 0 if isinstance(f, Fraction) else 0 < f):
        return f"slice fraction ({demand.fraction}) must be > 0"
    if demand.memory_mib is not None and demand.memory_mib < 0:
        return f"slice memory_mib ({demand.memory_mib}) must be >= 0"
    if not demand.kinds:
        return "no device kinds allowed"
    return None


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


def least_used_cores(fraction: Fraction, cores: tuple[int, ...], load: dict[int, int]) -> tuple[int, ...]:
    """For a CPU slice: its share of the cores, the least used cores first.
    E.g. 1/4 of 8 cores = 2 cores; 1/4 of 2 cores rounds up to 1."""
    if not cores:
        return ()
    count = max(1, math.ceil(float(fraction) * len(cores) - 1e-9))
    return tuple(sorted(sorted(cores, key=lambda c: (load.get(c, 0), c))[:count]))
