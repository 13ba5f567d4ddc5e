"""Placement (DESIGN.md section 7): filter statuses, scorer arithmetic, SliceCluster,
plan() and lower_bound(). Table-driven, the arithmetic beside each expected number;
plus Hypothesis properties: SliceCluster never over-allocates, and the compiled pass
decides as its own source does when Python runs it."""

from __future__ import annotations

from contextlib import contextmanager
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.placement import (
    BINPACK, SPREAD, UNITS, Allocation, Demand, Device, Inventory, Placement, Profile, SliceCluster, Status,
    Unplaceable, binpack, least_busy, least_fragmentation, lower_bound, memory_for, plan, spread, to_units,
    warm_cache,
)
from autoscaler.placement import plugins

GIB = 1024
DEVICE_MIB = 80 * GIB  # 81920


def gpu(i: int, node: str = "local", memory_mib: int = DEVICE_MIB) -> Device:
    return Device(f"gpu:{i}", "gpu", memory_mib, node=node)


def demand(replica: str, fraction: str, memory_mib: int | None = None, function: str = "f",
           kinds: tuple[str, ...] = ("gpu",)) -> Demand:
    return Demand(replica, function, Fraction(fraction), memory_mib, kinds)


def one_device(used: str = "0", used_mib: int = 0, asked: str = "1/4", asked_mib: int = 0, preference: int = 1,
               same_function: int = 0, busy_pct: int = 0, warm: bool = False,
               profile: Profile = BINPACK) -> tuple[plugins.Fit, plugins.Left, plugins.Args]:
    """The plugins' view of one 80 GiB device and one demand: as the filters see it, as
    the scorers see it, and the profile's arguments."""
    fit = plugins.fit_of(preference, to_units(Fraction(asked)), UNITS - to_units(Fraction(used)), UNITS, asked_mib,
                         DEVICE_MIB - used_mib, DEVICE_MIB, same_function)
    return fit, plugins.left_of(fit, busy_pct, warm), plugins.Args(*(int(n) for n in profile.numbers[:3]))


def score(plugin, **case) -> int:
    fit, left, args = one_device(**case)
    return plugin(left, args)


def cluster_of(*allocations: tuple[str, str, str, int], devices: int = 3, profile: Profile = BINPACK) -> SliceCluster:
    """A cluster with replicas where the test says: (replica, device, fraction, MiB);
    a replica "g-a" is of function "g", "a" of function "f"."""
    devs = tuple(gpu(i) for i in range(devices))
    allocs = tuple(Allocation(r, d, Fraction(f), m, (), r.split("-")[0] if "-" in r else "f")
                   for r, d, f, m in allocations)
    return SliceCluster.from_inventory(Inventory(devs, allocs), profile)


# ---- filters: a status per device, never an exception --------------------------------------

FILTER_CASES = [
    pytest.param(plugins.fits_kind, dict(preference=0), Status.UNRESOLVABLE, id="kind-mismatch-never-fits"),
    pytest.param(plugins.fits_kind, dict(preference=1), Status.SUCCESS, id="kind-allowed"),
    pytest.param(plugins.fits_compute, dict(used="3/4", asked="1/2"), Status.UNSCHEDULABLE,
                 id="compute-full: 1/2 asked > 1 - 3/4 = 1/4 free"),
    pytest.param(plugins.fits_compute, dict(used="3/4", asked="1/4"), Status.SUCCESS,
                 id="compute-exact-fit: 1/4 asked = 1/4 free, 0 left"),
    pytest.param(plugins.fits_compute, dict(asked="3/2"), Status.UNRESOLVABLE,
                 id="compute-slice-larger-than-device: 3/2 > 1"),
    pytest.param(plugins.fits_memory, dict(used_mib=60000, asked_mib=30000), Status.UNSCHEDULABLE,
                 id="memory-full: 30000 > 81920 - 60000 = 21920 free"),
    pytest.param(plugins.fits_memory, dict(asked_mib=92160), Status.UNRESOLVABLE,
                 id="memory-larger-than-device: 92160 > 81920"),
    pytest.param(plugins.fits_memory, dict(used_mib=40960, asked_mib=40960), Status.SUCCESS,
                 id="memory-exact-fit: 40960 = 81920 - 40960"),
]


@pytest.mark.parametrize("plugin,case,expected", FILTER_CASES)
def test_filter_status(plugin, case, expected):
    fit, _, args = one_device(**case)
    assert plugin(fit, args) == expected


@pytest.mark.parametrize(
    "max_per_device,already,expected",
    [
        pytest.param(2, 2, Status.UNSCHEDULABLE, id="anti-affinity: 2 of f already, at most 2"),
        pytest.param(2, 1, Status.SUCCESS, id="anti-affinity: 1 of f, at most 2"),
        pytest.param(None, 9, Status.SUCCESS, id="anti-affinity off"),
    ],
)
def test_anti_affinity_status(max_per_device, already, expected):
    fit, _, args = one_device(same_function=already, profile=Profile(max_per_device=max_per_device))
    assert plugins.fits_anti_affinity(fit, args) == expected


# ---- scorers: tiny arithmetic, 0..100 ------------------------------------------------------

SCORE_CASES = [
    pytest.param(lambda: plugins.free_pct(180180, 720720), 25, id="free_pct: (180180 * 100) // 720720 = 25"),
    pytest.param(lambda: plugins.free_pct(20480, 81920), 25, id="free_pct: (20480 * 100) // 81920 = 25"),
    pytest.param(lambda: plugins.free_pct(1, 3), 33, id="free_pct floors: (1 * 100) // 3 = 33"),
    pytest.param(lambda: score(spread, used="1/2", used_mib=40960, asked="1/4", asked_mib=20480), 25,
                 id="spread: 1/4 and 20480 MiB left -> (25 + 25) // 2 = 25"),
    pytest.param(lambda: score(binpack, used="1/2", used_mib=40960, asked="1/4", asked_mib=20480), 75,
                 id="binpack: 100 - (25 + 25) // 2 = 75"),
    pytest.param(lambda: score(binpack, asked="1/8"), 7,
                 id="binpack: 7/8 and 81920 MiB left -> 100 - (87 + 100) // 2 = 7"),
    pytest.param(lambda: score(least_fragmentation, used="1/2", used_mib=8192, asked="1/2", asked_mib=40960), 80,
                 id="fragmentation: 0 compute and 32768 MiB left -> memory stranded 40 -> 100 - (0 + 40) // 2 = 80"),
    pytest.param(lambda: score(least_fragmentation, used="1/2", used_mib=8192, asked="3/8", asked_mib=40960), 100,
                 id="fragmentation: 1/8 and 32768 MiB left, a 1/8 slice can use both -> 100"),
    pytest.param(lambda: score(least_fragmentation, used="1/2", asked="1/4", asked_mib=81408), 88,
                 id="fragmentation: 1/4 left with 512 MiB (< 1024) -> compute stranded 25 -> 100 - 25 // 2 = 88"),
    pytest.param(lambda: score(least_fragmentation, used="3/4", used_mib=40960, asked="1/4", asked_mib=40960), 100,
                 id="fragmentation: nothing left -> 100"),
    pytest.param(lambda: score(least_busy, busy_pct=30), 70, id="least busy: 100 - 30 = 70"),
    pytest.param(lambda: plugins.duty_pct(0.304), 30, id="duty 0.304 -> round(30.4) = 30 %"),
    pytest.param(lambda: plugins.duty_pct(1.7), 100, id="duty over 1 is clamped to 100 %"),
    pytest.param(lambda: score(warm_cache, warm=True), 100, id="warm cache: ran here -> 100"),
    pytest.param(lambda: score(warm_cache, warm=False), 0, id="warm cache: never ran here -> 0"),
]


@pytest.mark.parametrize("score,expected", SCORE_CASES)
def test_scorer_arithmetic(score, expected):
    assert score() == expected


def test_weighted_total_is_the_sum_of_weight_times_score():
    _, left, args = one_device("1/2", 40960, "1/4", 20480, busy_pct=30)
    # binpack 75 x 3 + fragmentation 100 x 1 + idle (100 - 30) x 1 + warm 0 x 1 = 395
    assert plugins.weighted_total(tuple(BINPACK.weights), left, args) == 395


def test_the_compiled_steps_call_each_plugin_by_its_place():
    fit, left, args = one_device("3/4", 80000, "1/2", 2000, preference=0, same_function=1,
                                 profile=Profile(max_per_device=1))
    assert [plugins.run_filter(k, fit, args) for k in range(4)] == [f(fit, args) for f in plugins.FILTERS] == [
        Status.UNRESOLVABLE, Status.UNSCHEDULABLE, Status.UNSCHEDULABLE, Status.UNSCHEDULABLE]
    _, left, args = one_device("1/4", 30000, "1/8", 2000, busy_pct=40, warm=True)
    for k, scorer in enumerate(plugins.SCORERS):
        weights = tuple(2 if j == k else 0 for j in range(len(plugins.SCORERS)))
        assert plugins.weighted_total(weights, left, args) == 2 * scorer(left, args)


def test_profile_weights_are_validated():
    assert BINPACK.with_scores(warm_cache=0).weight(plugins.warm_cache) == 0
    with pytest.raises(ValueError, match="no score plugin"):
        BINPACK.with_scores(colour=1)


# ---- choosing a device ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile,expected",
    [
        pytest.param(BINPACK, "gpu:0", id="binpack: the 1/2-used device, so gpu:1 stays idle"),
        pytest.param(SPREAD, "gpu:1", id="spread: the empty device"),
    ],
)
def test_binpack_and_spread_choose_opposite_devices(profile, expected):
    cluster = cluster_of(("a", "gpu:0", "1/2", 40960), devices=2, profile=profile)
    assert cluster.place(demand("r", "1/4", 20480)).device.id == expected


def test_fragmentation_prefers_leaving_usable_pieces_where_binpack_would_not():
    # gpu:0: 1/2 and 40960 MiB free; gpu:1: 1/4 and 1536 MiB free; a 1/8 slice with 1024 MiB.
    # on gpu:1 it would leave 1/8 with 512 MiB: compute stranded (12 + 0) // 2 = 6 -> 94;
    # on gpu:0 it leaves 3/8 with 39936 MiB: nothing stranded -> 100
    allocations = (("a", "gpu:0", "1/2", 40960), ("b", "gpu:1", "3/4", 80384))
    only_fragmentation = Profile(scores=((plugins.least_fragmentation, 1),))
    assert cluster_of(*allocations, devices=2, profile=only_fragmentation).place(
        demand("r", "1/8", 1024)).device.id == "gpu:0"
    assert cluster_of(*allocations, devices=2, profile=BINPACK).place(demand("r", "1/8", 1024)).device.id == "gpu:1"


def test_warm_cache_prefers_a_node_that_ran_the_function():
    cluster = SliceCluster([gpu(0, "node-a"), gpu(1, "node-b")])
    assert cluster.place(demand("cold", "1/4", function="g")).device.id == "gpu:1"  # tie: the highest id
    cluster.release("cold")
    cluster.mark_warm("f", "node-a")
    assert cluster.place(demand("warm", "1/4", function="f")).device.id == "gpu:0"


def test_least_busy_prefers_the_idler_physical_device():
    cluster = SliceCluster([gpu(0), gpu(1)])
    cluster.set_device_busy("gpu:1", 0.9)  # idle score 100 - 90 = 10 against 100
    assert cluster.place(demand("r", "1/4")).device.id == "gpu:0"


def test_anti_affinity_spreads_one_functions_replicas():
    packed = SliceCluster([gpu(0), gpu(1)])
    limited = SliceCluster([gpu(0), gpu(1)], Profile(max_per_device=1))
    assert {packed.place(demand(f"r{i}", "1/4")).device.id for i in range(2)} == {"gpu:1"}
    assert {limited.place(demand(f"r{i}", "1/4")).device.id for i in range(2)} == {"gpu:0", "gpu:1"}
    third = limited.place(demand("r2", "1/4"))
    assert isinstance(third, Unplaceable) and third.counts == (("at the per-device limit of its function", 2),)
    assert third.status == Status.UNSCHEDULABLE


# ---- cannot place: one line for the whole cluster ---------------------------------------------


def filled_1000() -> SliceCluster:
    """998 devices with 7/8 of their compute taken, 2 with all their memory taken."""
    cluster = SliceCluster.uniform(1000)
    for i in range(2):
        cluster.place(demand(f"mem{i}", "1/8", DEVICE_MIB))
    for i in range(998):
        assert isinstance(cluster.place(demand(f"cpu{i}", "7/8", 1024)), Placement)
    return cluster


@pytest.mark.parametrize(
    "asked,expected,status",
    [
        pytest.param(demand("r", "1/2", 1000), "1000 devices: 998 compute full, 2 memory full "
                     "(needs 1/2 of a device's compute and 1000 MiB)", Status.UNSCHEDULABLE,
                     id="full: 1/2 > 1/8 free on 998, 1000 MiB > 0 free on 2"),
        pytest.param(demand("r", "1/2", 92160), "1000 devices: 1000 memory larger than the device "
                     "(needs 1/2 of a device's compute and 92160 MiB)", Status.UNRESOLVABLE,
                     id="never: 92160 MiB > 81920 on every device, whatever else is full"),
        pytest.param(demand("r", "1/2", 1000, kinds=("emulated",)), "1000 devices: 1000 wrong kind "
                     "(needs 1/2 of a device's compute and 1000 MiB)", Status.UNRESOLVABLE, id="wrong kind"),
    ],
)
def test_unplaceable_summarizes_reasons(asked, expected, status):
    result = filled_1000().place(asked)
    assert isinstance(result, Unplaceable)
    assert result.reasons == (expected,) and result.status == status


@pytest.mark.parametrize(
    "bad,reason",
    [
        pytest.param(demand("r", "0"), "slice fraction (0) must be > 0", id="zero slice"),
        pytest.param(demand("r", "1/4", -1), "slice memory_mib (-1) must be >= 0", id="negative memory"),
        pytest.param(demand("r", "1/4", kinds=()), "no device kinds allowed", id="no kinds"),
    ],
)
def test_invalid_demands_are_errors_not_exceptions(bad, reason):
    for result in (SliceCluster.uniform(2).place(bad), SliceCluster(()).place(bad)):
        assert isinstance(result, Unplaceable) and result.status == Status.ERROR and result.reasons == (reason,)


@pytest.mark.parametrize(
    "huge,expected",
    [
        pytest.param(demand("r", "1/4", 10**12), "memory larger than the device", id="10**12 MiB"),
        pytest.param(demand("r", "1000000000"), "slice larger than the device", id="a slice of 10**9 devices"),
    ],
)
def test_absurd_needs_are_unresolvable_not_overflows(huge, expected):
    result = SliceCluster.uniform(3).place(huge)
    assert isinstance(result, Unplaceable) and result.status == Status.UNRESOLVABLE
    assert result.counts == ((expected, 3),)


def test_placing_the_same_replica_twice_is_an_error():
    cluster = SliceCluster.uniform(2)
    cluster.place(demand("r", "1/4"))
    again = cluster.place(demand("r", "1/4"))
    assert isinstance(again, Unplaceable) and again.status == Status.ERROR and "already placed" in again.message


# ---- changes and questions -------------------------------------------------------------------


def test_release_frees_the_space():
    cluster = SliceCluster.uniform(1)
    for i in range(4):  # 4 x 1/4 = the whole device
        cluster.place(demand(f"r{i}", "1/4", 1024))
    assert isinstance(cluster.place(demand("r4", "1/4", 1024)), Unplaceable)
    assert cluster.release("r2") and not cluster.release("r2")
    assert cluster.used("gpu:0") == (Fraction(3, 4), 3 * 1024)
    assert cluster.place(demand("r4", "1/4", 1024)).device.id == "gpu:0"
    assert cluster.allocation_count() == 4 and cluster.devices_in_use() == 1 and cluster.allocated_fraction() == 1.0


def test_scale_down_victims_empty_the_sparsest_device_first():
    # gpu:0 holds only f 1/8 (rest 0: it goes idle); gpu:1 holds f 1/8 + g 3/4 (rest 3/4)
    cluster = cluster_of(("f-a", "gpu:0", "1/8", 1024), ("f-b", "gpu:1", "1/8", 1024), ("g-a", "gpu:1", "3/4", 1024),
                         devices=2)
    assert cluster.scale_down_victims("f", 1) == ["f-a"]
    assert cluster.scale_down_victims("f", 5) == ["f-a", "f-b"]  # all there are


def test_scale_down_victims_prefer_the_device_that_can_go_idle():
    # gpu:0: f 1/4 + g 1/4 (rest after f leaves: 1/4); gpu:1: f 3 x 1/4 (rest 0) -> gpu:1's three go
    cluster = cluster_of(("f-0", "gpu:0", "1/4", 1024), ("g-0", "gpu:0", "1/4", 1024), ("f-1", "gpu:1", "1/4", 1024),
                         ("f-2", "gpu:1", "1/4", 1024), ("f-3", "gpu:1", "1/4", 1024), devices=2)
    assert sorted(cluster.scale_down_victims("f", 3)) == ["f-1", "f-2", "f-3"]
    assert cluster.scale_down_victims("nobody", 2) == []


@pytest.mark.parametrize(
    "allocations,max_moves,expected",
    [
        pytest.param((("a", "gpu:0", "1/2", 1024), ("b", "gpu:1", "1/4", 1024), ("c", "gpu:2", "1/8", 1024)), 10,
                     [("c", "gpu:2", "gpu:0"), ("b", "gpu:1", "gpu:0")],
                     id="1/2 + 1/4 + 1/8 = 7/8: the two sparse devices empty into gpu:0"),
        pytest.param((("a", "gpu:0", "1/2", 1024), ("b", "gpu:1", "1/4", 1024), ("c", "gpu:2", "1/8", 1024)), 1,
                     [("c", "gpu:2", "gpu:0")], id="at most one move: the sparsest device only"),
        pytest.param((("a", "gpu:0", "3/4", 1024), ("b", "gpu:1", "3/4", 1024)), 10, [],
                     id="3/4 + 3/4 > 1: neither can absorb the other"),
        pytest.param((("a", "gpu:0", "1/2", 1024), ("b", "gpu:1", "1/4", 1024), ("c", "gpu:1", "1/2", 1024)), 10,
                     [], id="gpu:0 1/2 cannot go to gpu:1 at 3/4, gpu:1's 1/4 + 1/2 cannot both go to gpu:0"),
    ],
)
def test_consolidation_moves(allocations, max_moves, expected):
    cluster = cluster_of(*allocations)
    before = (cluster.devices_in_use(), sorted(cluster.allocations(), key=lambda a: a.replica))
    assert cluster.consolidation_moves(max_moves) == expected
    assert (cluster.devices_in_use(), sorted(cluster.allocations(), key=lambda a: a.replica)) == before  # a proposal


def test_cluster_and_inventory_convert_both_ways():
    cluster = cluster_of(("a", "gpu:0", "1/2", 1024), ("b", "gpu:1", "1/4", 2048))
    inventory = cluster.to_inventory()
    assert ("f", "local") in inventory.warm
    again = SliceCluster.from_inventory(inventory)
    assert sorted(again.allocations(), key=str) == sorted(cluster.allocations(), key=str)
    assert again.used("gpu:0") == (Fraction(1, 2), 1024) and again.used("gpu:1") == (Fraction(1, 4), 2048)


# ---- plan() and lower_bound() ----------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes,memory,capacity_mib,expected",
    [
        pytest.param(["1/2", "1/2", "1/4"], None, None, 2, id="compute: ceil((1/2 + 1/2 + 1/4) / 1) = ceil(1.25) = 2"),
        pytest.param(["1/8", "1/8", "1/8"], 30 * GIB, DEVICE_MIB, 2, id="memory: ceil(90 GiB / 80 GiB) = 2"),
        pytest.param(["1/2", "1/2", "1/2"], None, DEVICE_MIB, 2, id="memory as share: ceil(3 x 40 / 80) = 2"),
        pytest.param([], None, DEVICE_MIB, 0, id="nothing to place: 0"),
    ],
)
def test_lower_bound(sizes, memory, capacity_mib, expected):
    batch = [demand(f"r{i}", s, memory) for i, s in enumerate(sizes)]
    assert lower_bound(batch, 1, capacity_mib) == expected


def test_lower_bound_with_devices_of_two_compute():
    # ceil((1/2 + 1/2 + 1/4) / 2) = ceil(0.625) = 1
    assert lower_bound([demand("a", "1/2"), demand("b", "1/2"), demand("c", "1/4")], 2) == 1


MIX = ["1/8"] * 8 + ["1/4"] * 4 + ["1/2"] * 4 + ["1"] * 2  # 1 + 1 + 2 + 2 = 6 devices' worth, smallest first


def test_plan_best_fit_decreasing_reaches_the_lower_bound():
    given = SliceCluster.uniform(10)
    batch = [demand(f"r{i}", s, 8 * GIB) for i, s in enumerate(MIX)]
    result = plan(batch, given)
    assert lower_bound(batch, 1, DEVICE_MIB) == 6  # compute 6; memory 18 x 8 GiB = 144 GiB -> ceil(1.8) = 2
    assert result.devices_used == 6 and not result.unplaceable and len(result.placements) == len(MIX)
    assert [p.fraction for p in result.placements][:2] == [Fraction(1), Fraction(1)]  # largest first
    assert given.devices_in_use() == 0  # plan() works on a copy


def test_plan_packs_by_memory_when_memory_binds():
    # 3 x (1/4, 30 GiB) on 80 GiB devices: compute ceil(0.75) = 1, memory ceil(90 / 80) = 2 -> 2
    batch = [demand(f"r{i}", "1/4", 30 * GIB) for i in range(3)]
    result = plan(batch, SliceCluster.uniform(4))
    assert lower_bound(batch, 1, DEVICE_MIB) == 2 and result.devices_used == 2


def test_plan_reports_what_does_not_fit():
    result = plan([demand("big", "1"), demand("small", "1/2"), demand("too", "1")], SliceCluster.uniform(2))
    assert [u.replica for u in result.unplaceable] == ["small"]  # the two whole slices went first


# ---- a machine's few devices (the controller's cluster) -----------------------------------------


def test_warm_follows_placements_and_an_observed_duty_weighs():
    cluster = SliceCluster((gpu(0, "n0"), gpu(1, "n1")))
    cluster.place(demand("a", "1/4", 1024))
    cluster.place(demand("b", "1/4", 1024))
    assert cluster.used("gpu:1") == (Fraction(1, 2), 2048) and cluster.allocated_ratio("gpu:1") == 0.5
    assert cluster.to_inventory().warm == frozenset({("f", "n1")})
    cluster.release("a")
    assert cluster.used("gpu:1") == (Fraction(1, 4), 1024)
    # gpu:1 observed 90 % busy; a 1/4 slice with 1024 MiB still goes there, binpack and warm outweigh it:
    # gpu:1 leaves 1/2 (50) and 79872 MiB (97): binpack 100 - (50 + 97) // 2 = 27;
    #   27 x 3 + fragmentation 100 + idle (100 - 90) + warm 100 = 291
    # gpu:0 leaves 3/4 (75) and 80896 MiB (98): binpack 100 - (75 + 98) // 2 = 14;
    #   14 x 3 + 100 + 100 + warm 0 = 242
    cluster.set_device_busy("gpu:1", 0.9)
    assert cluster.copy().place(demand("c", "1/4", 1024)).device.id == "gpu:1"
    # with warm cache off and least busy weighing 3: gpu:1 27 x 3 + 100 + 10 x 3 = 211 < gpu:0 42 + 100 + 300 = 442
    cluster.profile = BINPACK.with_scores(warm_cache=0, least_busy=3)
    assert cluster.place(demand("c", "1/4", 1024)).device.id == "gpu:0"


def test_reasons_name_each_of_a_few_devices_with_numbers():
    cpu = Device("cpu:0", "cpu", 16384, cpus=(0, 1))
    cluster = SliceCluster.from_inventory(Inventory((gpu(0), cpu), (Allocation("big", "gpu:0", Fraction(3, 4), 1024),)))
    result = cluster.place(demand("r", "1/2", 1024))
    assert result.reasons == ("gpu:0: 25% of compute free, needs 50%", "cpu:0: kind cpu, needs gpu")
    assert result.counts == (("compute full", 1), ("wrong kind", 1)) and result.status == Status.UNSCHEDULABLE


def test_a_cluster_from_an_inventory_adds_up_its_allocations():
    cluster = SliceCluster.from_inventory(Inventory((gpu(0),), (Allocation("a", "gpu:0", Fraction(1, 4), 1024),
                                                                Allocation("b", "gpu:0", Fraction(1, 8), 512))))
    # 1/4 + 1/8 = 3/8 of the compute, 1024 + 512 = 1536 MiB
    assert cluster.used("gpu:0") == (Fraction(3, 8), 1536) and cluster.allocated_ratio("gpu:0") == 0.375


# ---- properties ----------------------------------------------------------------------------

FRACTIONS = [Fraction(1, d) for d in (1, 2, 3, 4, 8, 16, 17)] + [Fraction(3, 4), Fraction(3, 8), Fraction(3, 2)]
op = st.one_of(
    st.tuples(st.just("place"), st.sampled_from(FRACTIONS), st.one_of(st.none(), st.integers(0, 90000)),
              st.sampled_from(["f", "g", "h"]), st.sampled_from([("gpu",), ("emulated",), ("emulated", "gpu")])),
    st.tuples(st.just("release"), st.integers(0, 200)),
)
device_list = st.lists(
    st.tuples(st.sampled_from(["gpu", "emulated"]), st.sampled_from([16384, 40960, 81920]),
              st.sampled_from(["n0", "n1"])), min_size=1, max_size=5,
).map(lambda specs: tuple(Device(f"{k}:{i}", k, m, node=n) for i, (k, m, n) in enumerate(specs)))


@settings(max_examples=150, deadline=None)
@given(devices=device_list, ops=st.lists(op, max_size=40))
def test_slice_cluster_never_over_allocates(devices, ops):
    cluster, placed = SliceCluster(devices), []
    for i, step in enumerate(ops):
        if step[0] == "release":
            if placed:
                assert cluster.release(placed.pop(step[1] % len(placed)))
        else:
            _, fraction, memory, function, kinds = step
            d = Demand(f"r{i}", function, fraction, memory, kinds)
            result = cluster.place(d)
            if isinstance(result, Placement):
                placed.append(d.replica)
                assert result.device.kind in kinds and result.memory_mib == memory_for(d, result.device)
            else:
                assert result.counts and sum(c for _, c in result.counts) <= len(devices)
        for device in devices:
            units = sum(to_units(a.fraction) for a in cluster.allocations() if a.device == device.id)
            mib = sum(a.memory_mib for a in cluster.allocations() if a.device == device.id)
            assert units <= UNITS and mib <= device.memory_mib
            assert cluster.used(device.id) == (Fraction(units, UNITS), mib)


# The compiled passes against their own source run by Python (the plugins are plain functions
# until numba compiles them): the same cluster, the same steps, one of each; every answer and the
# consolidation proposal at the end must be the same. This holds numba's translation (integer
# widths, bools, the numpy error model), not a second copy.


@contextmanager
def interpreted():
    with mock.patch.object(plugins, "best_device", plugins._best_device), \
            mock.patch.object(plugins, "filter_statuses", plugins._filter_statuses):
        yield


def place_both(compiled: SliceCluster, reference: SliceCluster, d: Demand):
    mine = compiled.place(d)
    with interpreted():
        theirs = reference.place(d)
    assert mine == theirs
    return mine


def consolidate_both(compiled: SliceCluster, reference: SliceCluster, moves: int) -> None:
    proposal = compiled.consolidation_moves(moves)
    with interpreted():
        assert proposal == reference.consolidation_moves(moves)
PROFILES = [BINPACK, SPREAD, Profile(max_per_device=1), BINPACK.with_scores(least_fragmentation=0, warm_cache=3),
            SPREAD.with_scores(least_busy=4)]
busy_op = st.tuples(st.just("busy"), st.integers(0, 200), st.floats(-0.5, 1.7))
mixed_devices = st.lists(
    st.tuples(st.sampled_from(["gpu", "emulated", "cpu"]), st.sampled_from([1, 1000, 16384, 40960, 81919, 81920]),
              st.sampled_from(["n0", "n1", "n2"])), min_size=1, max_size=12,
).map(lambda specs: tuple(Device(f"{k}:{i}", k, m, node=n) for i, (k, m, n) in enumerate(specs)))
any_profile = st.builds(
    lambda filters, weights, limit, smallest, smallest_mib: Profile(
        filters, tuple(zip((binpack, spread, least_fragmentation, least_busy, warm_cache), weights, strict=True)),
        limit, smallest, smallest_mib),
    st.permutations(plugins.FILTERS).map(tuple), st.lists(st.integers(0, 7), min_size=5, max_size=5),
    st.one_of(st.none(), st.integers(0, 3)), st.sampled_from([Fraction(1, 8), Fraction(1, 4)]),
    st.sampled_from([1024, 4096]))


@settings(max_examples=200, deadline=None)
@given(devices=mixed_devices, profile=st.one_of(st.sampled_from(PROFILES), any_profile),
       ops=st.lists(st.one_of(op, busy_op), max_size=60))
def test_the_compiled_pass_chooses_as_its_source_does(devices, profile, ops):
    compiled, reference = SliceCluster(devices, profile), SliceCluster(devices, profile)
    placed: list[str] = []
    for i, step in enumerate(ops):
        if step[0] == "release":
            if placed:
                rid = placed.pop(step[1] % len(placed))
                assert compiled.release(rid) and reference.release(rid)
        elif step[0] == "busy":
            device = devices[step[1] % len(devices)].id
            compiled.set_device_busy(device, step[2])
            reference.set_device_busy(device, step[2])
        else:
            _, fraction, memory, function, kinds = step
            d = Demand(f"r{i}", function, fraction, memory, kinds + (("cpu",) if i % 3 == 0 else ()))
            if isinstance(place_both(compiled, reference, d), Placement):
                placed.append(d.replica)
    consolidate_both(compiled, reference, 8)


def test_a_profile_with_a_plugin_not_written_here_is_refused():
    def emptiest(left, args):
        return left.units_pct

    with pytest.raises(ValueError, match="emptiest is not a score plugin of placement.plugins; they are binpack"):
        Profile(scores=((emptiest, 1),))
    with pytest.raises(ValueError, match="filters must be fits_kind, fits_compute, fits_memory, fits_anti_affinity "
                                         "in some order"):
        Profile(filters=(plugins.fits_kind, plugins.fits_compute))


@pytest.mark.parametrize("profile", PROFILES, ids=["binpack", "spread", "anti-affinity", "warm", "busy"])
def test_the_compiled_pass_chooses_as_its_source_does_on_a_busy_cluster(profile):
    """The same, at a larger scale and seeded: 96 devices of two kinds and three sizes on 12
    nodes, 3,000 steps (place, release, a duty observed), a consolidation every 500."""
    import random

    rng = random.Random(7)
    devices = [Device(f"{'gpu' if i % 5 else 'cpu'}:{i}", "gpu" if i % 5 else "cpu", rng.choice([16384, 40960, 81920]),
                      node=f"n{i % 12}") for i in range(96)]
    compiled, reference = SliceCluster(devices, profile), SliceCluster(devices, profile)
    placed: list[str] = []
    outcomes = {True: 0, False: 0}
    for i in range(3000):
        roll = rng.random()
        if roll < 0.3 and placed:
            rid = placed.pop(rng.randrange(len(placed)))
            assert compiled.release(rid) and reference.release(rid)
        elif roll < 0.4:
            device = rng.choice(devices).id
            duty = rng.random()
            compiled.set_device_busy(device, duty)
            reference.set_device_busy(device, duty)
        else:
            memory = rng.choice([None, rng.randrange(0, 90000)])
            d = Demand(f"r{i}", f"f{rng.randrange(20)}", rng.choice(FRACTIONS), memory,
                       rng.choice([("gpu",), ("gpu", "cpu"), ("cpu",)]))
            mine = place_both(compiled, reference, d)
            outcomes[isinstance(mine, Placement)] += 1
            if isinstance(mine, Placement):
                placed.append(d.replica)
        if i % 500 == 499:
            consolidate_both(compiled, reference, 20)
    assert outcomes[True] > 500 and outcomes[False] > 50  # both paths were taken, many times


def test_the_compiled_pass_at_the_stranded_memory_boundary():
    """Fragmentation alone, a 1/2 slice with 80896 MiB: on the 81920 MiB device 1024 MiB are
    left, exactly the smallest usable (not starved: stranded 0, score 100); on the 81919 MiB
    one 1023 are left (starved: the 1/2 of compute left is stranded, 50 // 2 = 25, score 75).
    The first wins, though the tie-break would favour the second."""
    devices = [gpu(0), gpu(1, memory_mib=81919)]
    profile = Profile(scores=((least_fragmentation, 1),))
    assert SliceCluster(devices, profile).place(demand("r", "1/2", 80896)).device.id == "gpu:0"
    with interpreted():
        assert SliceCluster(devices, profile).place(demand("r", "1/2", 80896)).device.id == "gpu:0"


@pytest.mark.parametrize("memory_mib", [0, 2**31 // 100])
def test_devices_outside_the_arithmetics_range_are_refused(memory_mib):
    with pytest.raises(ValueError, match="device memory must be within 1 and 21474835 MiB"):
        SliceCluster([gpu(0), gpu(1, memory_mib=memory_mib)])


def test_negative_score_weights_are_refused():
    with pytest.raises(ValueError, match="score weights must be whole numbers >= 0, got binpack -1"):
        BINPACK.with_scores(binpack=-1)


# ---- time-sharing (place_shared): beyond a device's compute, where little of it is busy


def _full_emulated(n: int) -> SliceCluster:
    devices = [Device(f"emulated:{i}", "emulated", 81920) for i in range(n)]
    allocs = tuple(Allocation(f"f{i}{k}-1", d.id, Fraction(1, 8), 1024, (), f"f{i}{k}")
                   for i, d in enumerate(devices) for k in range(8))
    return SliceCluster.from_inventory(Inventory(tuple(devices), allocs))


def _eighth(replica: str, memory_mib: int | None = 1024) -> Demand:
    return Demand(replica, replica.split("-")[0], Fraction(1, 8), memory_mib, ("emulated",))


def test_place_shared_goes_to_the_least_overcommitted_quiet_device():
    cluster = _full_emulated(3)
    cluster.set_device_busy("emulated:0", 0.06)
    cluster.set_device_busy("emulated:1", 0.02)
    cluster.set_device_busy("emulated:2", 0.7)  # too busy at max_busy 0.5
    assert isinstance(cluster.place(_eighth("w-1")), Unplaceable)  # no compute left anywhere
    first = cluster.place_shared(_eighth("w-1"), 0.5)
    assert first.device.id == "emulated:1"  # none overcommitted yet: the least busy
    second = cluster.place_shared(_eighth("v-1"), 0.5)
    assert second.device.id == "emulated:0"  # emulated:1 is 1/8 over now
    assert cluster.over_units("emulated:0") == cluster.over_units("emulated:1") == to_units(Fraction(1, 8))
    assert cluster.allocated_ratio("emulated:1") == 1.125
    # released, the device is back to full, not over, and place() still finds no room there
    assert cluster.release("w-1") and cluster.over_units("emulated:1") == 0
    assert isinstance(cluster.place(_eighth("u-1")), Unplaceable)


def test_place_shared_needs_memory_and_a_quiet_device():
    cluster = _full_emulated(1)
    cluster.set_device_busy("emulated:0", 0.6)
    busy = cluster.place_shared(_eighth("w-1"), 0.5)
    assert isinstance(busy, Unplaceable) and busy.status == Status.UNSCHEDULABLE
    assert "at most 50% of its compute busy" in busy.message
    cluster.set_device_busy("emulated:0", 0.1)
    # a slice that takes its share of memory (81920 / 8 = 10240 MiB): 8 x 1024 used, 73728 free: fits
    assert isinstance(cluster.place_shared(_eighth("v-1", None), 0.5), Placement)
    assert isinstance(cluster.place_shared(Demand("x-1", "x", Fraction(1, 8), 70000, ("emulated",)), 0.5),
                      Unplaceable)  # 63488 MiB left
    assert isinstance(cluster.place_shared(Demand("g-1", "g", Fraction(1, 8), 10, ("gpu",)), 0.5), Unplaceable)


def test_place_shared_takes_each_devices_busy_when_given():
    """The simulator's busy compute per device (in the order of `devices`) stands in for the
    observed duty: emulated:0 observed quiet but given 0.8, emulated:1 observed busy but given
    0.1: the second, and the observed duty is left as it was."""
    cluster = _full_emulated(2)
    cluster.set_device_busy("emulated:1", 0.9)
    placed = cluster.place_shared(_eighth("w-1"), 0.5, busy=np.array([0.8, 0.1]))
    assert placed.device.id == "emulated:1"
    assert isinstance(cluster.place_shared(_eighth("v-1"), 0.5, busy=np.array([0.8, 0.6])), Unplaceable)
    assert cluster.place_shared(_eighth("v-1"), 0.5).device.id == "emulated:0"  # observed: 0 and 0.9


def test_place_shared_stays_within_max_over_and_prefers_the_demands_kind():
    cluster = _full_emulated(1)
    # at most 1/4 over: two 1/8 time-share, the third finds no room
    assert all(isinstance(cluster.place_shared(_eighth(f"w{i}-1"), 0.5, max_over=0.25), Placement) for i in range(2))
    third = cluster.place_shared(_eighth("w2-1"), 0.5, max_over=0.25)
    assert isinstance(third, Unplaceable) and "within 25% over it" in third.message
    assert "compute time-shared, 25% over" in cluster.place(_eighth("u-1")).message
    # a model that prefers a GPU time-shares the GPU, not the CPU, though "cpu:0" sorts first
    devices = (Device("cpu:0", "cpu", 81920, cpus=(0, 1)), Device("gpu:0", "gpu", 81920))
    allocs = (Allocation("a-1", "cpu:0", Fraction(1), 1024, (0, 1), "a"), Allocation("b-1", "gpu:0", Fraction(1), 1024, (), "b"))
    mixed = SliceCluster.from_inventory(Inventory(devices, allocs))
    assert mixed.place_shared(Demand("m-1", "m", Fraction(1, 4), 1024, ("gpu", "cpu")), 0.5).device.id == "gpu:0"
