"""loadtests/analysis.py: the report's numbers from recorded runs, with the arithmetic beside each."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from loadtests import analysis
from loadtests.analysis import Requests


def requests(rows: list[tuple]) -> Requests:
    """rows: (start_s, latency_ms, status, function[, error[, cold]])."""
    rows = [r + ("",) * (6 - len(r)) for r in rows]
    col = list(zip(*rows)) if rows else [[]] * 6
    return Requests(np.array(col[0], float), np.array(col[0], float) - 0.001, np.array(col[1], float),
                    np.array(col[2], np.int64), np.array(col[3], object), np.array(col[4], object),
                    np.array(col[5], object))


def sample(t: float, replicas: list[tuple[str, str, str, str]], ready: int | None = None,
           function: str = "f", slice_: str = "1/4") -> dict:
    """replicas: (id, state, slice, device)."""
    views = [{"id": i, "state": st, "slice": sl, "device": dev, "duty": 0.5} for i, st, sl, dev in replicas]
    n_ready = sum(1 for r in views if r["state"] == "ready") if ready is None else ready
    return {"t": t, "functions": {function: {"slice": slice_, "ready": n_ready,
                                             "starting": sum(1 for r in views if r["state"] == "starting"),
                                             "desired": len(views), "held": 0, "replicas": views}}}


CPU = [{"id": "cpu:0", "kind": "cpu", "emulated": False}]


def test_costs_integrate_slices_held_until_the_next_sample():
    # t 0-1: one starting 1/4 replica; t 1-3: two ready (1/4 each); t 3-4: none.
    # slices: 0.25 * 1 + 0.5 * 2 + 0 * 1 = 1.25 replica-slice-seconds
    # devices: 1 device for 3 s = 3 device-seconds
    # static: peak 2 replicas * 1/4 = 0.5 of a device for the 4 s span = 2.0; whole devices ceil(0.5) = 1 * 4 = 4
    samples = [sample(0, [("a", "starting", "1/4", "cpu:0")]),
               sample(1, [("a", "ready", "1/4", "cpu:0"), ("b", "ready", "1/4", "cpu:0")]),
               sample(3, [])]
    c = analysis.costs(samples, t_end=4.0, devices=CPU)
    assert c["replica_slice_seconds"] == pytest.approx(1.25)
    assert c["device_seconds"] == pytest.approx(3.0)
    assert c["static_peak"] == {"replicas": {"f": 2}, "slices": {"f": "1/2"},
                                "replica_slice_seconds": pytest.approx(2.0), "device_seconds": pytest.approx(4.0)}
    assert c["replica_seconds"] == pytest.approx(1 * 1 + 2 * 2)  # replicas x seconds: 5
    assert c["vs_static"] == pytest.approx(1.25 / 2.0)
    assert c["gpu_seconds"] is None and c["device_kinds"] == ["cpu"] and not c["emulated"]


def test_costs_count_each_device_once_and_label_emulated_gpus():
    # two 1/2 replicas on two devices for 2 s: 2 * 0.5 * 2 = 2 slice-s, 2 devices * 2 s = 4 device-s (GPU, emulated)
    devices = [{"id": "gpu:0", "kind": "gpu", "emulated": True}, {"id": "gpu:1", "kind": "gpu", "emulated": True}]
    samples = [sample(0, [("a", "ready", "1/2", "gpu:0"), ("b", "ready", "1/2", "gpu:1")], slice_="1/2")]
    c = analysis.costs(samples, t_end=2.0, devices=devices)
    assert c["replica_slice_seconds"] == pytest.approx(2.0)
    assert c["gpu_seconds"] == pytest.approx(4.0) and c["emulated"]
    # static: 2 * 1/2 = 1 device for 2 s
    assert c["static_peak"]["device_seconds"] == pytest.approx(2.0)


def test_draining_replicas_hold_their_slice_until_stopped():
    # a draining replica (finishing its requests before it stops) still holds 1/4 for 2 s = 0.5; stopped ones nothing
    samples = [sample(0, [("a", "draining", "1/4", "cpu:0"), ("b", "stopped", "1/4", "cpu:0"),
                          ("c", "failed", "1/4", "cpu:0")])]
    c = analysis.costs(samples, t_end=2.0, devices=CPU)
    assert c["replica_slice_seconds"] == pytest.approx(0.5) and c["static_peak"]["replicas"] == {"f": 1}


def counted(s: dict, slice_seconds: float, held: float) -> dict:
    """`s` with the control plane's own count of its function (shoal up's status)."""
    (f,) = s["functions"].values()
    f.update(slice_seconds=slice_seconds, slices_held=held)
    return s


def test_the_control_planes_exact_count_is_the_cost_where_the_samples_carry_it():
    # a 1/4 replica taken back at 0.9 s frees its slice then (10.0 + 0.25 x 0.9 = 10.225 slice-s
    # since the plane began), and drains until 1.2 s. The sample at 1 s sees it draining: the
    # samples' integral counts it to t_end, 0.25 x 2 = 0.5; the plane's count, 0.225, is the cost
    samples = [counted(sample(0, [("a", "ready", "1/4", "cpu:0")]), 10.0, 0.25),
               counted(sample(1, [("a", "draining", "1/4", "cpu:0")]), 10.225, 0.0)]
    c = analysis.costs(samples, t_end=2.0, devices=CPU)
    assert c["replica_slice_seconds"] == pytest.approx(0.225) and c["replica_slice_seconds_source"] == "allocator"
    assert c["replica_slice_seconds_sampled"] == pytest.approx(0.5)
    assert c["vs_static"] == pytest.approx(0.225 / 0.5)  # static: the peak 1/4 for the 2 s span
    # slices still held at the last sample count until t_end: 0.25 held from 1 s to 3 s adds 0.5
    samples[-1] = counted(sample(1, [("a", "ready", "1/4", "cpu:0")]), 10.25, 0.25)
    assert analysis.costs(samples, t_end=3.0, devices=CPU)["replica_slice_seconds"] == pytest.approx(0.25 + 0.5)
    # a sample after t_end counts for nothing: the count at 1 s and 0.25 held to t_end = 3 s, as above
    samples.append(counted(sample(4, [("a", "ready", "1/4", "cpu:0")]), 11.0, 0.25))
    assert analysis.costs(samples, t_end=3.0, devices=CPU)["replica_slice_seconds"] == pytest.approx(0.25 + 0.5)
    # ... but it bounds the count at t_end: a replica that stopped at 1.4 s (10.35 at 4 s) held 0.1 more, not 0.5
    samples[-1] = counted(sample(4, []), 10.35, 0.0)
    assert analysis.costs(samples, t_end=3.0, devices=CPU)["replica_slice_seconds"] == pytest.approx(0.25 + 0.1)
    del samples[-1]
    # a plane that does not count (no `slice_seconds` in a sample): the samples' integral stands
    del samples[0]["functions"]["f"]["slice_seconds"]
    c = analysis.costs(samples, t_end=3.0, devices=CPU)
    assert c["replica_slice_seconds"] == pytest.approx(0.75) and c["replica_slice_seconds_source"] == "samples"


def test_no_replica_means_no_static_cost_and_no_ratio():
    c = analysis.costs([sample(0, [("b", "stopped", "1/4", "cpu:0")])], t_end=5.0, devices=CPU)
    assert c["replica_slice_seconds"] == 0 and c["static_peak"]["replica_slice_seconds"] == 0
    assert c["vs_static"] is None  # nothing to compare with, not a division by zero


def test_samples_after_the_end_count_for_nothing():
    # one replica the whole time; samples every second to t = 13 but the run ends at t = 10:
    # measured 0.25 * 10 = 2.5 and static 0.25 * 10 = 2.5, so exactly 1.0x (not 13 / 10)
    samples = [sample(t, [("a", "ready", "1/4", "cpu:0")]) for t in range(14)]
    c = analysis.costs(samples, t_end=10.0, devices=CPU)
    assert c["replica_slice_seconds"] == pytest.approx(2.5) and c["vs_static"] == pytest.approx(1.0)


def test_static_peak_uses_the_slices_the_replicas_had():
    # the spec says 1/4, the controller placed two replicas at 1/2: the peak held is 1 whole device, so a static
    # allocation of it for 4 s is 4.0 slice-seconds, the same as measured (1.0x, not 2.0x)
    samples = [sample(0, [("a", "ready", "1/2", "cpu:0"), ("b", "ready", "1/2", "cpu:0")], slice_="1/4")]
    c = analysis.costs(samples, t_end=4.0, devices=CPU)
    assert c["static_peak"]["slices"] == {"f": "1"} and c["vs_static"] == pytest.approx(1.0)


def meta(**kw):
    return {"scenario": "spike", "functions": ["f"], "duration_s": 10.0, "t0": 1000.0, "loop": "open",
            "slo_ms": {"f": 100.0}, **kw}


def test_summary_slo_attainment_counts_failures_as_missed():
    # 10 requests: 7 answered within 100 ms, 1 answered in 150 ms, 1 is a 503, 1 was refused by the client.
    # attainment = 7 / 10 = 0.7; failures = 2; p50 of the 8 answered latencies.
    rows = [(i * 0.5, 10.0 + i, 200, "f") for i in range(7)]
    rows += [(4.0, 150.0, 200, "f"), (4.5, 2.0, 503, "f", "503 Service Unavailable"),
             (5.0, 0.0, 0, "f", "client: not sent, max in-flight 1000 reached")]
    req = requests(rows)
    s = analysis.summarize(meta=meta(), req=req, offered=10, samples=[], events=[],
                           counters={"gateway": {"requests": 9, "non_200": 1}, "cold_starts": 0},
                           locust={"csv": {"requests": 10, "failures": 2}, "final": {"requests": 10, "failures": 2}},
                           devices=CPU)
    assert s["requests"] == 10 and s["failures"] == 2 and s["ok"] == 8
    assert s["slo_attainment"] == pytest.approx(0.7)
    assert s["latency_ms"]["p50"] == pytest.approx(np.percentile([10, 11, 12, 13, 14, 15, 16, 150], 50))  # 13.5
    assert s["latency_ms"]["max"] == 150.0
    assert s["errors_by_status"] == {"503": 1, "client: not sent, max in-flight 1000 reached": 1}
    # 10 sent by Locust, 9 reached the gateway (one refused by the client); 1 non-200 answer there
    assert s["checks"]["sent_to_gateway"] == 9 and s["checks"]["http_errors"] == 1
    assert s["checks"]["locust_agrees"] and s["checks"]["gateway_agrees"]
    assert s["achieved_rate"] == pytest.approx(8 / 10.0) and s["offered_rate"] == pytest.approx(1.0)


def test_events_of_other_functions_are_left_out():
    events = [{"id": 1, "at": 1001.0, "function": "other", "kind": "scale", "message": "0 -> 1",
               "data": {"from": 0, "to": 1, "reason": "COLD_START"}},
              {"id": 2, "at": 1001.5, "function": "other", "kind": "replica_ready", "message": "ready",
               "data": {"replica": "other-1", "spawn_s": 0.1, "ready_s": 0.2}}]
    s = analysis.summarize(meta=meta(), req=requests([(0.0, 5.0, 200, "f")]), offered=1, samples=[], events=events,
                           counters={}, locust={"csv": {"requests": 1, "failures": 0}}, devices=CPU)
    assert s["scale_decisions"] == [] and s["cold_starts"]["replica_starts"] == []


def test_requests_given_up_may_be_counted_either_way_by_the_gateway():
    # 3 sent; one given up by the client at the end of the run. The gateway counted all 3, and the given-up one
    # as 200 (it answered after the client left) or as 499 (it saw the client leave): both agree.
    req = requests([(0.0, 5.0, 200, "f"), (0.5, 5.0, 200, "f"),
                    (1.0, 30000.0, 0, "f", "client: gave up, the run ended before the answer")])
    for non_200 in (0, 1):
        s = analysis.summarize(meta=meta(), req=req, offered=3, samples=[], events=[],
                               counters={"gateway": {"requests": 3, "non_200": non_200}},
                               locust={"csv": {"requests": 3, "failures": 1}}, devices=CPU)
        assert s["checks"]["gave_up"] == 1 and s["checks"]["gateway_agrees"], non_200
    s = analysis.summarize(meta=meta(), req=req, offered=3, samples=[], events=[],
                           counters={"gateway": {"requests": 3, "non_200": 2}},
                           locust={"csv": {"requests": 3, "failures": 1}}, devices=CPU)
    assert not s["checks"]["gateway_agrees"]  # 2 non-200 cannot come from 0 errors and 1 given up


def test_locust_final_totals_win_over_a_late_csv():
    # the CSV was written a second before the end and missed 2 requests; the exit totals have them all
    req = requests([(float(i), 5.0, 200, "f") for i in range(5)])
    s = analysis.summarize(meta=meta(), req=req, offered=5, samples=[], events=[], counters={},
                           locust={"csv": {"requests": 3, "failures": 0}, "final": {"requests": 5, "failures": 0}},
                           devices=CPU)
    assert s["checks"]["locust_agrees"] is True and s["checks"]["locust_csv_agrees"] is False


def test_checks_disagree_when_the_counts_differ():
    req = requests([(0.0, 5.0, 200, "f"), (1.0, 5.0, 200, "f")])
    s = analysis.summarize(meta=meta(), req=req, offered=2, samples=[], events=[],
                           counters={"gateway": {"requests": 3, "non_200": 0}, "cold_starts": 0},
                           locust={"csv": {"requests": 2, "failures": 1}, "final": None}, devices=CPU)
    assert not s["checks"]["locust_agrees"] and not s["checks"]["gateway_agrees"]


def test_per_function_slos():
    # a: SLO 10 ms, b: SLO 1,000 ms. 20 ms meets b's, not a's: attainment 1 / 2
    req = requests([(0.0, 20.0, 200, "a"), (0.1, 20.0, 200, "b")])
    s = analysis.summarize(meta=meta(functions=["a", "b"], slo_ms={"a": 10.0, "b": 1000.0}), req=req, offered=2,
                           samples=[], events=[], counters={}, locust={"csv": {"requests": 2, "failures": 0}},
                           devices=[])
    assert s["slo_attainment"] == 0.5
    assert s["checks"]["gateway_agrees"] is None  # no control plane (a peer): nothing to compare with


def test_cold_starts_from_events_and_headers():
    events = [{"id": 5, "at": 1002.0, "function": "f", "kind": "replica_ready", "message": "f-1 ready",
               "data": {"replica": "f-1", "spawn_s": 0.05, "ready_s": 0.08}},
              {"id": 6, "at": 1001.9, "function": "f", "kind": "scale", "message": "0 -> 1 replicas: COLD_START",
               "data": {"from": 0, "to": 1, "reason": "COLD_START"}}]
    req = requests([(1.9, 120.0, 200, "f", "", "queue_wait=0.1000, spawn=0.0500, load=0.0300, first_inference=0.0040"),
                    (1.95, 70.0, 200, "f", "", "queue_wait=0.0500, spawn=0.0500, load=0.0300"),
                    (3.0, 2.0, 200, "f")])
    c = analysis.cold_starts(req, events, t0=1000.0)
    assert c["replica_starts"] == [{"t": 2.0, "replica": "f-1", "function": "f", "spawn_s": 0.05,
                                    "load_s": pytest.approx(0.03), "ready_s": 0.08}]
    assert c["requests_held"] == 2 and c["worst_wait_ms"] == 120.0
    assert c["phases_max_s"]["queue_wait"] == 0.1 and c["phases_mean_s"]["queue_wait"] == pytest.approx(0.075)
    d = analysis.scale_decisions(events, t0=1000.0)
    assert [(x["t"], x["reason"], x["from"], x["to"]) for x in d] == [(pytest.approx(1.9), "COLD_START", 0, 1)]


def test_timeseries_bins_by_send_and_completion_second():
    # sent at 0.2 (answered at 0.25), 0.9 (answered at 1.4), 1.5 (a 503 at 1.502), 2.1 (answered at 2.2)
    req = requests([(0.2, 50.0, 200, "f"), (0.9, 500.0, 200, "f"), (1.5, 2.0, 503, "f", "503"),
                    (2.1, 100.0, 200, "f")])
    ts = analysis.timeseries(req, np.array([2, 1, 1]), [], duration_s=3, slo_ms={"f": 100.0})
    assert ts["seconds"] == 3 and ts["slo_ms"] == 100.0
    assert ts["sent"] == [2, 1, 1] and ts["ok"] == [1, 1, 1] and ts["failed"] == [0, 1, 0]
    assert ts["latency_ms"]["p50"] == [50.0, 500.0, 100.0]
    assert ts["over_slo"] == [0, 1, 0]  # 500 ms > 100; 100 ms is within (<=)
    assert ts["offered"] == [2, 1, 1]


def test_counter_delta_reads_prometheus_text():
    before = analysis.counter_totals('shoal_gateway_requests_total{code="200",function="f"} 10.0\n'
                                     'shoal_gateway_requests_total{code="200",function="g"} 4.0\n')
    after = analysis.counter_totals('shoal_gateway_requests_total{code="200",function="f"} 25.0\n'
                                    'shoal_gateway_requests_total{code="503",function="f"} 2.0\n'
                                    'shoal_gateway_requests_total{code="200",function="g"} 9.0\n'
                                    'shoal_cold_start_seconds_count{function="f",phase="spawn"} 3.0\n')
    assert analysis.counter_delta(before, after, "shoal_gateway_requests_total", function="f") == \
        {"code=200": 15.0, "code=503": 2.0}  # 25 - 10; 2 - 0 (new series)
    assert analysis.counter_delta(before, after, "shoal_cold_start_seconds_count", function="f", phase="spawn") == \
        {"": 3.0}


def test_read_locust_totals_and_requests(tmp_path):
    stats = tmp_path / "locust_stats.csv"
    stats.write_text("Type,Name,Request Count,Failure Count,Median Response Time\n"
                     "POST,infer f,12,2,3\n,Aggregated,12,2,3\n")
    assert analysis.read_locust_totals(stats) == {"requests": 12, "failures": 2}
    log = tmp_path / "requests.csv"
    log.write_text("start,scheduled,latency_ms,status,function,error,cold_start\n"
                   "1000.5,1000.4,3.5,200,f,,\n1001.0,,0.0,0,f,client: not sent,\n")
    req = analysis.read_requests(log, t0=1000.0)
    assert req.start.tolist() == [0.5, 1.0] and req.scheduled[0] == pytest.approx(0.4) and math.isnan(req.scheduled[1])
    assert req.status.tolist() == [200, 0] and req.ok.tolist() == [True, False]
    with pytest.raises(ValueError, match="no Aggregated row"):
        stats.write_text("Type,Name,Request Count,Failure Count\nPOST,x,1,0\n")
        analysis.read_locust_totals(stats)


def test_a_closed_loop_of_failures_still_makes_valid_json():
    # closed loop: no scheduled times (NaN lag); every request failed: no latency to take quantiles of
    req = requests([(0.0, 3.0, 400, "f", "400 Bad Request"), (0.5, 3.0, 400, "f", "400 Bad Request")])
    req = Requests(req.start, np.full(2, np.nan), req.latency_ms, req.status, req.function, req.error, req.cold)
    s = analysis.summarize(meta=meta(loop="closed"), req=req, offered=2, samples=[], events=[],
                           counters={"gateway": {"requests": 2, "non_200": 2}},
                           locust={"csv": {"requests": 2, "failures": 2}}, devices=CPU)
    doc = json.loads(json.dumps(s, allow_nan=False))  # raises on NaN or Infinity
    assert doc["slo_attainment"] == 0.0 and doc["latency_ms"]["p95"] is None and doc["client_send_lag_ms"] is None
    assert doc["errors_by_status"] == {"400": 2} and doc["checks"]["gateway_agrees"]
    ts = analysis.timeseries(req, np.array([1]), [], duration_s=1, slo_ms={"f": 100.0})
    assert json.loads(json.dumps(ts, allow_nan=False))["failed"] == [2]


def test_no_requests_at_all():
    s = analysis.summarize(meta=meta(), req=requests([]), offered=0, samples=[], events=[], counters={},
                           locust={"csv": {"requests": 0, "failures": 0}}, devices=CPU)
    assert s["requests"] == 0 and s["slo_attainment"] is None and s["latency_ms"]["p50"] is None
    json.dumps(s, allow_nan=False)
