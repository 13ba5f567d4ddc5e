"""loadtests.bench.manysim: the simulator's side of a many-small-functions run."""

from __future__ import annotations

import json

import numpy as np

from autoscaler.traces import make_trace
from loadtests.bench import manysim
from loadtests.scenarios import make_schedule


def test_the_load_tests_longtail_is_the_simulators_zipf_trace():
    names = [f"f{i:02d}" for i in range(12)]
    schedule = make_schedule("longtail", functions=names, duration_s=30, rate=20, seed=4, zipf_s=1.1)
    trace = make_trace("zipf", functions=12, seconds=30, seed=4, total_rate=20, zipf=1.1)
    assert np.array_equal(schedule.times, trace.times) and np.array_equal(schedule.fids, trace.fids)


def test_more_functions_than_slices_time_share_and_all_are_answered():
    """12 functions at 1/8 on one device (8 slices), 20 req/s for 30 s, every one at zero: 8 get
    slices, the first replicas of the others that get a request time-share the device (it is
    little busy: 20 x 20 ms x 1/8 = 5 % of it), and nothing times out; off, none time-shares."""
    trace = make_trace("zipf", functions=12, seconds=30, seed=0, total_rate=20, zipf=1.1)
    started = len(set(trace.fids.tolist()))
    on = manysim.simulate(12, 1, 20, 30)
    assert on["requests"] == len(trace) and on["answered"] == len(trace)
    assert on["cold_starts"] == started and on["time_shared"] == started - 8
    assert on["slo_attainment"] > 0.9
    off = manysim.simulate(12, 1, 20, 30, time_share_busy=0.0)
    assert off["time_shared"] == 0 and off["takebacks"] > 0


def _run_folder(tmp_path, requests: int, slices: str = "1/8:1024"):
    (tmp_path / "many.json").write_text(json.dumps({"requests": requests, "answered": requests,
                                                    "slo_attainment": 0.9}))
    starts = [{"ready_s": 1.1}, {"ready_s": 1.3}, {"ready_s": 2.0}]
    params = {"rate": 5.0, "seed": 2, "zipf_s": 1.1, "slices": {f"f{i}": slices for i in range(4)}}
    (tmp_path / "summary.json").write_text(json.dumps({"functions": [f"f{i}" for i in range(4)], "params": params,
                                                       "duration_s": 10.0,
                                                       "cold_starts": {"count": 3, "replica_starts": starts}}))


def test_the_live_side_gives_the_run_its_median_cold_start_and_the_same_requests(tmp_path, capsys):
    """The run's functions, rate, duration, seed and Zipf exponent are taken from its summary
    (the command line's other values are not used), its cold start is the median, 1.3 s."""
    same = len(make_trace("zipf", functions=4, seconds=10, seed=2, total_rate=5.0, zipf=1.1))
    _run_folder(tmp_path, same)
    live = manysim.live_outcome(tmp_path)
    assert live["cold_start_s"] == 1.3 and live["run"]["functions"] == 4 and live["run"]["seed"] == 2
    assert manysim.main(["--functions", "60", "--rate", "100", "--devices", "1", "--live", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 functions" in out and "seed 2" in out and "90.00%" in out and "1.30" in out


def test_a_run_of_other_requests_or_slices_is_refused(tmp_path, capsys):
    _run_folder(tmp_path, 12345)
    assert manysim.main(["--devices", "1", "--live", str(tmp_path)]) == 2
    assert "not the same requests" in capsys.readouterr().err
    _run_folder(tmp_path, 12345, slices="1/8")
    assert manysim.main(["--devices", "1", "--live", str(tmp_path)]) == 2
    assert "this comparison models 1/8:1024" in capsys.readouterr().err
