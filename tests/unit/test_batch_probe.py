"""The batch probe: a batching replica times a batch of 1 row and one of its largest on zeros at
load (serving's DataPlane._probe), exports both, and the controller reads them where no window
taught it a size near (metrics.seed_batch_latency), by either metrics source and in the
simulator alike."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest

from autoscaler.loop import Memory, policy_table
from autoscaler.metrics import parse_replica_metrics, rows_per_request, seed_batch_latency
from autoscaler.policy import DEFAULT_CONFIG, full_batch, batch_budget_s
from autoscaler.simulator import Profile
from autoscaler.sources.promql import PROBE, probe_of, rows_of, stat_from_query
from functions.spec import BatchingSpec, ScalingSpec, SliceRequest
from serving.dataplane import DataPlane
from serving.executor import SliceExecutor, bind_slice
from serving.metrics import ReplicaMetrics
from serving.models.base import LoadOptions, Model
from serving.protocol.errors import InvalidInput
from serving.protocol.types import TensorSpec

PROBE_1_8 = ((1.0, 0.040), (8.0, 0.120))  # emulated_code.yaml's profile: 40 ms at 1 row, 120 ms at 8

SEED_CASES = [
    # id, learned table, probe, rows per request, largest batch, table the policy reads
    ("nothing-learned", (), PROBE_1_8, None, 8, PROBE_1_8),
    # a window that ended inside a batch reads a batch more: still one row a request
    ("one-row-with-noise", ((1.0, 0.0446),), PROBE_1_8, 1.4, 8, ((1.0, 0.0446), (8.0, 0.120))),
    # the conversation trace's case: every request ran alone, one size learned; the probe's 8 beside it
    ("one-size-learned", ((1.0, 0.0446),), PROBE_1_8, None, 8, ((1.0, 0.0446), (8.0, 0.120))),
    # a window of 7.6 a batch lies in bucket 8: what ran stands over the probe
    ("learned-stands", ((1.0, 0.0446), (7.6, 0.118)), PROBE_1_8, 1.0, 8, ((1.0, 0.0446), (7.6, 0.118))),
    # 1.3 a batch is bucket 1's (log2 0.38 rounds to 0): the probe's 1 is not added beside it
    ("near-one-is-one", ((1.3, 0.05),), PROBE_1_8, None, 8, ((1.3, 0.05), (8.0, 0.120))),
    # requests of 2 rows: a batch of 8 rows is 4 requests, the probe says nothing in requests
    ("multi-row-requests", ((1.0, 0.0446),), PROBE_1_8, 2.0, 8, ((1.0, 0.0446),)),
    ("no-probe", ((1.0, 0.0446),), (), None, 8, ((1.0, 0.0446),)),
    # a new revision batches at most 4: the probe's 8 says nothing of it
    ("over-the-largest-batch", ((1.0, 0.0446),), PROBE_1_8, None, 4, ((1.0, 0.0446),)),
    ("bad-points-dropped", (), ((1.0, float("nan")), (8.0, 0.0), (0.5, 0.01), (8.0, 0.12)), None, 8, ((8.0, 0.12),)),
]


@pytest.mark.parametrize("table, probe, rows, largest, expected", [c[1:] for c in SEED_CASES],
                         ids=[c[0] for c in SEED_CASES])
def test_seed_batch_latency(table, probe, rows, largest, expected):
    assert seed_batch_latency(table, probe, rows, largest) == expected


def test_a_lone_requests_table_with_the_probe_reads_as_batching():
    """What the probe changes for decide(): the conversation trace's replicas ran each request
    alone, the table one size, read as none (policy_table: a model that does not batch); with
    the probe, two sizes: full_batch within the 80 ms budget of a 200 ms SLO is 1 + (80 - 40) /
    (120 - 40) x 7 = 4.5, 4 whole rows at 40 + 3 x 80 / 7 = 74.3 ms."""
    learned = ((1.0, 0.0446),)
    assert policy_table(learned, 8) == ()
    seeded = policy_table(seed_batch_latency(learned, PROBE_1_8), 8)
    rows, seconds = full_batch(seeded, batch_budget_s(ScalingSpec(slo_p95_ms=200.0), DEFAULT_CONFIG))
    assert rows == 4.0 and seconds == pytest.approx(0.0446 + 3 * (0.120 - 0.0446) / 7)


def test_memory_keeps_the_probe_apart_and_carries_it_to_a_new_slice():
    """The probe read on 1/4 seeds what decide() reads; the learned table stays what windows
    taught; on 1/2 the probe is carried at twice the speed, as the table is (loop.on_slice)."""
    memory = Memory()
    seen = memory.learn("f", 0.25, (1.0, 0.0446), (None, PROBE_1_8), (5.0, 4.0))  # a window ending in a batch
    assert seen == ((1.0, 0.0446), (8.0, 0.120))
    assert memory.batch["f"] == (0.25, ((1.0, 0.0446),))
    moved = memory.learn("f", 0.5, None)  # no reading of the probe since: the kept one, carried
    assert _flat(moved) == pytest.approx([1.0, 0.0223, 8.0, 0.060])
    # 2-row requests, counted over more than ROWS_MIN_ANSWERED requests: (5 + 200) / 104 = 1.97
    assert _flat(memory.learn("f", 0.5, None, rows=(200.0, 100.0))) == pytest.approx([1.0, 0.0223])
    assert memory.rows["f"] == (205.0, 104.0)
    assert _flat(memory.learn("f", 0.5, None, max_rows=1)) == pytest.approx([1.0, 0.0223])
    memory.keep_only(set())
    assert not memory.probe and not memory.rows


def _flat(table):
    return [x for row in table for x in row]


REPLICA_PAGE = """# HELP shoal_replica_batch_probe_seconds Seconds a batch of this many rows of zeros took at load
# TYPE shoal_replica_batch_probe_seconds gauge
shoal_replica_batch_probe_seconds{function="f",rows="8"} 0.1203
shoal_replica_batch_probe_seconds{function="f",rows="1"} 0.0405
"""


def test_the_probe_is_read_from_a_replica_page_and_from_prometheus():
    assert parse_replica_metrics(REPLICA_PAGE, "r1", 1.0).probe == ((1.0, 0.0405), (8.0, 0.1203))
    data = {"result": [{"metric": {"__name__": PROBE, "rows": rows, "instance": "x"}, "values": [[10.0, value]]}
                       for rows, value in (("8", "0.1203"), ("1", "0.0405"))]}
    assert stat_from_query(data, "r1").probe == ((1.0, 0.0405), (8.0, 0.1203))
    # by function on a cluster: one sample per rows label, the slice the function's now
    results = {"probe": [{"metric": {"function": "f", "rows": "8"}, "value": [0, "0.12"]},
                         {"metric": {"function": "f", "rows": "1"}, "value": [0, "0.04"]},
                         {"metric": {"function": "f"}, "value": [0, "0.5"]}]}  # no rows label: left out
    assert probe_of(results) == (None, ((1.0, 0.04), (8.0, 0.12)))
    assert probe_of({}) is None


@pytest.mark.parametrize("rows, answered, expected", [
    (410.0, 400.0, 1.025),  # a row a request, a batch still running at the count
    (800.0, 100.0, 8.0),  # 8-row requests
    (20.0, 10.0, None),  # too few requests to say
    (0.0, 0.0, None),
])
def test_rows_per_request(rows, answered, expected):
    assert rows_per_request(rows, answered) == expected


def test_rows_and_requests_over_a_prometheus_window():
    """38 rows and 38 requests a second over the 30 s window; none without a request."""
    vector = {k: [{"metric": {"function": "f"}, "value": [0, repr(v)]}] for k, v in (("rps", 38.0), ("rows", 38.0))}
    assert rows_of(vector) == (1140.0, 1140.0)
    assert rows_of({"rps": [{"metric": {"function": "f"}, "value": [0, "0.0"]}]}) is None


def test_the_simulator_probes_a_batching_profile_and_adds_its_time_to_the_cold_start():
    """((1, 40), (8, 120)) ms on its own 1/4: 40 + 120 ms more to start; on 1/8 twice as slow;
    a model that does not batch, or a cold start measured with the probe in it, adds none."""
    profile = Profile("code", ((1, 40.0), (8, 120.0)), 0.25, 0.25, cold_start_s=2.0)
    assert _flat(profile.probe(0.25)) == pytest.approx([1.0, 0.04, 8.0, 0.12])
    assert _flat(profile.probe(0.125)) == pytest.approx([1.0, 0.08, 8.0, 0.24])
    assert profile.probe_s == pytest.approx(0.16)
    assert Profile("mlp", ((1, 1.0),), 0.125, 0.125).probe_s == 0.0
    assert Profile("code", ((1, 40.0), (8, 120.0)), probe_in_cold_start=True).probe_s == 0.0


class Sleeper(Model):
    """A batching model that sleeps 10 ms + 5 ms a row, on declared inputs x FP32 [-1, 2]."""

    def __init__(self, largest: int = 64, lose_at: int | None = None):
        super().__init__("sleeper", "", LoadOptions())
        self.inputs = (TensorSpec("x", "FP32", (-1, 2)),)
        self.outputs = (TensorSpec("y", "FP32", (-1, 2)),)
        self.batchable = True
        self.largest, self.lose_at = largest, lose_at
        self.rows: list[int] = []

    def load(self) -> None:
        pass

    def predict(self, inputs):
        rows = len(inputs["x"])
        self.rows.append(rows)
        if rows == self.lose_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if rows > self.largest:
            raise InvalidInput(f"{rows} rows: at most {self.largest}")
        time.sleep(0.010 + 0.005 * rows)
        return {"y": inputs["x"]}


def _plane(model: Model, max_batch_size: int) -> DataPlane:
    binding = bind_slice(SliceRequest(), "cpu", None, 1)
    return DataPlane(model, SliceExecutor(binding), ReplicaMetrics("sleeper", binding.labels()),
                     BatchingSpec(max_batch_size=max_batch_size, max_queue_delay_ms=5))


def _page(plane: DataPlane) -> str:
    from prometheus_client import generate_latest

    return generate_latest(plane.metrics.registry).decode()


def test_a_replica_probes_its_batches_at_load_and_exports_them():
    """Warm-up (one row), then the probe: 1 row (15 ms slept) and 8 (50 ms) twice, the second
    timed (a new shape's first call pays its own setup), by the replica's clock, exported before
    it is ready; its busy seconds stay 0 (no window holds the probe). An emulated model's 8 runs
    once: its time is slept."""
    model = Sleeper()
    plane = _plane(model, 8)
    asyncio.run(plane.load())
    assert plane.ready and model.rows == [1, 1, 8, 8] and plane.executor.busy_seconds() == 0.0
    probe = dict(parse_replica_metrics(_page(plane), "r", 0.0).probe)
    assert set(probe) == {1.0, 8.0}
    assert 0.015 <= probe[1.0] < 0.015 + 0.05 and 0.050 <= probe[8.0] < 0.050 + 0.05
    asyncio.run(plane.stop())


@pytest.mark.parametrize("make, max_batch_size, rows, ready, probed, told", [
    pytest.param(Sleeper, 1, [1], True, False, [], id="no batching: no probe"),
    pytest.param(lambda: Sleeper(largest=4), 8, [1, 1, 8], True, False, [], id="refuses its largest: serves unprobed"),
    pytest.param(lambda: Sleeper(lose_at=8), 8, [1, 1, 8], False, False, ["CUDA error"],
                 id="loses the device: never serves"),
])
def test_a_probe_that_cannot_run(make, max_batch_size, rows, ready, probed, told, caplog):
    model = make()
    plane = _plane(model, max_batch_size)
    lost: list[str] = []
    plane.on_lost = lost.append
    with caplog.at_level(logging.INFO, logger="shoal.dataplane"):
        asyncio.run(plane.load())
    assert model.rows == rows and plane.ready == ready
    assert bool(parse_replica_metrics(_page(plane), "r", 0.0).probe) == probed
    assert len(lost) == len(told) and all(t in w for t, w in zip(told, lost))
    if max_batch_size > 1 and ready:
        assert "batches not probed: 8 rows of zeros raised InvalidInput: 8 rows: at most 4" in caplog.text
    asyncio.run(plane.stop())


def test_user_code_is_never_probed():
    model = Sleeper()
    model.user_code = True
    plane = _plane(model, 8)
    asyncio.run(plane.load())
    assert plane.ready and model.rows == [] and not parse_replica_metrics(_page(plane), "r", 0.0).probe
    zeros = Sleeper().zeros(3)
    assert zeros["x"].shape == (3, 2) and zeros["x"].dtype == np.float32 and not zeros["x"].any()
    asyncio.run(plane.stop())


def test_shoal_ups_source_reads_a_replicas_probe_with_the_slice_it_runs_on():
    """Two scrapes of a replica on 1/4 whose page holds the probe: the reading says it, on 1/4;
    the window's rows and requests (8 batches of 40 rows, 40 requests) beside it."""
    from fractions import Fraction
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from autoscaler.metrics import ReplicaStat
    from autoscaler.placement import Inventory
    from autoscaler.replicas import Replica, ReplicaScaler
    from autoscaler.sources.direct import ReplicaScrapes

    stats = [ReplicaStat("r", 10.0, completed=0.0, probe=PROBE_1_8),
             ReplicaStat("r", 11.0, completed=40.0, busy_s=0.5, batches=8.0, batch_rows=40.0, probe=PROBE_1_8)]

    class Scraper:
        async def scrape(self, replica, host, port, at):
            return stats.pop(0)

    class Router:
        def outstanding(self, function):
            return 0

        def inflight_seconds(self, function):
            return 0.0, 0.0

        def held(self, function):
            return 0

        def latencies(self):
            return {}

    router = Router()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    source = ReplicaScrapes(scaler, Scraper(), router)
    scaler.replicas["r"] = Replica("r", "f", 1, placement=SimpleNamespace(fraction=Fraction(1, 4)), state="ready",
                                   handle=SimpleNamespace(host="127.0.0.1", port=1))
    first = asyncio.run(source.reading("f", 10.0))
    assert first.probe == (0.25, PROBE_1_8) and first.rows is None  # no window yet
    second = asyncio.run(source.reading("f", 11.0))
    assert second.probe == (0.25, PROBE_1_8) and second.rows == (40.0, 40.0)


def test_an_emulated_models_largest_batch_runs_once():
    model = Sleeper()
    model.emulated = True
    plane = _plane(model, 8)
    asyncio.run(plane.load())
    assert plane.ready and model.rows == [1, 8]  # no warm-up (slept), the probe's 1 and 8 once each
    assert set(dict(parse_replica_metrics(_page(plane), "r", 0.0).probe)) == {1.0, 8.0}
    asyncio.run(plane.stop())
