"""The control plane's pure parts: placement, metrics arithmetic.
Table-driven on a fake clock (`now` is a number)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from autoscaler.metrics import (
    ReplicaStat,
    cumulative_histogram,
    duty_cycle,
    parse_replica_metrics,
    quantile,
)
from autoscaler.placement import (
    Allocation, Demand, Device, Inventory, Placement, SliceCluster, Unplaceable, parse_devices,
)

CPU = Device("cpu:0", "cpu", 16384, cpus=(0, 1, 2, 3))
GPU = Device("gpu:0", "gpu", 81920)
EMU = (Device("emulated:0", "emulated", 81920), Device("emulated:1", "emulated", 81920))


def demand(replica, fraction, kinds=("gpu", "cpu"), memory=None) -> Demand:
    return Demand(replica, "f", Fraction(fraction), memory, kinds)


def test_binpack_fills_one_device_before_the_next():
    cluster = SliceCluster(EMU)
    for i in range(4):  # 4 x 1/4 = one whole device
        placed = cluster.place(demand(f"r{i}", "1/4", ("emulated",)))
        assert isinstance(placed, Placement) and placed.device.id == "emulated:1"  # ties go to the highest id
    fifth = cluster.place(demand("r4", "1/4", ("emulated",)))
    assert fifth.device.id == "emulated:0"


def holding(*allocations: Allocation) -> SliceCluster:
    return SliceCluster.from_inventory(Inventory((GPU,), allocations))


def test_unplaceable_says_why_for_each_device():
    result = holding(Allocation("big", "gpu:0", Fraction(3, 4), 60000)).place(demand("r", "1/2"))
    assert isinstance(result, Unplaceable)
    # 1 - 3/4 = 25 % free, a 1/2 slice needs 50 %
    assert result.reasons == ("gpu:0: 25% of compute free, needs 50%",)
    too_big = holding(Allocation("big", "gpu:0", Fraction(1, 2), 60000)).place(demand("r", "1/8", memory=30000))
    # 81920 - 60000 = 21920 MiB free
    assert too_big.reasons == ("gpu:0: 21920 MiB free, needs 30000 MiB",)


def test_real_models_prefer_gpus_and_profiles_need_emulated_devices():
    cluster = SliceCluster((CPU, GPU) + EMU)
    assert cluster.place(demand("r", "1/4")).device.id == "gpu:0"
    assert cluster.place(demand("p", "1/4", ("emulated",))).device.kind == "emulated"
    only_cpu = SliceCluster((CPU,)).place(demand("p", "1/4", ("emulated",)))
    assert isinstance(only_cpu, Unplaceable) and "kind cpu, needs emulated" in only_cpu.message


@pytest.mark.parametrize(
    "fraction,taken,expected",
    [
        ("1/4", (), (0,)),  # 1/4 of 4 cores = 1 core, the least used: 0
        ("1/2", (0,), (1, 2)),  # 2 cores; core 0 already has a replica
        ("1/8", (0, 1, 2, 3), (0,)),  # rounds up to 1 core; all equally used -> lowest
    ],
)
def test_cpu_slices_get_the_least_used_cores(fraction, taken, expected):
    taken = tuple(Allocation(f"x{i}", "cpu:0", Fraction(1, 8), 10, (core,)) for i, core in enumerate(taken))
    cluster = SliceCluster.from_inventory(Inventory((CPU,), taken))
    assert cluster.place(demand("r", fraction, ("cpu",), memory=10)).cpus == expected


def test_parse_devices():
    devices = parse_devices("emulated:2x80GiB", (0, 1), 4096)
    assert [d.id for d in devices] == ["emulated:0", "emulated:1", "cpu:0"]
    assert devices[0].memory_mib == 80 * 1024
    assert [d.id for d in parse_devices("auto", (0, 1), 4096, [GPU])] == ["gpu:0"]
    with pytest.raises(ValueError, match="expected emulated:NxMEM"):
        parse_devices("emulated:lots", (0,), 1)


METRICS = """# TYPE shoal_replica_requests_total counter
shoal_replica_requests_total{code="200",function="f"} 90.0
shoal_replica_requests_total{code="500",function="f"} 10.0
# TYPE shoal_replica_busy_seconds_total counter
shoal_replica_busy_seconds_total{function="f"} 1.5
# TYPE shoal_replica_inflight gauge
shoal_replica_inflight{function="f"} 3.0
# TYPE shoal_replica_request_duration_seconds histogram
shoal_replica_request_duration_seconds_bucket{function="f",le="0.01"} 50.0
shoal_replica_request_duration_seconds_bucket{function="f",le="0.1"} 90.0
shoal_replica_request_duration_seconds_bucket{function="f",le="+Inf"} 100.0
shoal_replica_request_duration_seconds_count{function="f"} 100.0
shoal_replica_request_duration_seconds_sum{function="f"} 3.0
"""


def test_parse_replica_metrics_and_rates():
    stat = parse_replica_metrics(METRICS, "r1", at=10.0)
    assert (stat.completed, stat.errors, stat.busy_s, stat.inflight) == (100.0, 10.0, 1.5, 3.0)
    # 1.5 busy seconds over 10 s since a scrape at 0 s with 0 busy = 15 % duty
    assert duty_cycle(ReplicaStat("r1", 0.0), stat) == pytest.approx(0.15)
    # p95: rank 95 of 100 falls in (0.1, +Inf] -> the highest finite bound, 0.1
    assert quantile(stat.latency_buckets, 0.95) == 0.1
    # p50: rank 50 = exactly the 0.01 bucket's count -> 0.01
    assert quantile(stat.latency_buckets, 0.5) == pytest.approx(0.01)
    # p70: rank 70, between 50 (0.01) and 90 (0.1): 0.01 + 0.09 * 20/40 = 0.055
    assert quantile(stat.latency_buckets, 0.7) == pytest.approx(0.055)


@pytest.mark.parametrize("pairs, expected", [
    pytest.param([(math.inf, 100.0), (0.1, 90.0), (0.25, math.nan)], ((0.1, 90.0), (math.inf, 100.0)),
                 id="sorted by bound, a NaN count left out"),
    pytest.param([(math.nan, 5.0), (0.1, 1.0), (math.inf, 2.0)], ((0.1, 1.0), (math.inf, 2.0)), id="a NaN bound"),
    pytest.param([(0.1, 90.0), (0.25, 99.0)], (), id="no +Inf bucket: none"),
    pytest.param([], (), id="empty"),
])
def test_cumulative_histogram(pairs, expected):
    assert cumulative_histogram(pairs) == expected
