"""Lending idle slices (autoscaler.lending): the cost of taking an idle replica's slice, and which
replicas give theirs back so that a waiting function's replica can be placed; `now` is an argument."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from autoscaler.lending import (
    FLOOR, HEADROOM, IDLE, KEPT, NEED, RANKS, Ask, Hold, Idle, Rate, Want, chance_of_request, choose_takebacks,
    cold_start_misses, held_need, idle_holds, idle_rank, need_of, observe_rate, replica_rank, share, takeback_cost,
    to_move,
)
from autoscaler.loop import Target
from autoscaler.metrics import ReplicaStat
from autoscaler.placement import Allocation, Demand, Device, Inventory, SliceCluster
from autoscaler.policy import ScaleDecision
from autoscaler.replicas import ControllerConfig, ReplicaScaler, _SliceSeconds
from functions.spec import FunctionSpec, ScalingSpec, SliceRequest


def emulated(i: int) -> Device:
    return Device(f"emulated:{i}", "emulated", 81920)


def cluster_of(*allocations: tuple[str, str, str], devices: int = 1) -> SliceCluster:
    """(replica, device, fraction) with 1 GiB each; replica "g-1" is of function "g"."""
    allocs = tuple(Allocation(r, d, Fraction(f), 1024, (), r.split("-")[0]) for r, d, f in allocations)
    return SliceCluster.from_inventory(Inventory(tuple(emulated(i) for i in range(devices)), allocs))


def want(replica: str, fraction: str = "1/8", waiting: int = 1) -> Want:
    return Want(Demand(replica, replica.split("-")[0], Fraction(fraction), 1024, ("emulated",)), waiting)


def idle(replica: str, rate: float = 0.0, active_at: float = 0.0, keep_alive_s: float = 60.0,
         cold_start_s: float = 2.0, slo_s: float = 0.5) -> Idle:
    return Idle(replica, replica.split("-")[0], rate, active_at, keep_alive_s, cold_start_s, slo_s)


@pytest.mark.parametrize("rate, left, expected", [
    pytest.param(0.1, 10.0, 1 - math.exp(-1.0), id="0.1 rps x 10 s: 1 - e^-1 = 0.632"),
    pytest.param(2.0, 10.0, 1 - math.exp(-20.0), id="2 rps x 10 s: almost sure"),
    pytest.param(0.1, 0.0, 0.0, id="keep-alive over: 0"),
    pytest.param(0.1, -5.0, 0.0, id="keep-alive over long ago: 0"),
    pytest.param(0.0, 60.0, 0.0, id="never called: 0"),
])
def test_chance_of_a_request_before_keep_alive_ends(rate, left, expected):
    assert chance_of_request(rate, left) == pytest.approx(expected)


@pytest.mark.parametrize("rate, cold, slo, expected", [
    pytest.param(2.0, 2.0, 0.5, 4.0, id="first + 2 rps x (2.0 - 0.5) s = 4"),
    pytest.param(0.0, 2.0, 0.5, 1.0, id="only the first request"),
    pytest.param(5.0, 0.3, 0.5, 0.0, id="cold start within the SLO: none"),
])
def test_cold_start_misses(rate, cold, slo, expected):
    assert cold_start_misses(rate, cold, slo) == pytest.approx(expected)


def test_cost_is_chance_times_misses_at_now():
    # 0.1 rps, active at 50, keep-alive 60 s: at 100, 10 s left: chance 1 - e^-1 = 0.632;
    # misses 1 + 0.1 x (2.0 - 0.5) = 1.15; cost 0.632 x 1.15 = 0.727
    cost, chance, misses = takeback_cost(idle("g-1", rate=0.1, active_at=50.0), now=100.0)
    assert chance == pytest.approx(1 - math.exp(-1.0)) and misses == pytest.approx(1.15)
    assert cost == pytest.approx((1 - math.exp(-1.0)) * 1.15)
    # the same replica 10 s later: its keep-alive is over, it costs nothing
    assert takeback_cost(idle("g-1", rate=0.1, active_at=50.0), now=110.0)[0] == 0.0


FULL = [(f"f{i}-1", "emulated:0", "1/8") for i in range(8)]  # 8 x 1/8: the device is full


def test_nothing_is_taken_while_a_slice_is_free():
    cluster = cluster_of(*FULL[:7])
    assert choose_takebacks(cluster, [want("w-1")], [idle("f0-1")], now=100.0) == []


def test_the_cheapest_idle_replica_gives_its_slice():
    # f0 busy (2 rps, active just now): cost ~1 x (1 + 2 x 1.5) = 4; f1 quiet (0.01 rps, active
    # 55 s ago, 5 s left): 1 - e^-0.05 = 0.049 x 1.015 = 0.05; f2 idle past its keep-alive: 0
    cluster = cluster_of(*FULL)
    candidates = [idle("f0-1", rate=2.0, active_at=99.0), idle("f1-1", rate=0.01, active_at=45.0),
                  idle("f2-1", rate=0.01, active_at=0.0)]
    (taken,) = choose_takebacks(cluster, [want("w-1", waiting=3)], candidates, now=100.0)
    assert taken.victim.replica == "f2-1" and taken.cost == 0.0 and taken.waiting == 3
    assert taken.demand.replica == "w-1"
    (taken,) = choose_takebacks(cluster, [want("w-1")], candidates[:2], now=100.0)
    assert taken.victim.replica == "f1-1" and taken.cost == pytest.approx((1 - math.exp(-0.05)) * 1.015)
    assert len(cluster) == 8 and "f1-1" in cluster  # the cluster given is unchanged


def test_a_replica_is_taken_whatever_it_costs_rather_than_refuse_a_waiting_request():
    (taken,) = choose_takebacks(cluster_of(*FULL), [want("w-1")], [idle("f0-1", rate=50.0, active_at=100.0)], 100.0)
    assert taken.victim.replica == "f0-1" and taken.cost > 1


def test_no_take_back_without_an_idle_replica_of_another_function():
    cluster = cluster_of(*FULL)
    assert choose_takebacks(cluster, [want("w-1")], [], now=100.0) == []
    # the waiting function's own idle replica is not lent to itself
    assert choose_takebacks(cluster_of(*FULL[:7], ("w-1", "emulated:0", "1/8")), [want("w-2")],
                            [idle("w-1")], now=100.0) == []


def test_a_larger_slice_takes_the_cheapest_set_on_one_device():
    # a 1/4 needs two 1/8s on one device. emulated:0: a0 (past keep-alive: 0) and a1 (2 rps, active
    # now: ~1 x (1 + 2 x 1.5) = 4); emulated:1: b0 and b1, each (1 - e^-0.05) x 1.015 = 0.05.
    # Device 0's pair costs 0 + 4, device 1's 0.1: b0 and b1 go.
    allocations = ([(f"a{i}-1", "emulated:0", "1/8") for i in range(8)]
                   + [(f"b{i}-1", "emulated:1", "1/8") for i in range(8)])
    cluster = cluster_of(*allocations, devices=2)
    candidates = [idle("a0-1"), idle("a1-1", rate=2.0, active_at=99.0),
                  idle("b0-1", rate=0.01, active_at=45.0), idle("b1-1", rate=0.01, active_at=45.0)]
    taken = choose_takebacks(cluster, [want("w-1", "1/4")], candidates, now=100.0)
    assert sorted(t.victim.replica for t in taken) == ["b0-1", "b1-1"]
    assert all(t.demand.replica == "w-1" for t in taken)


def test_equal_costs_take_from_the_device_that_can_go_idle_first():
    # emulated:0: a0 (idle) + 7 busy 1/8s; emulated:1: b0, b1 (idle) + c 3/4. All idle ones cost 0.
    # release_order: what stays once the candidates leave: emulated:0 7/8, emulated:1 1 - 2/8 = 3/4,
    # so emulated:1's go first and b0 or b1 gives its slice, not a0.
    allocations = ([("a0-1", "emulated:0", "1/8")] + [(f"x{i}-1", "emulated:0", "1/8") for i in range(7)]
                   + [("b0-1", "emulated:1", "1/8"), ("b1-1", "emulated:1", "1/8"), ("c-1", "emulated:1", "3/4")])
    cluster = cluster_of(*allocations, devices=2)
    assert cluster.release_order(["a0-1", "b0-1", "b1-1"])[-1] == "a0-1"
    (taken,) = choose_takebacks(cluster, [want("w-1")], [idle("a0-1"), idle("b0-1"), idle("b1-1")], now=100.0)
    assert taken.victim.replica in ("b0-1", "b1-1")


def test_several_wants_share_the_idle_replicas_in_order():
    # two waiting replicas, two idle ones: each takes one; a third want finds none and is left out
    cluster = cluster_of(*FULL)
    wants = [want("w-1", waiting=5), want("v-1", waiting=1), want("u-1")]
    taken = choose_takebacks(cluster, wants, [idle("f0-1"), idle("f1-1", rate=0.1, active_at=99.0)], now=100.0)
    assert [(t.demand.replica, t.victim.replica) for t in taken] == [("w-1", "f0-1"), ("v-1", "f1-1")]


def test_a_want_that_no_device_could_ever_take_takes_nothing():
    # a slice larger than the device is UNRESOLVABLE: no take-back can help
    assert choose_takebacks(cluster_of(*FULL), [want("w-1", "3/2")], [idle("f0-1")], now=100.0) == []


def test_a_further_replica_takes_only_slices_that_cost_less_than_one_late_request():
    # w runs already (first=False): f0 (cost 0) is lent, f1 (2 rps, active now: cost ~4) is not
    cluster = cluster_of(*FULL)
    scale_up = Want(want("w-2").demand, waiting=0, first=False)
    (taken,) = choose_takebacks(cluster, [scale_up], [idle("f0-1"), idle("f1-1", rate=2.0, active_at=99.0)], 100.0)
    assert taken.victim.replica == "f0-1"
    assert choose_takebacks(cluster, [scale_up], [idle("f1-1", rate=2.0, active_at=99.0)], now=100.0) == []


def test_the_rate_is_the_plain_mean_at_first_and_forgets_over_its_window():
    rate = observe_rate(None, 0.0, 0.0, 120.0)
    for t in range(1, 11):  # one request a second for 10 s
        rate = observe_rate(rate, 1.0, float(t), 120.0)
    assert rate.per_s == pytest.approx(1.004, abs=1e-3)  # 9.63 / 9.59, see observe_rate
    rate = observe_rate(rate, 0.0, 130.0, 120.0)  # 120 s of silence
    assert rate.per_s == pytest.approx(3.544 / 79.38, rel=1e-3)


# ---- the scaler does the I/O: drain and stop the victims, place the waiting function, in one tick


class _Backend:
    def __init__(self):
        self.created: list[str] = []
        self.stopped: list[str] = []

    async def create(self, replica_id, spec, placement):
        self.created.append(replica_id)
        return SimpleNamespace(host="127.0.0.1", port=1, id=replica_id)

    async def wait_ready(self, handle, timeout_s):
        return 0.5, 2.0  # live after 0.5 s, ready after 2.0 s

    async def stop(self, handle, grace_s):
        self.stopped.append(handle.id)

    def exited(self, handle):
        return None


class _Router:
    def __init__(self, held: dict[str, int]):
        self._held = held
        self.drained: list[str] = []
        self.failed: list[str] = []
        self.added: list[str] = []

    def add_endpoint(self, function, replica, host, port, spawn_s=None, load_s=None, uds=None):
        self.added.append(replica)

    async def drain_endpoint(self, function, replica, timeout_s):
        self.drained.append(replica)
        return True

    def remove_endpoint(self, function, replica):
        pass

    def forget(self, function):
        pass

    def fail_waiters(self, function, message):
        self.failed.append(message)

    def held(self, function):
        return self._held.get(function, 0)

    def outstanding(self, function):
        return 0

    def inflight_seconds(self, function):
        return 0.0, 0.0  # no integral: the reading takes the count now (outstanding)


def _spec(name: str, memory_mib: int | None = None) -> FunctionSpec:
    return FunctionSpec(name, "sha256:" + "0" * 64 + "/p.yaml", slice=SliceRequest(Fraction(1, 8), memory_mib),
                        scaling=ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0))


def _full_scaler(take_back: bool, memory_mib: int | None = None, time_share_busy: float = 0.5):
    """One emulated device, full with 8 ready replicas at 1/8: f0 has a request in flight, f1 answered
    100 requests over its 100 s of life (1 rps, active at 99), f2..f7 answered 1 each (0.01 rps,
    active at 40 or before). Requests wait for w, which has no replica. Each takes 1/8 of the
    device's memory, or `memory_mib`."""
    events: list[tuple] = []
    backend, router = _Backend(), _Router({"w": 2})
    clock = SimpleNamespace(now=0.0)
    config = ControllerConfig(take_back=take_back, time_share_busy=time_share_busy)
    scaler = ReplicaScaler(backend, router, Inventory((emulated(0),)), lambda *a, **k: events.append((a, k)),
                           CollectorRegistry(), config, clock=lambda: clock.now)

    async def fill():
        for i in range(8):
            await scaler.start_replica(f"f{i}", _spec(f"f{i}", memory_mib), 1)

    asyncio.run(fill())
    for r in scaler.replicas.values():
        i = int(r.function[1:])
        done = 100.0 if i == 1 else 1.0
        r.stats = [ReplicaStat(r.id, 99.0, completed=done), ReplicaStat(r.id, 100.0, completed=done,
                                                                         inflight=float(i == 0))]
        r.counted, r.active_at = done, 99.0 if i == 1 else 40.0 - i
        scaler.rates[r.function] = Rate(100.0, done, 100.0)  # answered over the last 100 s
    clock.now = 100.0
    return scaler, backend, router, events


def _apply(scaler, desired: dict[str, tuple[int, str]], memory_mib: int | None = None) -> None:
    """One tick's targets (function -> (replicas, reason)) applied, and the starts and stops it
    made finished."""
    async def run():
        await scaler.apply({name: Target(_spec(name, memory_mib), 1, 1, ScaleDecision(n, reason))
                            for name, (n, reason) in desired.items()})
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())


def _tick(scaler, deployed: dict, desired: dict[str, tuple[int, str]]) -> None:
    """One tick of the loop: observe() of the `deployed` functions (name -> (spec, revision)),
    then `desired` applied as _apply does."""
    async def run():
        scaler.observe(deployed)
        await scaler.apply({name: Target(deployed[name][0], 1, 1, ScaleDecision(n, reason))
                            for name, (n, reason) in desired.items()})
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())


def _apply_w(scaler, memory_mib: int | None = None) -> None:
    _apply(scaler, {"w": (1, "COLD_START")}, memory_mib)


def test_the_scaler_takes_back_the_cheapest_idle_slice_and_places_the_waiting_function_in_the_tick():
    scaler, backend, router, events = _full_scaler(take_back=True)
    _apply_w(scaler)
    # f2..f7: 0.01 rps, active at 38..33, keep-alive 60 s: over by 100, cost 0 and chance 0 each;
    # f1: 1 rps, active at 99: chance 1 - e^-59 x (1 + 1 x 1.5) misses = 2.5; f0 has a request in
    # flight. Among the equal f2..f7 the consolidating order decides: one device, the newest first: f7
    (takeback,) = [(a, k) for a, k in events if a[0] == "takeback"]
    (kind, message), data = takeback[0], takeback[1]
    assert "w took emulated:0 slice 1/8 from f7" in message and "2 request(s) of w waiting" in message
    assert data["data"]["from"] == "f7" and data["function"] == "w"
    assert router.drained == ["f7-8"] and backend.stopped == ["f7-8"]
    (w,) = scaler.live("w")
    assert w.state == "ready" and w.placement.device.id == "emulated:0" and router.added[-1] == w.id
    assert backend.created.index(w.id) == len(backend.created) - 1 and router.failed == []
    assert scaler.takebacks.labels("w", "took")._value.get() == 1
    assert scaler.takebacks.labels("f7", "gave")._value.get() == 1
    # the busy f0 and the 1 rps f1 kept their slices
    assert {r.function for r in scaler.replicas.values()} == {f"f{i}" for i in range(7)} | {"w"}


def test_slice_seconds_count_each_replica_from_placement_to_the_release_of_its_slice():
    # 8 replicas of 1/8 placed at 0 s; at 100 s each has held 100 x 1/8 = 12.5 slice-s. w takes
    # f7's slice back at 100 s: f7's count stops there (it drains on, but its slice is w's), and
    # w's runs from then: at 102 s, 2 x 1/8 = 0.25. Exported as shoal_replica_slice_seconds_total
    scaler, _, _, _ = _full_scaler(take_back=True)
    assert scaler.slice_use()["f3"] == (pytest.approx(12.5), 0.125)
    _apply_w(scaler)
    scaler.clock = lambda: 102.0
    use = scaler.slice_use()
    assert use["f7"] == (pytest.approx(12.5), 0.0) and use["w"] == (pytest.approx(0.25), 0.125)
    assert use["f3"] == (pytest.approx(102 / 8), 0.125)
    (family,) = _SliceSeconds(scaler.slice_use).collect()
    assert family.name == "shoal_replica_slice_seconds" and family.type == "counter"
    exported = {sample.labels["function"]: sample.value for sample in family.samples}
    assert exported["f7"] == pytest.approx(12.5) and exported["w"] == pytest.approx(0.25)


def test_without_take_back_the_waiting_requests_are_refused():
    scaler, backend, router, events = _full_scaler(take_back=False)
    _apply_w(scaler)
    assert not scaler.live("w") and backend.stopped == []
    assert len(router.failed) == 1 and "cannot place a replica of w" in router.failed[0]
    assert [a[0] for a, _ in events if a[0] in ("takeback", "unplaceable")] == ["unplaceable"]


def test_a_function_that_asks_for_hundreds_more_than_fit_costs_one_placement_and_one_event():
    # kpa's panic mode asked for 674 replicas on a device of 4 slices (docs/simlive.md): each
    # tick tried and said every one, 300 events a tick. Now the first that does not fit ends
    # the function's asks for the tick, said once with their count
    scaler, backend, router, events = _full_scaler(take_back=False)
    created = list(backend.created)
    _apply(scaler, {"f1": (501, "BURST")})
    _apply(scaler, {"f1": (501, "BURST")})
    unplaceable = [a for a, _ in events if a[0] == "unplaceable"]
    assert len(unplaceable) == 2, unplaceable  # one a tick
    assert all("cannot place 500 replicas of f1" in a[1] for a in unplaceable), unplaceable
    assert [k["data"]["wanted"] for a, k in events if a[0] == "unplaceable"] == [500, 500]
    assert backend.created == created and router.failed == [] and len(scaler.live("f1")) == 1
    # every ask held short is still counted, as the simulator's held_short counts each
    assert scaler.held_short.labels("f1", "headroom")._value.get() == 1000


def test_a_function_with_no_replica_and_asks_that_fit_nowhere_backs_off_once_a_tick():
    # w has none and asks for 3 on a full device, nothing lent: its held requests are refused
    # once, and the crash-loop back-off counts one failure for the tick, not three
    scaler, backend, router, events = _full_scaler(take_back=False)
    _apply(scaler, {"w": (3, "COLD_START")})
    assert len(router.failed) == 1 and "cannot place 3 replicas of w" in router.failed[0]
    assert scaler.failures["w"][0] == 1 and not scaler.live("w")


def test_with_nothing_idle_the_waiting_requests_stay_held_for_a_later_tick():
    # every replica has a request in flight: nothing can be lent now; the requests are not refused
    scaler, backend, router, events = _full_scaler(take_back=True)
    for r in scaler.replicas.values():
        r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0)
    _apply_w(scaler)
    _apply_w(scaler)  # the next tick tries again, and says so no second time within 30 s
    assert not scaler.live("w") and backend.stopped == [] and router.failed == []
    (unplaceable,) = [a for a, _ in events if a[0] == "unplaceable"]
    assert "waiting for an idle replica to give a slice back" in unplaceable[1]
    assert "w" not in scaler.failures  # no crash-loop back-off: a lent slice is placed at once


# ---- a full cluster shared (share): floors first, then need, then headroom, by value per slice
# (the late requests a replica's loss would cost, per slice: replica_rank)


def ask(replica: str, rank: int, value: float = 1.0, fraction: str = "1/8", waiting: int = 0) -> Ask:
    return Ask(Demand(replica, replica.split("-")[0], Fraction(fraction), 1024, ("emulated",)), rank, value, waiting)


def hold(replica: str, rank: int, value: float = 1.0) -> Hold:
    return Hold(replica, replica.split("-")[0], rank, value)


# one device of 8 x 1/8: f0..f5 serve their floors, f6 and f7 hold headroom (f7's worth less)
HOLDS = [hold(f"f{i}-1", FLOOR) for i in range(6)] + [hold("f6-1", HEADROOM, 40.0), hold("f7-1", HEADROOM, 8.0)]
SEVEN_FLOORS = [hold(f"f{i}-1", FLOOR) for i in range(7)]  # and one slice free


@pytest.mark.parametrize("asks, holds, granted, taken, short", [
    pytest.param([ask("a-1", NEED, 400.0), ask("b-1", FLOOR, 8.0)], SEVEN_FLOORS, ["b-1"], [], [("a-1", "need")],
                 id="one free slice: b's floor (worth 8 per slice) before a's need (worth 400)"),
    pytest.param([ask("a-1", NEED, 80.0), ask("b-1", NEED, 160.0)], SEVEN_FLOORS, ["b-1"], [], [("a-1", "need")],
                 id="one free slice, two needs: b's worth 160 per slice before a's 80"),
    pytest.param([ask("a-1", NEED, 80.0)], HOLDS, ["a-1"], ["f7-1"], [],
                 id="full: a need takes the headroom worth least (f7: 8 < f6: 40)"),
    pytest.param([ask("a-1", NEED, 80.0), ask("b-1", NEED, 160.0), ask("c-1", NEED, 1.0)], HOLDS,
                 ["b-1", "a-1"], ["f7-1", "f6-1"], [("c-1", "need")],
                 id="full: two headroom replicas give way to the two best needs; the third is held short"),
    pytest.param([ask("a-1", HEADROOM, 500.0)], HOLDS, [], [], [("a-1", "headroom")],
                 id="headroom never takes headroom, however much it is worth"),
    pytest.param([ask("a-1", FLOOR, 1.0)], SEVEN_FLOORS + [hold("f7-1", NEED, 99.0)],
                 ["a-1"], ["f7-1"], [], id="a floor takes another's needed replica, never a floor"),
    pytest.param([ask("a-1", FLOOR, 1.0)], [hold(f"f{i}-1", FLOOR) for i in range(8)], [], [], [("a-1", "floor")],
                 id="every slice a floor: held short"),
    pytest.param([ask("a-1", NEED, 1.0)], HOLDS[:6] + [hold("f6-1", KEPT, 3.0), hold("f7-1", IDLE, 0.5)],
                 ["a-1"], ["f7-1"], [], id="idle and cheap goes before idle and dear"),
    pytest.param([ask("a-1", HEADROOM, 1.0)], HOLDS[:6] + [hold("f6-1", KEPT, 3.0), hold("f7-1", HEADROOM, 0.5)],
                 [], [], [("a-1", "headroom")], id="headroom takes neither a dear idle replica nor headroom"),
    pytest.param([ask("a-1", NEED, 400.0)], SEVEN_FLOORS + [hold("f7-1", KEPT, 3.0)], [], [], [("a-1", "need")],
                 id="a need never takes a kept replica, however much it is worth"),
    pytest.param([ask("a-1", FLOOR, 1.0)], SEVEN_FLOORS + [hold("f7-1", KEPT, 3.0)], ["a-1"], ["f7-1"], [],
                 id="a floor takes a kept replica"),
])
def test_share_grants_by_rank_then_value_and_says_who_is_held_short(asks, holds, granted, taken, short):
    cluster = cluster_of(*FULL[:len(holds)])
    shares = share(cluster, asks, holds)
    assert [g.demand.replica for g in shares.grants] == granted
    assert [v.replica for g in shares.grants for v in g.victims] == taken
    assert [(s.demand.replica, RANKS[s.rank]) for s in shares.short] == short
    assert all(f"held for {rank}" in s.reason for s, (_, rank) in zip(shares.short, short))
    assert len(cluster) == len(holds)  # the cluster given is unchanged


def test_share_takes_on_the_device_where_the_least_is_lost():
    # a 1/4 needs two 1/8s on one device. emulated:0 frees them from an idle and a needed replica,
    # emulated:1 from two headroom ones: the lowest rank taken decides (headroom < need), not the
    # total value (0 + 5 = 5 on 0 against 30 + 30 = 60 on 1)
    allocations = ([(f"a{i}-1", "emulated:0", "1/8") for i in range(8)]
                   + [(f"b{i}-1", "emulated:1", "1/8") for i in range(8)])
    holds = ([hold("a0-1", IDLE, 0.0), hold("a1-1", NEED, 5.0)] + [hold(f"a{i}-1", FLOOR) for i in range(2, 8)]
             + [hold("b0-1", HEADROOM, 30.0), hold("b1-1", HEADROOM, 30.0)]
             + [hold(f"b{i}-1", FLOOR) for i in range(2, 8)])
    shares = share(cluster_of(*allocations, devices=2), [ask("w-1", FLOOR, fraction="1/4")], holds)
    (grant,) = shares.grants
    assert sorted(v.replica for v in grant.victims) == ["b0-1", "b1-1"] and shares.short == []


def test_a_slice_no_device_can_hold_is_held_short_as_such():
    (held,) = share(cluster_of(), [ask("w-1", FLOOR, fraction="3/2")], []).short
    assert held.reason.startswith("no device can hold it")


def test_the_scaler_says_who_was_held_short_and_why():
    # every replica has a request in flight: w's first replica (its floor) is held short, once said
    # within 30 s, counted each tick
    scaler, backend, router, events = _full_scaler(take_back=True)
    for r in scaler.replicas.values():
        r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0)
    _apply_w(scaler)
    _apply_w(scaler)
    (said,) = [(a, k) for a, k in events if a[0] == "held_short"]
    assert said[0][1].startswith("w held short of a replica (floor, 2 request(s) waiting)")
    assert said[1]["data"]["rank"] == "floor" and said[1]["function"] == "w"
    assert scaler.held_short.labels("w", "floor")._value.get() == 2


@pytest.mark.parametrize("cost, rank", [
    pytest.param(0.727, IDLE, id="0.1 rps, 10 s of keep-alive left (takeback_cost's case): idle"),
    pytest.param(1.0, KEPT, id="one late request: kept"),
    pytest.param(0.5 * 376.0, KEPT, id="188 late requests: kept, a further replica as a first"),
])
def test_an_idle_replica_is_kept_when_taking_it_costs_a_late_request(cost, rank):
    assert idle_rank(cost) == rank


def test_the_scaler_ranks_an_idle_replica_by_idle_rank_at_its_take_back_cost():
    # 50 rps, an 8 s cold start, SLO 0.5 s, 59 s of keep-alive left: 1 + 50 x 7.5 = 376 late
    # requests at a chance near 1
    idle = Idle("f-2", "f", 50.0, 99.0, 60.0, 8.0, 0.5)
    (held,), _ = idle_holds([idle], 100.0)
    assert held.value == pytest.approx(takeback_cost(idle, 100.0)[0]) == pytest.approx(376.0)
    assert held.rank == idle_rank(held.value) == KEPT


def test_the_policys_keep_alive_prices_an_idle_replica():
    # the same full device, but the policy keeps f7's replicas 300 s (Target.keep_alive_s, from
    # policy.keep_alive_s), not the spec's 60: f7, active at 33, is still within its keep-alive at
    # 100 (chance 1 - e^(-0.01 x 233) = 0.90 of a request first), so the next newest of the
    # free-to-take f2..f6 gives its slice instead: f6
    scaler, backend, router, events = _full_scaler(take_back=True)

    async def run():
        await scaler.apply({"f7": Target(_spec("f7"), 1, 1, ScaleDecision(1, "STABLE"), keep_alive_s=300.0)})
        await scaler.apply({"w": Target(_spec("w"), 1, 1, ScaleDecision(1, "COLD_START"))})
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    (takeback,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert takeback[1]["data"]["from"] == "f6" and backend.stopped == ["f6-7"]
    assert scaler.keep_alive == {"f7": 300.0}


def test_a_start_held_short_reports_no_change():
    # nothing idle to lend: w's replica is not placed, so apply() reports no change for w (the loop
    # then counts no cold start and writes no "0 -> 1" event each tick while w waits)
    scaler, backend, router, events = _full_scaler(take_back=True)
    for r in scaler.replicas.values():
        r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0)
    changed = asyncio.run(scaler.apply({"w": Target(_spec("w"), 1, 1, ScaleDecision(1, "COLD_START"))}))
    assert changed == {} and not scaler.live("w")


# ---- time-sharing: a first replica nothing frees a slice for shares a little-busy device


def _all_in_flight(scaler, duty: float) -> None:
    """Every replica with a request in flight (nothing to lend), busy `duty` of the last 1 s."""
    for r in scaler.replicas.values():
        r.stats = [ReplicaStat(r.id, 99.0, completed=r.stats[-1].completed),
                   ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0, busy_s=duty)]


def test_a_first_replica_with_nothing_to_lend_time_shares_a_quiet_device():
    # 8 x 1/8 replicas of 1 GiB each, every one with a request in flight but busy 10 % of the last
    # second: the device's compute is 8 x 0.1 x 1/8 = 10 % busy <= 50 %, and 73,728 MiB are free;
    # w's first replica is placed beyond the compute (9/8 held) and started in the tick
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024)
    _all_in_flight(scaler, duty=0.1)
    _apply_w(scaler, memory_mib=1024)
    (w,) = scaler.live("w")
    assert w.state == "ready" and w.placement.device.id == "emulated:0" and router.added[-1] == w.id
    assert scaler.cluster.allocated_ratio("emulated:0") == 1.125 and scaler.cluster.over_units("emulated:0") == 90090
    (said,) = [(a, k) for a, k in events if a[0] == "time_share"]
    assert said[0][1].startswith("w time-shares emulated:0 (emulated): 2 request(s) waiting and no slice to be had "
                                 "(no free slice, and every slice serves a floor or more)")
    assert "busy 10% of its compute, its slices now hold 112% of it" in said[0][1]
    assert said[1]["data"]["busy"] == pytest.approx(0.1)
    assert scaler.time_shared.labels("w", "emulated:0")._value.get() == 1
    assert not [a for a, _ in events if a[0] in ("held_short", "unplaceable", "takeback")]
    assert backend.stopped == [] and router.failed == []


def test_a_busy_device_is_not_time_shared_and_the_requests_stay_held():
    # the same, each replica busy 60 % of the time: 60 % of the device > 50 %: w waits, said as held short
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024)
    _all_in_flight(scaler, duty=0.6)
    _apply_w(scaler, memory_mib=1024)
    assert not scaler.live("w") and router.failed == []
    assert [a[0] for a, _ in events if a[0] in ("time_share", "held_short")] == ["held_short"]


def test_time_sharing_off_leaves_the_requests_held():
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _all_in_flight(scaler, duty=0.1)
    _apply_w(scaler, memory_mib=1024)
    assert not scaler.live("w") and not [a for a, _ in events if a[0] == "time_share"]


def test_an_idle_replica_is_lent_before_a_device_is_time_shared():
    # f2..f7 are idle and cheap to take: lending comes first, nothing is overcommitted
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024)
    _apply_w(scaler, memory_mib=1024)
    assert [a[0] for a, _ in events if a[0] in ("time_share", "takeback")] == ["takeback"]
    assert scaler.cluster.over_units("emulated:0") == 0


@pytest.mark.parametrize("time_share_busy, took_f1", [(0.5, False), (0.0, True)])
def test_a_quiet_device_is_time_shared_before_a_kept_replica_is_taken(time_share_busy, took_f1):
    # only f1 is idle, and taking it likely costs a late request (1 rps, active at 99: cost 2.5, kept);
    # the device's replicas are busy 10 %: w time-shares it and f1 keeps its slice. Without
    # time-sharing, w's floor takes f1 as before.
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=time_share_busy)
    for r in scaler.replicas.values():
        if r.function != "f1":
            r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0, busy_s=0.1)
    _apply_w(scaler, memory_mib=1024)
    assert [e[0] for e, _ in events if e[0] in ("time_share", "takeback")] == (
        ["takeback"] if took_f1 else ["time_share"])
    assert backend.stopped == (["f1-2"] if took_f1 else []) and len(scaler.live("w")) == 1


def test_a_replica_that_answered_in_its_last_window_or_was_scraped_once_is_not_lent():
    # f1 answered 10 requests between its last two scrapes (99 -> 100 s; _note_activity made it
    # active at 100) and has none in flight at the last: a busy function between two requests.
    # The others have requests in flight. Without time-sharing w's first replica waits (held
    # short) rather than take f1's, which would only move the cold start to f1: lent back and
    # forth, 60 functions on 32 slices took 1,484 slices in 120 s (docs/benchmarks.md).
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    for r in scaler.replicas.values():
        if r.function != "f1":
            r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0, busy_s=0.1)
        else:
            r.stats = [ReplicaStat(r.id, 99.0, completed=90.0), ReplicaStat(r.id, 100.0, completed=100.0)]
            r.active_at = 100.0
    assert scaler._idle(100.0, {"w"}) == []
    # nor is one scraped once since it became ready (it may have just answered the requests held
    # through its cold start): f1 with only its last scrape, nothing in flight, active at ready
    (f1,) = scaler.live("f1")
    f1.stats, f1.active_at = [ReplicaStat(f1.id, 100.0, completed=12.0)], 99.5
    assert scaler._idle(100.0, {"w"}) == []
    _apply_w(scaler, memory_mib=1024)
    assert not scaler.live("w") and backend.stopped == [] and router.failed == []
    assert [e[0] for e, _ in events if e[0] in ("takeback", "held_short")] == ["held_short"]


def test_a_busy_functions_further_replica_between_requests_is_lent_as_its_headroom():
    # f1 runs two replicas (f7's slot made f1's), both answered in the last window, neither has a
    # request in flight: f1 is busy, so neither is idle; ranked by f1's need of one, as the
    # simulator ranks a function with traffic, the second is its headroom, and w's first replica
    # takes it (its loss starts nothing cold). Until 2026-12-01 both were lent as idle, priced by
    # their take-back cost at the scrape's moment
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    for r in scaler.replicas.values():
        if r.function == "f7":
            r.function, r.spec = "f1", _spec("f1", 1024)
        if r.function != "f1":
            r.stats[-1] = ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0, busy_s=0.1)
        else:
            r.stats = [ReplicaStat(r.id, 99.0, completed=90.0), ReplicaStat(r.id, 100.0, completed=100.0)]
            r.active_at = 100.0
    assert scaler._idle(100.0, {"w"}) == []
    traffic, need = scaler._traffic_and_need()
    assert need["f1"] == 1
    assert [(h.function, RANKS[h.rank]) for h in scaler._busy_holds(traffic, need, set())] == [("f1", "headroom")]
    _apply_w(scaler, memory_mib=1024)
    assert len(scaler.live("w")) == 1 and len(scaler.live("f1")) == 1
    assert [e[0] for e, _ in events if e[0] in ("takeback", "held_short")] == ["takeback"]


def test_a_further_replica_is_never_time_shared_and_a_first_one_goes_before_it():
    # f0 (in flight, so not first) wants a second replica and w its first; nothing is idle, the
    # device is quiet: w time-shares, f0's further replica is held short (headroom), not placed
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024)
    _all_in_flight(scaler, duty=0.1)
    router._held["f0"] = 3

    _apply(scaler, {"f0": (2, "SCALE_UP"), "w": (1, "COLD_START")}, 1024)
    assert len(scaler.live("w")) == 1 and len(scaler.live("f0")) == 1
    assert [(a[0], k["function"]) for a, k in events if a[0] in ("time_share", "held_short")] == [
        ("time_share", "w"), ("held_short", "f0")]
    assert scaler.cluster.over_units("emulated:0") == 90090  # w's 1/8 alone is over


# ---- what a replica serves: the one ranking of the simulator and the scaler


@pytest.mark.parametrize("busy, active, expected", [
    pytest.param(0.45, True, 1, id="0.45 busy s/s at max duty 0.9: 1"),
    pytest.param(0.9, True, 1, id="exactly 0.9: 1, not 2"),
    pytest.param(2.0, True, 3, id="2.0: ceil(2.22) = 3"),
    pytest.param(0.0, True, 1, id="requests but nothing busy yet: 1"),
    pytest.param(0.0, False, 0, id="no requests: 0"),
])
def test_need_is_busy_seconds_over_max_duty_rounded_up(busy, active, expected):
    assert need_of(busy, 0.9, active) == expected
    # the simulator's every function at once: the same numbers
    assert need_of(np.array([busy]), 0.9, np.array([active]))[0] == expected


@pytest.mark.parametrize("window, expected", [
    pytest.param(30.0, 3, id="window 30 s at 41: 25's 3 is inside"),
    pytest.param(16.0, 3, id="window 16 s: 25 at its edge, inside (the policy's edge: window_start)"),
    pytest.param(15.0, 2, id="window 15 s: 25 is out, now's 2"),
    pytest.param(0.0, 2, id="no window: now's need"),
])
def test_held_need_is_the_most_need_over_the_window(window, expected):
    past = ((10.0, 1.0), (25.0, 3.0))
    assert held_need(2.0, past, 41.0, window) == expected
    # the simulator's every function at once: f0 as above, f1 needs 0 at 10, 4 at 25, 1 now
    arrays = [(10.0, np.array([1.0, 0.0])), (25.0, np.array([3.0, 4.0]))]
    f1 = {30.0: 4.0, 16.0: 4.0, 15.0: 1.0, 0.0: 1.0}[window]
    assert held_need(np.array([2.0, 1.0]), arrays, 41.0, window).tolist() == [expected, f1]


@pytest.mark.parametrize("k, rate, need, cold, rank, value", [
    pytest.param(1, 40.0, 2, 2.0, FLOOR, (1 + 20 * 1.5) / 0.25,
                 id="the first: floor, 40 rps / need 2 = 20 rps through 1.5 s past the SLO: 31 late, / 1/4 = 124"),
    pytest.param(2, 40.0, 2, 2.0, NEED, 124.0, id="within the need: need, the same share"),
    pytest.param(3, 40.0, 2, 2.0, HEADROOM, (1 + 40 / 3 * 1.5) / 0.25, id="above it: headroom, 40 / 3 rps: 84"),
    pytest.param(2, 10.0, 1, 8.0, HEADROOM, (1 + 5 * 7.5) / 0.25,
                 id="an 8 s cold start, 10 rps: headroom worth 154, kept before the 40 rps one's 84"),
    pytest.param(3, 40.0, 2, 0.4, HEADROOM, 0.0, id="a cold start within the SLO: no late request, worth 0"),
    pytest.param(1, 40.0, 2, 0.4, FLOOR, 0.0, id="a first replica restarting within the SLO: worth 0 too"),
    pytest.param(2, 0.0, 0, 2.0, IDLE, 0.0, id="no requests: idle, worth 0 (priced by take-back cost instead)"),
])
def test_a_replica_is_ranked_by_what_it_serves(k, rate, need, cold, rank, value):
    assert replica_rank(k, rate, need, 0.25, cold, 0.5) == (rank, pytest.approx(value))


def test_a_slow_restarting_functions_headroom_is_kept_over_a_busier_ones():
    # one device of 8 x 1/8: f0..f5 hold their floors; f6's 3rd replica is headroom of a 40 rps
    # function restarting in 2 s ((1 + 40 / 3 x 1.5) / 1/8 = 168), f7's 2nd of a 10 rps one
    # restarting in 8 s ((1 + 5 x 7.5) / 1/8 = 308). A waiting function's need takes f6's: the
    # busier function's replica is lost at fewer late requests than the slower one's (by requests
    # per slice it would be f7's: 5 x 8 = 40 against 13.3 x 8 = 107).
    fast = replica_rank(3, 40.0, 2, 0.125, 2.0, 0.5)
    slow = replica_rank(2, 10.0, 1, 0.125, 8.0, 0.5)
    assert fast == (HEADROOM, pytest.approx(168.0)) and slow == (HEADROOM, pytest.approx(308.0))
    holds = [hold(f"f{i}-1", FLOOR) for i in range(6)] + [hold("f6-3", *fast), hold("f7-2", *slow)]
    (grant,) = share(cluster_of(*FULL[:6], ("f6-3", "emulated:0", "1/8"), ("f7-2", "emulated:0", "1/8")),
                     [ask("a-1", NEED, 1.0)], holds).grants
    assert [v.replica for v in grant.victims] == ["f6-3"]


def _busy(scaler, duty: dict[str, float]) -> None:
    """Every ready replica with a request in flight (nothing idle to lend), busy `duty[function]` of
    the last 1 s (0.2 where not given), each request arrived in that second; f7's replica becomes
    f0's second: f0 at 0.2 + 0.2 busy needs one replica (ceil(0.4 / 0.9)), so that second one is its
    headroom."""
    for r in scaler.replicas.values():
        if r.state != "ready":
            continue
        if r.function == "f7":
            r.function, r.spec = "f0", _spec("f0", 1024)
        r.stats = [ReplicaStat(r.id, 99.0, completed=r.stats[-1].completed),
                   ReplicaStat(r.id, 100.0, completed=r.stats[-1].completed, inflight=1.0,
                               busy_s=duty.get(r.function, 0.2))]


def test_a_first_replica_takes_a_busy_functions_headroom_when_nothing_is_idle():
    # nothing idle, time-sharing off: before, w's first replica waited (held short); now it takes
    # f0's second replica, above f0's need of one, newest first, and says which rank it took
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {})
    traffic, need = scaler._traffic_and_need()
    assert traffic["f0"] == pytest.approx(2.0) and need["f0"] == 1 and need["f1"] == 1
    _apply_w(scaler, memory_mib=1024)
    (takeback,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert takeback[1]["data"]["from"] == "f0" and takeback[1]["data"]["rank"] == "headroom"
    # 2 rps / k 2 = 1 rps through the default 2 s cold start over the 500 ms SLO: 1 + 1 x 1.5 =
    # 2.5 late requests, / (1/8) = 20 per slice
    assert "(f7-8, headroom, 20.0 late requests per slice if lost)" in takeback[0][1]
    assert "its first replica goes before another function's headroom" in takeback[0][1]
    assert backend.stopped == ["f7-8"] and router.drained == ["f7-8"]
    assert len(scaler.live("w")) == 1 and len(scaler.live("f0")) == 1
    assert not [a for a, _ in events if a[0] == "held_short"]


def test_a_busy_replica_is_valued_by_its_functions_newest_slo_and_unvalued_without_a_spec():
    # f0's second replica (f7-8, revision 2) comes with an SLO of 1.5 s: f0's newest, so the
    # default 2 s cold start costs 1 + 1 x 0.5 = 1.5 late requests, / (1/8) = 12 per slice (20 at
    # revision 1's 500 ms); with no spec on either replica, f0 has none to be valued by: not lent
    scaler, _, _, _ = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {})
    traffic, need = scaler._traffic_and_need()
    second = scaler.replicas["f7-8"]
    second.revision, second.spec = 2, replace(second.spec, scaling=ScalingSpec(slo_p95_ms=1500.0, idle_to_zero_s=60.0))
    (held,) = scaler._busy_holds(traffic, need, set())
    assert (held.replica, held.rank, held.value) == ("f7-8", HEADROOM, pytest.approx(12.0))
    for r in scaler.replicas.values():
        r.spec = None
    assert scaler._busy_holds(traffic, need, set()) == []


def test_a_quiet_device_is_time_shared_before_a_busy_replica_is_taken():
    # f0's second replica is headroom, but every device is busy 20 % (under time_share_busy 0.5):
    # w's first replica time-shares rather than take it
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.5)
    _busy(scaler, {})
    _apply_w(scaler, memory_mib=1024)
    assert backend.stopped == [] and len(scaler.live("w")) == 1 and len(scaler.live("f0")) == 2
    assert [a[0] for a, _ in events if a[0] in ("time_share", "takeback", "held_short")] == ["time_share"]


def test_a_further_replica_within_its_need_takes_busy_headroom_one_above_it_none():
    # f1 busy the whole second needs two replicas (ceil(1.0 / 0.9)) and f2 (busy 0.2) one; both
    # ask for a second. Nothing is idle. f1's second is within its need, ranked NEED as the
    # simulator ranks it, and takes f0's headroom (f7-8, f0 needing one); f2's is above its need,
    # headroom, and is held short
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {"f1": 1.0})
    traffic, need = scaler._traffic_and_need()
    assert [(h.replica, RANKS[h.rank]) for h in scaler._busy_holds(traffic, need, set())] == [("f7-8", "headroom")]
    _apply(scaler, {"f1": (2, "SCALE_UP"), "f2": (2, "SCALE_UP")}, 1024)
    assert len(scaler.live("f1")) == 2 and len(scaler.live("f2")) == 1 and len(scaler.live("f0")) == 1
    (took,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert took[1]["function"] == "f1" and took[1]["data"]["from"] == "f0" and took[1]["data"]["rank"] == "headroom"
    assert "a replica within its need goes before another function's headroom" in took[0][1]
    assert backend.stopped == ["f7-8"]
    assert [a[1].split(":")[0] for a, _ in events if a[0] == "held_short"] == [
        "f2 held short of a replica (headroom, 0 request(s) waiting)"]


def test_two_busy_functions_near_their_need_trade_no_replicas():
    # f0 took a replica for its need of 2 (held since: lending.held_need); a look later f0 needs
    # 1 and f1 2. f1's second is needed, but f0's second is still within f0's most need over the
    # delay window: as needed as f1's ask, not taken. Before held_need, f0's second was headroom
    # then and f1 took it, and f0 took one back at its next burst: a cold start each way
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {"f0": 0.9})  # f0's two: 1.8 busy s/s, need 2
    scaler.clock = lambda: 100.0
    deployed = {f"f{i}": (_spec(f"f{i}", 1024), 1) for i in range(7)}
    _tick(scaler, deployed, {})
    assert [n for _, n in scaler.needs["f0"]] == [2]
    _busy(scaler, {"f1": 1.0})  # f0 now needs 1, f1 2
    scaler.clock = lambda: 110.0
    _tick(scaler, deployed, {"f1": (2, "SCALE_UP")})
    assert backend.stopped == [] and not [a for a, _ in events if a[0] == "takeback"]
    assert len(scaler.live("f0")) == 2 and len(scaler.live("f1")) == 1
    assert [a[1].split(":")[0] for a, _ in events if a[0] == "held_short"] == [
        "f1 held short of a replica (need, 0 request(s) waiting)"]


def test_a_first_replica_takes_a_needed_replica_when_no_headroom_is_left():
    # f0's two replicas (f7's slot made f0's) are busy the whole second: need ceil(2.0 / 0.9) = 3,
    # so its second is NEED, not headroom; w's first replica takes it (a floor goes before another
    # function's need), never a floor
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {"f0": 1.0})
    traffic, need = scaler._traffic_and_need()
    assert need["f0"] == 3
    assert [(h.replica, RANKS[h.rank]) for h in scaler._busy_holds(traffic, need, set())] == [("f7-8", "need")]
    _apply_w(scaler, memory_mib=1024)
    (took,) = [k["data"] for a, k in events if a[0] == "takeback"]
    assert took["from"] == "f0" and took["rank"] == "need" and backend.stopped == ["f7-8"]
    assert len(scaler.live("w")) == 1 and len(scaler.live("f0")) == 1


@pytest.mark.parametrize("at, rank, kept", [
    pytest.param(110.0, "need", [3, 1], id="10 s after a need of 3: needed"),
    pytest.param(130.0, "need", [3, 1], id="30 s after: at the window's edge, still needed"),
    pytest.param(131.0, "headroom", [1], id="31 s after: out of the window, headroom"),
])
def test_a_busy_replica_its_function_needed_within_the_delay_window_ranks_as_needed(at, rank, kept):
    # at 100 s f0's two replicas (f7's slot made f0's) were busy the whole second: need 3, its
    # second NEED. A look later they are busy 0.2 each: need 1, the second above it. Within the
    # policy's 30 s scale-down delay the second still ranks as needed (lending.held_need), as f0's
    # own policy would not scale it down yet; w's first replica takes it as such (a floor goes
    # before need). Once the window has passed it is headroom
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {"f0": 1.0})
    scaler.clock = lambda: 100.0
    deployed = {f"f{i}": (_spec(f"f{i}", 1024), 1) for i in range(7)}
    _tick(scaler, deployed, {})
    assert [n for _, n in scaler.needs["f0"]] == [3]
    _busy(scaler, {})
    assert scaler._traffic_and_need()[1]["f0"] == 1
    scaler.clock = lambda: at
    _tick(scaler, {**deployed, "w": (_spec("w", 1024), 1)}, {"w": (1, "COLD_START")})
    (took,) = [k["data"] for a, k in events if a[0] == "takeback"]
    assert took["from"] == "f0" and took["rank"] == rank and backend.stopped == ["f7-8"]
    assert [n for _, n in scaler.needs["f0"]] == kept


def test_a_removed_functions_needs_are_forgotten():
    # f0's needs are kept while it is deployed; removed, they go with its other state (its
    # replicas, still serving while they drain, add none), so a function deployed again under
    # its name is not ranked by the old one's need
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {"f0": 1.0})
    deployed = {f"f{i}": (_spec(f"f{i}", 1024), 1) for i in range(7)}
    _tick(scaler, deployed, {})
    assert [n for _, n in scaler.needs["f0"]] == [3]
    _tick(scaler, {name: f for name, f in deployed.items() if name != "f0"}, {})
    assert "f0" not in scaler.needs and not scaler.live("f0")


def test_a_cold_functions_burst_takes_cheap_idle_slices_for_every_replica_it_asks():
    # w has no replica and 2 requests held; its policy asks for 3 at once: its first is its floor,
    # the two more headroom, and all three take cheap idle replicas (f2..f7: cost 0), the newest
    # first (a regression of 17b57a7 gave it one)
    scaler, backend, router, events = _full_scaler(take_back=True)

    _apply(scaler, {"w": (3, "COLD_START")})
    assert len(scaler.live("w")) == 3
    assert sorted(backend.stopped) == ["f5-6", "f6-7", "f7-8"]
    assert not [a for a, _ in events if a[0] == "held_short"]


def test_a_busy_replica_stays_its_functions_floor_beside_one_between_requests():
    # f0 runs two replicas (f7's slot made f0's): the older, f0-1, had nothing in flight at the
    # last scrape, the newer, f7-8, has a request in flight. w and x each ask for a first
    # replica, nothing idle, time-sharing off: f0 is busy, so neither is idle; the busy one counts
    # first, so it is f0's floor and stays, and f0-1 is its headroom (no request to drain): one of
    # w and x takes it, the other is held short
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    _busy(scaler, {})
    (older,) = [r for r in scaler.live("f0") if r.id == "f0-1"]
    older.stats = [ReplicaStat(older.id, 99.0, completed=1.0), ReplicaStat(older.id, 100.0, completed=1.0)]
    router._held["x"] = 1
    assert scaler._idle(100.0, {"w", "x"}) == []
    assert [(h.replica, RANKS[h.rank]) for h in scaler._busy_holds(*scaler._traffic_and_need(), set())] == [
        ("f0-1", "headroom")]
    # one offered as idle is not also offered as busy headroom (share's pool is by replica)
    assert scaler._busy_holds(*scaler._traffic_and_need(), {"f0-1"}) == []

    _apply(scaler, {"w": (1, "COLD_START"), "x": (1, "COLD_START")}, 1024)
    assert [r.id for r in scaler.live("f0")] == ["f7-8"] and backend.stopped == ["f0-1"]
    assert len(scaler.live("w")) + len(scaler.live("x")) == 1
    assert [a[0] for a, _ in events if a[0] in ("takeback", "held_short")] == ["takeback", "held_short"]


class _LoadingBackend(_Backend):
    """A replica named in `loading` loads its model until it is stopped, and then its wait for
    ready fails, as a process stopped while it starts does (deploy.local's wait_ready)."""

    def __init__(self, loading: set[str]):
        super().__init__()
        self.loading = loading
        self.halted: dict[str, asyncio.Event] = {}
        self.graces: list[float] = []

    async def wait_ready(self, handle, timeout_s):
        if handle.id in self.loading:
            await self.halted.setdefault(handle.id, asyncio.Event()).wait()
            raise RuntimeError("exited with status -15")
        return 0.5, 2.0

    async def stop(self, handle, grace_s):
        await super().stop(handle, grace_s)
        self.graces.append(grace_s)
        self.halted.setdefault(handle.id, asyncio.Event()).set()

    def exited(self, handle):
        return -15 if handle.id in self.halted and self.halted[handle.id].is_set() else None


def test_a_replica_still_starting_above_its_functions_need_is_taken_and_its_start_called_off():
    # f0's second replica is still loading when w's first replica finds nothing free or idle
    # (time-sharing off): counted after f0's ready one, as the simulator counts it
    # (Simulation._holds), it is f0's newest and above f0's need of one: headroom. w takes it; its
    # process is stopped at once, which ends its wait for ready, and w is placed on its slice
    scaler, _, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)

    async def run():
        (f7,) = scaler.live("f7")
        await scaler.stop_replica(f7, "make room")
        scaler.backend = backend = _LoadingBackend({"f0-9"})
        starting = asyncio.ensure_future(scaler.start_replica("f0", _spec("f0", 1024), 1))
        await asyncio.sleep(0)
        (second,) = [r for r in scaler.live("f0") if r.id == "f0-9"]
        assert second.state == "starting"
        _busy(scaler, {})
        traffic, need = scaler._traffic_and_need()
        assert need["f0"] == 1
        assert [(h.replica, RANKS[h.rank]) for h in scaler._busy_holds(traffic, need, set())] == [("f0-9", "headroom")]
        second.moving_from = "f0-1"  # one starting to take over from another (_move) is not ranked
        assert scaler._busy_holds(traffic, need, set()) == []
        second.moving_from = None
        await scaler.apply({"w": Target(_spec("w", 1024), 1, 1, ScaleDecision(1, "COLD_START"))})
        await asyncio.gather(starting, *scaler._tasks)
        return backend, second, starting.result()

    backend, second, started = asyncio.run(run())
    (took,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert took[1]["data"]["from"] == "f0" and took[1]["data"]["rank"] == "headroom"
    assert "(f0-9, headroom, still starting," in took[0][1]
    assert backend.stopped == ["f0-9"] and "f0-9" not in router.added and started is None
    assert second.state == "stopped" and second.id not in scaler.replicas
    assert [k["data"]["reason"] for a, k in events if a[0] == "replica_stopped" and k["data"]["replica"] == "f0-9"] == [
        "its start called off: slice taken back by w"]
    assert backend.graces == [1.0]  # it serves nothing: no drain's grace
    assert [r.id for r in scaler.live("f0")] == ["f0-1"] and len(scaler.live("w")) == 1
    assert not [a for a, _ in events if a[0] in ("held_short", "replica_failed")]


async def _prewarm(scaler, name: str = "p"):
    """f7's slot freed, a replica of `name` (no request yet: a pre-warm) started on it and left
    loading; every ready replica then has a request in flight (nothing else idle)."""
    (f7,) = scaler.live("f7")
    await scaler.stop_replica(f7, "make room")
    _all_in_flight(scaler, duty=0.1)
    scaler.backend = _LoadingBackend({f"{name}-9"})
    starting = asyncio.ensure_future(scaler.start_replica(name, _spec(name, 1024), 1))
    await asyncio.sleep(0)
    pre = scaler.replicas[f"{name}-9"]
    assert pre.state == "starting"
    return pre, starting


def test_a_quiet_functions_replica_still_starting_is_lent_and_its_start_called_off():
    # p's replica loads ahead of its first request (a pre-warm); w's first replica finds nothing
    # free or idle but it (time-sharing off). p has no traffic: its starting replica is idle, as
    # the simulator ranks it (Simulation._holds), priced at p's last activity: never, cost 0. w
    # takes it; its process stops at once (1 s grace: it serves nothing) and w is placed there
    scaler, _, router, events = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)

    async def run():
        pre, starting = await _prewarm(scaler)
        (idle,) = scaler._idle(100.0, {"w"})
        assert (idle.replica, idle.active_at, idle.rate_rps) == (pre.id, 0.0, 0.0)
        await scaler.apply({"w": Target(_spec("w", 1024), 1, 1, ScaleDecision(1, "COLD_START"))})
        await asyncio.gather(starting, *scaler._tasks)
        return pre, starting.result()

    pre, started = asyncio.run(run())
    (took,) = [(a, k) for a, k in events if a[0] == "takeback"]
    assert took[1]["data"]["from"] == "p" and took[1]["data"]["cost"] == 0.0
    assert "(p-9, no request yet, still starting)" in took[0][1]
    assert scaler.backend.stopped == ["p-9"] and scaler.backend.graces == [1.0] and started is None
    assert pre.state == "stopped" and not scaler.live("p") and len(scaler.live("w")) == 1
    assert "p-9" not in router.added and not [a for a, _ in events if a[0] in ("held_short", "replica_failed")]


@pytest.mark.parametrize("case", ["held", "busy", "floor", "moving"])
def test_a_starting_replica_is_not_lent_while_its_function_has_traffic_or_at_its_floor(case):
    # held: a request waits for it (the gateway holds it: its function's floor); busy: its
    # function's ready replica has a request in flight (a busy function's starting replica is
    # ranked by need: _busy_holds); floor: its function's min_replicas; moving: it takes over
    # from another replica (_move)
    scaler, _, router, _ = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)

    async def run():
        pre, starting = await _prewarm(scaler, "f1" if case == "busy" else "p")
        if case == "held":
            router._held["p"] = 1
        elif case == "floor":
            pre.spec = FunctionSpec("p", pre.spec.artifact, slice=pre.spec.slice,
                                    scaling=ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0, min_replicas=1))
        elif case == "moving":
            pre.moving_from = "p-0"
        idle = scaler._idle(100.0, {"w"})
        scaler.backend.halted[pre.id].set()
        await asyncio.gather(starting, return_exceptions=True)
        return idle

    assert asyncio.run(run()) == []


def test_a_quiet_function_lends_no_more_than_its_replicas_above_min_replicas():
    # f1 (min_replicas 1) has a quiet ready replica and one starting: only one is lendable, the
    # starting one (it serves nothing yet); two asks in a tick could otherwise take both
    scaler, _, _, _ = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)
    floor = ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0, min_replicas=1)

    async def run():
        pre, starting = await _prewarm(scaler, "f1")
        for r in scaler.live("f1"):
            r.spec = FunctionSpec("f1", r.spec.artifact, slice=r.spec.slice, scaling=floor)
            if r.state == "ready":
                r.stats = [ReplicaStat(r.id, 99.0, completed=100.0), ReplicaStat(r.id, 100.0, completed=100.0)]
        idle = [i.replica for i in scaler._idle(100.0, {"w"})]
        scaler.backend.halted[pre.id].set()
        await asyncio.gather(starting, return_exceptions=True)
        return pre, idle

    pre, idle = asyncio.run(run())
    assert idle == [pre.id]


def test_a_quiet_functions_starting_replica_is_priced_from_its_last_activity():
    # f1 answered 1 request a second until 99 s and its one ready replica is now quiet; a second
    # replica of it starts. Both are idle, priced from f1's last activity (99 s, kept across its
    # replicas: _note_activity), not from the starting one's own (it has none): keep-alive 60 s,
    # 59 s left at 1 rps, chance ~1 x (1 + 1 x 1.5) misses: 2.5, KEPT (idle_rank)
    scaler, _, _, _ = _full_scaler(take_back=True, memory_mib=1024, time_share_busy=0.0)

    async def run():
        pre, starting = await _prewarm(scaler, "f1")
        (ready,) = [r for r in scaler.live("f1") if r.state == "ready"]
        ready.stats = [ReplicaStat(ready.id, 98.0, completed=99.0), ReplicaStat(ready.id, 99.0, completed=100.0)]
        scaler._note_activity(99.0)  # it answered between 98 and 99 s
        ready.stats = [ready.stats[1], ReplicaStat(ready.id, 100.0, completed=100.0)]
        scaler._note_activity(100.0)  # and nothing since
        assert scaler.active_at["f1"] == 99.0
        idle = {i.replica: i for i in scaler._idle(100.0, {"w"})}
        scaler.backend.halted[pre.id].set()
        await asyncio.gather(starting, return_exceptions=True)
        return pre, idle

    pre, idle = asyncio.run(run())
    assert sorted(i.function for i in idle.values()) == ["f1", "f1"] and idle[pre.id].active_at == 99.0
    rate = scaler.rates["f1"].per_s  # about 1 a second (0.99 after the two looks)
    holds, _ = idle_holds(list(idle.values()), 100.0)
    (hold,) = [h for h in holds if h.replica == pre.id]
    assert RANKS[hold.rank] == "kept" and hold.value == pytest.approx((1 - math.exp(-rate * 59)) * (1 + rate * 1.5))


def test_a_replica_whose_stop_fails_is_still_freed_and_forgotten():
    # a process no signal reaps (LocalBackend.stop's wait after SIGKILL times out): the stop
    # raises, yet its slice is freed, it is forgotten and its stopped event set, so a replica
    # waiting for it (_call_off; _grant on a real device) is not held forever
    scaler, backend, _, _ = _full_scaler(take_back=True)
    (f7,) = scaler.live("f7")

    async def unreaped(handle, grace_s):
        raise asyncio.TimeoutError

    backend.stop = unreaped
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(scaler._finish_stop(f7, "function removed"))
    assert f7.stopped.is_set() and f7.state == "stopped"
    assert f7.id not in scaler.replicas and f7.id not in scaler.cluster


def test_need_is_the_work_of_the_windows_arrivals_not_the_duty_of_a_backlog():
    # f1's one replica drained a backlog: 20 answered in the second, 10 in flight before and none
    # after, 50 ms each, busy the whole second. Its duty reads ceil(1.0 / 0.9) = 2 replicas; the
    # 10 that arrived brought 10 x 0.05 = 0.5 busy seconds: one replica
    scaler, backend, router, events = _full_scaler(take_back=True, memory_mib=1024)
    (r,) = scaler.live("f1")
    r.stats = [ReplicaStat(r.id, 99.0, completed=100.0, inflight=10.0),
               ReplicaStat(r.id, 100.0, completed=120.0, busy_s=1.0)]
    traffic, need = scaler._traffic_and_need()
    assert traffic["f1"] == pytest.approx(10.0) and need["f1"] == 1


# ---- a replica held on a larger slice than its policy asks is moved to it


@pytest.mark.parametrize("slices, asked, expected", [
    ((0.5,), 0.125, 0),  # a lone idle replica the hint would never reach
    ((0.5,), 0.5, None),  # on the asked slice
    ((0.125,), 0.5, None),  # smaller than asked: shrinks only
    ((0.25, 0.5, 0.5), 0.125, 1),  # the largest first, the first of equals
])
def test_to_move(slices, asked, expected):
    assert to_move(slices, asked) == expected


class _GatedBackend(_Backend):
    """Replicas named in `gate` are ready only once it is set; those in `fail` fail to start."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()
        self.gated: set[str] = set()
        self.fail: set[str] = set()

    async def wait_ready(self, handle, timeout_s):
        if handle.id in self.fail:
            raise RuntimeError("exited with status 3")
        if handle.id in self.gated:
            await self.gate.wait()
        return 0.5, 2.0


def _half_spec() -> FunctionSpec:
    return FunctionSpec("f", "sha256:" + "0" * 64 + "/p.yaml", slice=SliceRequest(Fraction(1, 2), None),
                        scaling=ScalingSpec(slo_p95_ms=500.0, idle_to_zero_s=60.0))


def _moving_scaler():
    """One emulated device; f deployed on 1/2, its one replica ready."""
    events: list[tuple] = []
    backend, router = _GatedBackend(), _Router({})
    scaler = ReplicaScaler(backend, router, Inventory((emulated(0),)), lambda *a, **k: events.append((a, k)),
                           CollectorRegistry(), ControllerConfig())
    asyncio.run(scaler.start_replica("f", _half_spec(), 1))
    return scaler, backend, router, events


def _gated_move():
    """_moving_scaler with the move's replica (f-2) held starting until backend.gate is set; and
    f's replica on 1/2, the one to move."""
    scaler, backend, router, events = _moving_scaler()
    backend.gated.add("f-2")
    (old,) = scaler.live("f")
    return scaler, backend, router, events, old


async def _hint_to_an_eighth(scaler) -> None:
    """The look that asks 1/8 for f's lone replica, and a turn for the move's replica to start."""
    await _look(scaler, 1, "SLICE", 0.125)
    await asyncio.sleep(0)


def _look(scaler, desired: int, reason: str = "STABLE", slice_fraction: float | None = None):
    return scaler.apply({"f": Target(_half_spec(), 1, desired, ScaleDecision(desired, reason, "",
                                                                             slice_fraction))})


def test_a_lone_replica_moves_to_the_slice_its_policy_asks_and_the_old_one_drains():
    scaler, backend, router, events = _moving_scaler()
    (old,) = scaler.live("f")

    async def run():
        await _look(scaler, 1, "SLICE", 0.125)  # the hint: new replicas get 1/8
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    (new,) = scaler.live("f")
    assert new is not old and new.state == "ready" and new.placement.fraction == Fraction(1, 8)
    assert router.drained == [old.id] and backend.stopped == [old.id] and old.id not in scaler.replicas
    assert scaler.cluster.allocated_ratio("emulated:0") == pytest.approx(0.125)
    (moved,) = [a for a, _ in events if a[0] == "slice" and "take over" in a[1]]
    assert f"{new.id} starts on a 1/8 slice to take over from {old.id} on 1/2" in moved[1]
    stopped = [a[1] for a, _ in events if a[0] == "replica_stopped"]
    assert stopped == [f"{old.id} stopped (moved to {new.id} on a 1/8 slice)"]


def test_a_replica_moving_is_not_in_the_fleet_and_a_scale_up_calls_the_move_off():
    scaler, backend, router, events, old = _gated_move()

    async def run():
        await _hint_to_an_eighth(scaler)
        moving = scaler.replicas["f-2"]
        assert moving.moving_from == old.id and moving.state == "starting"
        assert scaler.live("f") == [old] and scaler.observe({"f": (_half_spec(), 1)})["f"].replicas == 1
        await _look(scaler, 1)  # steady: the move goes on
        assert moving.state == "starting" and len(backend.created) == 2
        backend.gate.set()  # its replica is ready in the very turn the next look scales the function:
        await _look(scaler, 2, "BURST")  # called off before it can take over; a new replica on 1/8
        await asyncio.gather(*scaler._tasks)
        return moving

    moving = asyncio.run(run())
    assert moving.state == "stopped" and "f-2" not in scaler.replicas
    assert sorted(r.id for r in scaler.live("f")) == [old.id, "f-3"] and old.state == "ready"
    assert scaler.replicas["f-3"].placement.fraction == Fraction(1, 8) and router.drained == []
    assert backend.created == [old.id, "f-2", "f-3"]  # no move beside a scale-up


def test_a_move_that_fails_to_start_leaves_the_old_replica_serving_and_waits_to_try_again():
    scaler, backend, router, events = _moving_scaler()
    (old,) = scaler.live("f")
    backend.fail.add("f-2")

    async def run():
        await _look(scaler, 1, "SLICE", 0.125)
        await asyncio.gather(*scaler._tasks)
        await _look(scaler, 1)  # within MOVE_RETRY_S: not tried again
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    assert scaler.live("f") == [old] and old.state == "ready" and backend.created == [old.id, "f-2"]
    assert router.failed == [] and "f" not in scaler.failures  # the function is not backed off
    assert [a[0] for a, _ in events].count("replica_failed") == 1


@pytest.mark.parametrize("when", ["before the next look", "before it is ready"])
def test_a_move_whose_old_replica_goes_is_called_off(when):
    """The old replica taken back or exited mid-move: the simulator calls the move off at once
    (_remove); live, the next look does, or the move's replica when ready does not take over."""
    scaler, backend, router, events, old = _gated_move()

    async def run():
        await _hint_to_an_eighth(scaler)
        old.state = "draining"  # taken back (ReplicaScaler._take), or reaped
        if when == "before the next look":
            await _look(scaler, 0)  # steady at 0: the old one is not ready, so no move goes on
        backend.gate.set()
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    assert "f-2" not in scaler.replicas and "f-2" not in router.added and scaler.live("f") == []
    assert "f-2" in backend.stopped


def test_a_function_removed_mid_move_stops_both_replicas_and_frees_both_slices():
    scaler, backend, router, events, old = _gated_move()

    async def run():
        await _hint_to_an_eighth(scaler)
        assert scaler.cluster.allocated_ratio("emulated:0") == pytest.approx(0.5 + 0.125)
        scaler.observe({})  # shoal rm: the function is gone from the registry
        backend.gate.set()
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    assert scaler.replicas == {} and sorted(backend.stopped) == sorted([old.id, "f-2"])
    assert scaler.cluster.allocated_ratio("emulated:0") == 0.0 and "f-2" not in router.added


def test_no_move_while_a_replica_of_the_function_starts():
    """f scales to two on the hint's look (the new one starts on 1/8, held starting): no move
    beside it, nor at a steady look while it starts; once it is ready, the one on 1/2 moves."""
    scaler, backend, router, events = _moving_scaler()
    (old,) = scaler.live("f")
    backend.gated.add("f-2")

    async def run():
        await _look(scaler, 2, "BURST", 0.125)
        await asyncio.sleep(0)
        await _look(scaler, 2)  # steady, f-2 starting
        assert backend.created == [old.id, "f-2"]
        backend.gate.set()
        await asyncio.gather(*scaler._tasks)
        await _look(scaler, 2)  # steady, both ready: f-1 moves
        await asyncio.gather(*scaler._tasks)

    asyncio.run(run())
    assert backend.created == [old.id, "f-2", "f-3"] and router.drained == [old.id]
    assert sorted(r.placement.fraction for r in scaler.live("f")) == [Fraction(1, 8), Fraction(1, 8)]
