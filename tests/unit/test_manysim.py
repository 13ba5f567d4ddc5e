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


def test_the_live_side_reads_the_run_and_its_median_cold_start(tmp_path, capsys):
    (tmp_path / "many.json").write_text(json.dumps({"requests": 10, "answered": 10, "slo_attainment": 0.9}))
    starts = [{"ready_s": 1.1}, {"ready_s": 1.3}, {"ready_s": 2.0}]
    (tmp_path / "summary.json").write_text(json.dumps({"cold_starts": {"count": 3, "replica_starts": starts}}))
    live = manysim.live_outcome(tmp_path)
    assert live["cold_start_s"] == 1.3
    assert manysim.main(["--functions", "4", "--devices", "1", "--rate", "5", "--duration", "10",
                         "--live", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "slo_attainment" in out and "90.00%" in out and "1.30" in out
