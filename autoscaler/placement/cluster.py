"""`SliceCluster`: the devices and the replicas placed on them, and the one `place()`.

The state is numpy arrays, one entry per device (compute in `UNITS`, memory in
MiB). `place()` runs the profile's filter and score plugins over those arrays in
one compiled pass (`plugins.best_device`); the controller (a few devices), the
simulator and the planner (thousands) all place through it. Besides placing and
releasing, it answers the questions a packing controller asks: which replicas to
remove so whole devices go idle (`scale_down_victims`, `release_order`), and which to move so
sparse devices empty (`consolidation_moves`, a proposal only, in the spirit of
the Kubernetes descheduler's HighNodeUtilization). `place_shared()` time-shares a
device whose compute is all held but little of it busy (a function's first replica
when nothing else can be had).

Pure: stdlib, numpy and numba (plugins); no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from autoscaler.placement import plugins
from autoscaler.placement.inventory import Inventory
from autoscaler.placement.plugins import BINPACK, NONE_BOOL, NONE_I32, NONE_I64, SUCCESS, Profile
from autoscaler.placement.types import (
    UNITS, Allocation, Demand, Device, Placement, Status, Unplaceable, invalid, least_used_cores, memory_for, to_units,
)


MAX_DEVICE_MIB = 2**31 // 100 - 1  # 20 TiB: MiB x 100 stays within int32
NAMED_DEVICES = 8  # up to this many devices (a machine's), "cannot place" names each with its numbers


class _Held(NamedTuple):  # one per placement: a NamedTuple is built in a fraction of a frozen dataclass's time
    demand: Demand
    device: int
    units: int
    mib: int
    cpus: tuple[int, ...]
    seq: int  # order of placement: the newest goes first on scale-down ties


class SliceCluster:
    """Devices (grouped in nodes by `Device.node`) and the replicas placed on them.

    Mutable: `place()` allocates and `release()` frees, each in O(1) besides the
    compiled pass. Compute is kept in integer `UNITS` and memory in MiB, so no sum
    ever drifts; `profile` picks the plugins and weights."""

    def __init__(self, devices: Sequence[Device], profile: Profile = BINPACK):
        self.devices = tuple(devices)
        self.profile = profile
        self._index = {d.id: i for i, d in enumerate(self.devices)}
        if len(self._index) != len(self.devices):
            raise ValueError("device ids must be unique")
        outside = [d.id for d in self.devices if not 1 <= d.memory_mib <= MAX_DEVICE_MIB]
        if outside:
            raise ValueError(f"device memory must be within 1 and {MAX_DEVICE_MIB} MiB (the int32 arithmetic's "
                             f"range): {', '.join(outside[:3])}")
        n = len(self.devices)
        self._kind_names = sorted({d.kind for d in self.devices})
        self._kind = np.array([self._kind_names.index(d.kind) for d in self.devices], np.int64)
        self._node_names = sorted({d.node for d in self.devices})
        self._node = np.array([self._node_names.index(d.node) for d in self.devices], np.int64)
        self._id_rank = np.empty(n, np.int64)
        self._id_rank[np.argsort([d.id for d in self.devices], kind="stable")] = np.arange(n)
        # int32 state: the arithmetic stays far from 2**31 (720720 units x 100; MiB x 100 up to 20 TiB)
        self._memory = np.array([d.memory_mib for d in self.devices], np.int32)
        self._free_units = np.full(n, UNITS, np.int32)
        self._free_mib = self._memory.copy()
        self._busy_pct = NONE_I64  # observed duty per device; empty until one is observed
        self._beyond_mib = int(self._memory.max()) + 1 if n else 1  # more memory than any device has
        self._count = np.zeros(n, np.int64)  # replicas per device
        self._replicas: dict[str, _Held] = {}
        self._by_function: dict[str, set[str]] = {}
        self._warm: dict[str, set[int]] = {}  # function -> nodes that have run it
        self._warm_devices: dict[str, np.ndarray] = {}  # function -> bool per device, rebuilt when a node joins
        # node -> bool per device, kept; a function's mask may be one of these very arrays, so neither
        # is ever changed in place (shared with copies of the cluster, too)
        self._on_node: dict[int, np.ndarray] = {}
        self._core_load: dict[int, dict[int, int]] = {}  # cpu device -> core -> replicas
        self._preference: dict[tuple[str, ...], np.ndarray] = {}
        self._units: dict[tuple[int, int], int] = {}  # (numerator, denominator): hashing a Fraction is slow
        self._share: dict[Fraction, np.ndarray] = {}
        self._seq = 0

    @classmethod
    def uniform(cls, count: int, memory_mib: int = 81920, kind: str = "gpu", per_node: int = 8,
                profile: Profile = BINPACK) -> "SliceCluster":
        """`count` identical devices, `per_node` to a node: "gpu:0" .. on "node-0" .."""
        width = len(str(max(count - 1, 0)))
        devices = [Device(f"{kind}:{i:0{width}d}", kind, memory_mib, node=f"node-{i // per_node}") for i in range(count)]
        return cls(devices, profile)

    @classmethod
    def from_inventory(cls, inventory: Inventory, profile: Profile = BINPACK) -> "SliceCluster":
        """The same devices, allocations, warm nodes and observed duties."""
        cluster = cls(inventory.devices, profile)
        for a in inventory.allocations:
            i = cluster._index[a.device]
            demand = Demand(a.replica, a.function, a.fraction, a.memory_mib, (cluster.devices[i].kind,))
            cluster._hold(demand, i, to_units(a.fraction), a.memory_mib, a.cpus)
        for function, node in inventory.warm:
            cluster.mark_warm(function, node)
        for device_id, duty in inventory.busy.items():
            cluster.set_device_busy(device_id, duty)
        return cluster

    @property
    def profile(self) -> Profile:
        return self._profile

    @profile.setter
    def profile(self, profile: Profile) -> None:
        self._profile = profile
        self._warm_on = profile.weight(plugins.warm_cache) > 0

    def copy(self) -> "SliceCluster":
        other = object.__new__(SliceCluster)
        other.__dict__.update(self.__dict__)
        other._free_units = self._free_units.copy()
        other._free_mib = self._free_mib.copy()
        other._busy_pct = self._busy_pct.copy()
        other._count = self._count.copy()
        other._replicas = dict(self._replicas)
        other._by_function = {f: set(r) for f, r in self._by_function.items()}
        other._warm = {f: set(n) for f, n in self._warm.items()}
        other._warm_devices = dict(self._warm_devices)  # replaced, never changed in place
        other._core_load = {i: dict(load) for i, load in self._core_load.items()}
        return other

    # ---- the hot path ---------------------------------------------------------------------

    def place(self, demand: Demand) -> Placement | Unplaceable:
        """Filter, score, choose and allocate: one compiled pass over all devices."""
        return self._place(demand, None)

    def place_shared(self, demand: Demand, max_busy: float, max_over: float = 1.0,
                     busy: np.ndarray | None = None) -> Placement | Unplaceable:
        """Time-share: place `demand` beyond a device's compute, on a device whose observed duty
        (`set_device_busy`) is at most `max_busy`, whose memory fits it and whose compute held
        beyond its own stays within `max_over` of it (1.0: time-shared slices at most double a
        device); the preferred kind first, then the least overcommitted, the least busy, by id.
        Its compute is held beyond the device's (free compute goes below 0), so no slice is
        placed there by `place()` until enough leave; its replica then shares the device's
        compute with the others, as time-sliced GPU contexts do (MPS clients whose active-thread
        percentages add up to more than 100). E.g. emulated:0 full with 8 x 1/8 busy 6 % of the
        time, emulated:1 full and 1/8 over, busy 2 %, max_busy 0.5: a 1/8 goes to emulated:0
        (nothing over yet), leaving it 1/8 over. `busy`, when given: each device's duty (0..1, in
        the order of `devices`) instead of the observed one (the simulator's, which places by
        no observed duty otherwise)."""
        if (problem := invalid(demand)) is not None:
            return Unplaceable(demand.replica, (problem,), Status.ERROR)
        if demand.replica in self._replicas:
            return self._place(demand, None)  # says where it is
        units, mib = self._needs(demand)
        need = mib if isinstance(mib, np.ndarray) else np.full(len(self.devices), mib, np.int64)
        if busy is not None:
            busy = np.array([plugins.duty_pct(float(b)) for b in busy], np.int64)
        else:
            busy = self._busy_pct if self._busy_pct.shape[0] else np.zeros(len(self.devices), np.int64)
        over = np.maximum(0, -self._free_units.astype(np.int64))
        preference = self._kinds(demand.kinds)
        ok = ((preference > 0) & (need <= self._free_mib) & (units <= UNITS)
              & (busy <= plugins.duty_pct(max_busy)) & (over + units <= int(max_over * UNITS)))
        if not ok.any():
            why = (f"no device of kind {' or '.join(demand.kinds)} has its memory free, at most "
                   f"{max_busy:.0%} of its compute busy and room to time-share within {max_over:.0%} over it")
            return Unplaceable(demand.replica, (why,), Status.UNSCHEDULABLE)
        best = min(np.flatnonzero(ok).tolist(),
                   key=lambda i: (-int(preference[i]), int(over[i]), int(busy[i]), int(self._id_rank[i])))
        return self._hold(demand, best, units, int(need[best]), None)

    def over_units(self, device_id: str) -> int:
        """Compute held beyond the device's by time-shared replicas, in UNITS (0 if none)."""
        return max(0, -int(self._free_units[self._index[device_id]]))

    def _place(self, demand: Demand, allowed: np.ndarray | None) -> Placement | Unplaceable:
        if (problem := invalid(demand)) is not None:
            return Unplaceable(demand.replica, (problem,), Status.ERROR)
        if demand.replica in self._replicas:
            where = self.devices[self._replicas[demand.replica].device].id
            reason = f"replica {demand.replica} is already placed on {where}"
            return Unplaceable(demand.replica, (reason,), Status.ERROR)
        if not self.devices:
            return Unplaceable(demand.replica, ("no devices to place on",), Status.UNRESOLVABLE)
        units, mib = self._needs(demand)
        arguments = self._pass_arguments(demand, units, mib, allowed)
        best = plugins.best_device(*arguments)
        if best < 0:
            return self._unplaceable(demand, plugins.filter_statuses(*arguments))
        return self._hold(demand, best, units, int(mib[best]) if isinstance(mib, np.ndarray) else mib, None)

    def _pass_arguments(self, demand: Demand, units: int, mib: np.ndarray | int, allowed: np.ndarray | None) -> tuple:
        """What plugins.best_device and filter_statuses take, in their order."""
        profile = self.profile
        per_device = isinstance(mib, np.ndarray)  # a share of each device's memory
        warm = self._warm_devices.get(demand.function, NONE_BOOL) if self._warm_on else NONE_BOOL
        same = NONE_I64 if profile.max_per_device is None else self._replicas_per_device(demand.function)
        return (self._free_units, self._free_mib, self._memory, self._busy_pct, self._id_rank,
                self._kinds(demand.kinds), mib if per_device else NONE_I32, warm, same,
                NONE_BOOL if allowed is None else allowed, units, 0 if per_device else mib,
                profile.filter_places, profile.weights, profile.numbers)

    def _needs(self, demand: Demand) -> tuple[int, np.ndarray | int]:
        """(compute units, MiB or MiB per device) a demand asks for."""
        # a need beyond every device never fits: held at "largest + 1", the int32 arithmetic stays in range
        mib = (min(demand.memory_mib, self._beyond_mib) if demand.memory_mib is not None
               else self._share_of_memory(demand.fraction))
        f = demand.fraction
        units = self._units.get((f.numerator, f.denominator)) or self._units.setdefault(
            (f.numerator, f.denominator), min(to_units(f), UNITS + 1))
        return units, mib

    def _kinds(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Per kinds tuple, kept: the preference per device (0: not allowed)."""
        if kinds not in self._preference:
            self._preference[kinds] = plugins.kind_preference(self._kind, self._kind_names, kinds)
        return self._preference[kinds]

    def _share_of_memory(self, fraction: Fraction) -> np.ndarray:
        """A slice without its own memory figure takes its share of each device's memory."""
        if fraction not in self._share:
            share = self._memory.astype(np.int64) * fraction.numerator // fraction.denominator
            self._share[fraction] = np.minimum(share, self._memory.astype(np.int64) + 1).astype(np.int32)
        return self._share[fraction]

    def _replicas_per_device(self, function: str) -> np.ndarray:
        held = [self._replicas[r].device for r in self._by_function.get(function, ())]
        return np.bincount(np.array(held, np.int64), minlength=len(self.devices))

    def _hold(self, demand: Demand, i: int, units: int, mib: int, cpus: tuple[int, ...] | None) -> Placement:
        device = self.devices[i]
        if cpus is None:
            cpus = self._pick_cores(demand.fraction, i) if device.cpus else ()
        self._free_units[i] -= units
        self._free_mib[i] -= mib
        self._count[i] += 1
        self._seq += 1
        self._replicas[demand.replica] = _Held(demand, i, units, mib, cpus, self._seq)
        self._by_function.setdefault(demand.function, set()).add(demand.replica)
        node = int(self._node[i])
        if node not in self._warm.get(demand.function, ()):
            self._add_warm(demand.function, node)
        if cpus:
            load = self._core_load.setdefault(i, {})
            for c in cpus:
                load[c] = load.get(c, 0) + 1
        return Placement(demand.replica, device, demand.fraction, mib, cpus, demand.function)

    def _pick_cores(self, fraction: Fraction, i: int) -> tuple[int, ...]:
        device = self.devices[i]
        if device.kind != "cpu" or not device.cpus:
            return ()
        return least_used_cores(fraction, device.cpus, self._core_load.get(i, {}))

    # ---- cannot place ---------------------------------------------------------------------

    def _unplaceable(self, demand: Demand, statuses: np.ndarray) -> Unplaceable:
        """On a few devices, one reason per device with its numbers ("gpu:0: 25% of compute
        free, needs 50%"); on more, one line: "1000 devices: 998 compute full, 2 memory full (...)"."""
        counts, status = plugins.first_failures(self.profile, statuses)
        if len(self.devices) <= NAMED_DEVICES:
            failed = np.flatnonzero(statuses.max(axis=1) != SUCCESS)
            reasons = tuple(self._reason(demand, int(i), statuses[i]) for i in failed)
        else:
            memory = f"{demand.memory_mib} MiB" if demand.memory_mib is not None else "its share of memory"
            reasons = (f"{len(self.devices)} devices: {', '.join(f'{c} {label}' for label, c in counts)} "
                       f"(needs {demand.fraction} of a device's compute and {memory})",)
        return Unplaceable(demand.replica, reasons, status, tuple(counts))

    def _reason(self, demand: Demand, i: int, codes: np.ndarray) -> str:
        """Device i's worst failure (one that can never pass before one that could), then the first filter's."""
        device, worst = self.devices[i], int(codes.max())
        name = self.profile.filters[int(np.argmax(codes == worst))].__name__
        used, used_mib = self.used(device.id)
        if name == "fits_kind":
            return f"{device.id}: kind {device.kind}, needs {' or '.join(demand.kinds)}"
        if name == "fits_compute":
            if used > 1:
                return (f"{device.id}: compute time-shared, {float(used - 1):.0%} over, needs "
                        f"{float(demand.fraction):.0%}")
            return f"{device.id}: {float(1 - used):.0%} of compute free, needs {float(demand.fraction):.0%}"
        if name == "fits_memory":
            return f"{device.id}: {device.memory_mib - used_mib} MiB free, needs {memory_for(demand, device)} MiB"
        limit = self.profile.max_per_device
        return f"{device.id}: runs {limit} replicas of {demand.function} already, at most {limit}"

    # ---- changes --------------------------------------------------------------------------

    def release(self, replica_id: str) -> bool:
        """Free a replica's slice; False when it holds none."""
        held = self._replicas.pop(replica_id, None)
        if held is None:
            return False
        i = held.device
        self._free_units[i] += held.units
        self._free_mib[i] += held.mib
        self._count[i] -= 1
        self._by_function[held.demand.function].discard(replica_id)
        for c in held.cpus:
            self._core_load[i][c] -= 1
        return True

    def set_device_busy(self, device_id: str, duty: float) -> None:
        """The observed duty (0..1) of a physical device, for the least-busy scorer."""
        if not self._busy_pct.shape[0]:
            self._busy_pct = np.zeros(len(self.devices), np.int64)
        self._busy_pct[self._index[device_id]] = plugins.duty_pct(duty)

    def mark_warm(self, function: str, node: str) -> None:
        """This node has the function's artifact (placing a replica there marks it too)."""
        self._add_warm(function, self._node_names.index(node))

    def _add_warm(self, function: str, node: int) -> None:
        nodes = self._warm.setdefault(function, set())
        if node not in nodes:
            nodes.add(node)
            on_node = self._on_node.get(node)
            if on_node is None:
                on_node = self._on_node[node] = self._node == node
            # a new array, not |=: copies of the cluster share these masks
            self._warm_devices[function] = self._warm_devices[function] | on_node if len(nodes) > 1 else on_node

    # ---- questions --------------------------------------------------------------------------

    def devices_in_use(self) -> int:
        return int(np.count_nonzero(self._count))

    def allocated_fraction(self) -> float:
        """Compute allocated over compute in the cluster, 0..1 (above 1 where devices are time-shared)."""
        return float(self._used_units().sum()) / max(1, UNITS * len(self.devices))

    def allocation_count(self) -> int:
        return len(self._replicas)

    def __len__(self) -> int:
        return len(self._replicas)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._replicas

    def allocated_ratio(self, device_id: str) -> float:
        """Compute allocated on one device, 0..1, above 1 when time-shared (the controller's
        shoal_slice_allocated_ratio)."""
        return float(self.used(device_id)[0])

    def used(self, device_id: str) -> tuple[Fraction, int]:
        """(compute, MiB) allocated on a device; compute as a fraction of the device."""
        i = self._index[device_id]
        return Fraction(UNITS - int(self._free_units[i]), UNITS), int(self._memory[i] - self._free_mib[i])

    def _used_units(self) -> np.ndarray:
        return UNITS - self._free_units

    def device_of(self, replica_id: str) -> Device:
        return self.devices[self._replicas[replica_id].device]

    def allocations(self) -> Iterator[Allocation]:
        for rid, h in self._replicas.items():
            yield Allocation(rid, self.devices[h.device].id, h.demand.fraction, h.mib, h.cpus, h.demand.function)

    def to_inventory(self) -> Inventory:
        warm = frozenset((f, self._node_names[n]) for f, nodes in self._warm.items() for n in nodes)
        return Inventory(self.devices, tuple(self.allocations()), warm)

    def scale_down_victims(self, function: str, count: int) -> list[str]:
        """Which `count` replicas of `function` to remove so that whole devices go idle
        soonest: the first `count` of its replicas in `release_order`.
        E.g. A holds f 1/4 + g 1/4, B holds f 3 x 1/4, count 3: B's rest is 0, A's
        1/4, so B's three go and B is idle."""
        mine = [r for r in self._by_function.get(function, ()) if r in self._replicas]
        return self.release_order(mine)[:max(0, count)]

    def release_order(self, replicas: Sequence[str]) -> list[str]:
        """`replicas` (any functions'; unknown ids left out) in the order that lets whole
        devices go idle soonest. A replica's device is ranked by what would stay on it once
        every one of `replicas` there left (0 first: that device can go idle), then by how
        few of them it holds (fewer to remove before it is idle), then least allocated, then
        the lowest id (placement fills the highest first); on one device the newest first.
        The one consolidating choice: scale-down (`scale_down_victims`) and the lending of
        idle slices (autoscaler.lending) both take replicas in this order.
        E.g. A holds f 1/8 + g 1/8 + h 1/4, B holds f 1/8; of (f on A, g on A, f on B):
        A's rest is 1/4, B's 0: f on B first."""
        held = [r for r in dict.fromkeys(replicas) if r in self._replicas]
        units_of: dict[int, int] = {}
        count_of: dict[int, int] = {}
        for r in held:
            i = self._replicas[r].device
            units_of[i] = units_of.get(i, 0) + self._replicas[r].units
            count_of[i] = count_of.get(i, 0) + 1

        def rank(r: str) -> tuple:
            h = self._replicas[r]
            i = h.device
            used = UNITS - int(self._free_units[i])
            return used - units_of[i], count_of[i], used, int(self._id_rank[i]), -h.seq

        return sorted(held, key=rank)

    def consolidation_moves(self, max_moves: int) -> list[tuple[str, str, str]]:
        """Replicas to re-place so sparse devices empty: (replica, from device, to device).
        A proposal, applied to a copy: the cluster does not change. A device is proposed
        only when all its replicas fit on other devices already in use (emptying it
        saves a device) and the moves stay within `max_moves`; sparsest devices first.
        Make-before-break holds: each target was chosen while every source still held
        its replicas (sources are never targets), so all new replicas can start before
        any old one stops."""
        scratch = self.copy()
        on_device: dict[int, list[str]] = {}
        for rid, h in self._replicas.items():
            on_device.setdefault(h.device, []).append(rid)
        candidates = self._count > 0  # targets: devices in use, not emptied
        receiving = np.zeros(len(self.devices), bool)
        moves: list[tuple[str, str, str]] = []
        for src in self._sparsest_first():
            held = on_device[src]
            if receiving[src] or len(moves) + len(held) > max_moves:
                continue
            allowed = candidates.copy()
            allowed[src] = False
            found = scratch._evacuate(src, held, allowed)
            if found is not None:
                candidates[src] = False
                receiving[[t for _, t in found]] = True
                moves += [(rid, self.devices[src].id, self.devices[t].id) for rid, t in found]
        return moves

    def _sparsest_first(self) -> list[int]:
        used = np.flatnonzero(self._count > 0)
        order = np.lexsort((self._id_rank[used], self._count[used], self._used_units()[used]))
        return [int(i) for i in used[order]]

    def _evacuate(self, src: int, held: list[str], allowed: np.ndarray) -> list[tuple[str, int]] | None:
        """Place every replica of `src` elsewhere (largest first) or none of them."""
        placed: list[tuple[str, int]] = []
        for rid in sorted(held, key=lambda r: (-self._replicas[r].units, -self._replicas[r].mib, r)):
            h = self._replicas[rid]
            moved = self._place(replace(h.demand, replica=f"{rid}#moved", memory_mib=h.mib), allowed)
            if isinstance(moved, Unplaceable):
                for other, _ in placed:
                    self.release(f"{other}#moved")
                return None
            placed.append((rid, self._index[moved.device.id]))
        for rid in held:
            self.release(rid)
        return placed
