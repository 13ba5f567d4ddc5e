"""The pure parts of the sim-against-live benchmark (loadtests/bench/simlive.py): the trace
window, its csv as the load test reads it, and the comparison with issue 19's tolerance
(slice-seconds within 10 %, SLO attainment within 0.5 points)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoscaler.simulator import batch_seconds
from loadtests.bench.simlive import (PROFILE, Tolerance, batch_overhead_s, compare, csv_text, live_numbers,
                                     request_path_s, sim_profile, tick_timing, window_times)
from loadtests.scenarios import make_schedule

WINDOW_CASES = [
    # id, times (s), minutes, compress, expected
    # 1 minute: arrivals before 60 s, divided by 4
    ("first-minute-at-4x", (0.0, 10.0, 59.9, 60.0, 61.0), 1.0, 4.0, [0.0, 2.5, 14.975]),
    ("uncompressed", (0.0, 30.0, 90.0), 1.0, 1.0, [0.0, 30.0]),
    ("nothing-inside", (120.0,), 1.0, 4.0, []),
]


@pytest.mark.parametrize("times,minutes,compress,expected", [c[1:] for c in WINDOW_CASES],
                         ids=[c[0] for c in WINDOW_CASES])
def test_window_times(times, minutes, compress, expected):
    assert window_times(list(times), minutes, compress) == pytest.approx(expected)


def test_a_later_window_starts_at_its_own_zero():
    # minutes 10-20 at 4x: 600 s is its 0, 1,199.9 s its 149.975; 599.9 and 1,200 are outside
    times = [599.9, 600.0, 700.0, 1199.9, 1200.0]
    assert window_times(times, 10.0, 4.0, start_minute=10.0) == pytest.approx([0.0, 25.0, 149.975])


@pytest.mark.parametrize("start", [-1.0, float("nan"), float("inf")])
def test_window_times_refuses_a_bad_start(start):
    with pytest.raises(ValueError, match="start_minute"):
        window_times([0.0], 10.0, 4.0, start_minute=start)


@pytest.mark.parametrize("minutes,compress", [(0.0, 4.0), (10.0, 0.0), (float("nan"), 4.0), (10.0, -1.0)])
def test_window_times_refuses_bad_numbers(minutes, compress):
    with pytest.raises(ValueError, match="must be finite numbers > 0"):
        window_times([0.0], minutes, compress)


def test_the_csv_scenario_replays_the_window_as_written(tmp_path):
    times = window_times([0.0, 1.3, 2.0, 7.25, 599.0, 601.0], 10.0, 4.0)  # 0, .325, .5, 1.8125, 149.75
    path = tmp_path / "window.csv"
    path.write_text(csv_text(times))
    schedule = make_schedule("csv", functions=["code"], duration_s=150.0, rate=1.0, path=str(path))
    assert schedule.functions == ("code",) and schedule.fids.tolist() == [0] * 5
    np.testing.assert_allclose(schedule.times, [0.0, 0.325, 0.5, 1.8125, 149.75], atol=1e-6)


def _pair(live_slo, sim_slo, live_s, sim_s):
    live = {"slo_attainment": live_slo, "replica_slice_seconds": live_s, "cold_starts": 1, "replica_starts": 4}
    sim = {"slo_attainment": sim_slo, "replica_slice_seconds": sim_s, "cold_starts": 1, "replica_starts": 5}
    return live, sim


COMPARE_CASES = [
    # id, live SLO, sim SLO, live slice-s, sim slice-s, diff (points), ratio, SLO within, slice within
    # 93.2 % vs 93.5 %: +0.3 points; 101.7 vs 142.8: 1.404 (40 % over)
    ("issue-spot-check", 0.932, 0.935, 101.7, 142.8, 0.3, 1.404, True, False),
    # 99.19 % vs 98.69 %: -0.5 points, just inside; 120 vs 108: 0.9, just inside 10 %
    ("both-at-the-edge", 0.9919, 0.9869, 120.0, 108.0, -0.5, 0.9, True, True),
    # 99.19 vs 98.6: -0.59 points; 120 vs 132.1: 1.1008
    ("both-just-outside", 0.9919, 0.986, 120.0, 132.1, -0.59, 1.1008, False, False),
]


@pytest.mark.parametrize("live_slo,sim_slo,live_s,sim_s,diff,ratio,slo_ok,slice_ok",
                         [c[1:] for c in COMPARE_CASES], ids=[c[0] for c in COMPARE_CASES])
def test_compare(live_slo, sim_slo, live_s, sim_s, diff, ratio, slo_ok, slice_ok):
    row = compare(*_pair(live_slo, sim_slo, live_s, sim_s))
    assert row["slo_diff_points"] == pytest.approx(diff, abs=1e-3)
    assert row["slice_ratio"] == pytest.approx(ratio, abs=1e-4)
    assert (row["slo_within"], row["slice_within"]) == (slo_ok, slice_ok)
    assert (row["cold_starts"], row["replica_starts"]) == ([1, 1], [4, 5])


def test_compare_with_a_wider_tolerance():
    row = compare(*_pair(0.99, 0.98, 100.0, 115.0), Tolerance(slice_pct=20.0, slo_points=1.0))
    assert row["slo_within"] and row["slice_within"]


def test_live_numbers_take_the_median_cold_start():
    summary = {"requests": 10, "failures": 0, "slo_attainment": 0.9, "latency_ms": {"p95": 120.0},
               "replica_slice_seconds": 50.0, "cost": {"span_s": 151.0},
               "cold_starts": {"count": 1, "replica_starts": [{"ready_s": 2.2}, {"ready_s": 2.0}, {"ready_s": 2.1}]}}
    got = live_numbers(summary)
    assert (got["cold_start_s"], got["replica_starts"], got["cold_starts"]) == (2.1, 3, 1)


def _scale(at, before, after):
    return {"kind": "scale", "at": at, "data": {"from": before, "to": after}}


TIMING_CASES = [
    # id, events, t0, (phase, interval) or None
    # the docstring's: ticks 0, 62 and 140 after the first at 2.83 s, 1.0005 s apart:
    # (2.83 - 2 x 1.0005) / 1.0005 = 0.8286; the raise from zero at 0.009 s is a look at a
    # request's arrival, not a tick: left out
    ("drifting", [_scale(1000.009, 0, 1), _scale(1002.83, 1, 13), _scale(1064.861, 4, 2), _scale(1142.9, 1, 6)],
     1000.0, ((2.83 - 2 * 1.0005) / 1.0005, 1.0005)),
    ("from-zero-only", [_scale(1000.012, 0, 1)], 1000.0, None),
    # other kinds of event say nothing of the tick
    ("no-scale", [{"kind": "replica_ready", "at": 1002.5, "data": {}}], 1000.0, None),
    # one tick seen: its phase, the nominal interval
    ("one-tick", [_scale(10.2, 1, 2)], 0.0, (0.2, 1.0)),
    # two events in one tick: the median of their phases, the nominal interval
    ("one-tick-twice", [_scale(10.2, 1, 2), _scale(10.2004, 2, 3)], 0.0, (0.2002, 1.0)),
    # 0.6 s apart: no interval is fitted over so few ticks (it would say 0.6 s); the phases .2
    # and .8 around the circle: their median is 0
    ("too-few-ticks", [_scale(10.2, 1, 2), _scale(10.8, 2, 3)], 0.0, (0.0, 1.0)),
    # .97, .99 and .03 past whole seconds over 3 ticks: too few to fit (20 ms a tick would be 2 %
    # off the 1 s anyway); their circular median, .99
    ("wraps", [_scale(5.97, 1, 2), _scale(6.99, 2, 3), _scale(9.03, 3, 2)], 0.0, (0.99, 1.0)),
    # ticks 1.0005 s apart from 2.3 s; a look between ticks at 50.75 s (0.45 s off) is left out:
    # phase (2.3 - 2 x 1.0005) / 1.0005
    ("a-look-between-ticks", [_scale(2.3 + k * 1.0005, 2, 3) for k in (0, 30, 60, 90)] + [_scale(50.75, 3, 4)],
     0.0, ((2.3 - 2 * 1.0005) / 1.0005, 1.0005)),
    # 900 ticks of 1.00062 s: 0.56 s late by the last, numbered by the nominal second it would
    # be tick 901; numbered again on the fitted line: (3.3 - 3 x 1.00062) / 1.00062
    ("long-run", [_scale(3.3 + k * 1.00062, 2, 3) for k in (0, 300, 600, 900)], 0.0,
     ((3.3 - 3 * 1.00062) / 1.00062, 1.00062)),
]


@pytest.mark.parametrize("events,t0,expected", [c[1:] for c in TIMING_CASES], ids=[c[0] for c in TIMING_CASES])
def test_tick_timing(events, t0, expected):
    got = tick_timing(events, t0)
    if expected is None:
        assert got is None
    else:  # the phase as a distance around the circle of a tick
        (phase, interval), (want_phase, want_interval) = got, expected
        assert abs((phase - want_phase + 0.5) % 1.0 - 0.5) < 1e-6 and interval == pytest.approx(want_interval, abs=1e-9)


def test_a_run_that_scaled_only_from_zero_is_timed_by_its_sampled_ticks(tmp_path):
    """A live run whose only scale event is the raise from zero (tick_timing: None) is timed by
    the full ticks its status samples saw: 150 samples, each once a second, each seeing the last
    tick (ticks 1.0005 s apart from t0 + 0.37 s, each seen twice, one sample before any tick)."""
    from loadtests.bench.simlive import live_tick_timing, sampled_ticks

    t0 = 1_796_000_000.0
    (tmp_path / "requests.t0").write_text(f"{t0}\n")
    (tmp_path / "events.json").write_text(json.dumps([_scale(t0 + 0.012, 0, 1)]))
    ticks = [t0 + 0.37 + k * 1.0005 for k in range(150)]
    lines = [{"t": -0.5, "functions": {"code": {"ticked_at": None}}}]
    lines += [{"t": at - t0 + 0.4, "functions": {"code": {"ticked_at": round(at, 4)}}} for at in ticks for _ in (0, 1)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert sampled_ticks(tmp_path) == [round(at, 4) for at in ticks]
    phase, interval = live_tick_timing(tmp_path)
    assert phase == pytest.approx(0.37 / 1.0005, abs=1e-4) and interval == pytest.approx(1.0005, abs=1e-6)
    # without the samples (a run before 2026-12-02), as before: no timing, the replay at phase 0
    (tmp_path / "samples.jsonl").unlink()
    assert sampled_ticks(tmp_path) == [] and live_tick_timing(tmp_path) is None


def test_the_simulator_ticks_as_the_live_loop_did(tmp_path, monkeypatch):
    """sim_run with a 1.02 s tick looks at 1.02, 2.04, ... s, as a live loop whose ticks came
    20 ms late each; the arrivals move by (1 - phase) of that tick."""
    from loadtests.bench import simlive

    path = tmp_path / "window.csv"
    path.write_text(csv_text([0.0, 0.9, 2.5]))
    window = simlive.Window(path, 4.0, 3, "test", 1.0, 1.0)
    ticks, seen = [], []

    class Watch(simlive.live_data_path()):
        def _serve(self, a, f, t0, t1, until):
            ticks.append(t1)
            seen.extend(a.tolist())
            return super()._serve(a, f, t0, t1, until)

    monkeypatch.setattr(simlive, "live_data_path", lambda *_: Watch)
    record = simlive.sim_run("ray", window, 2.0, phase=0.5, tick_s=1.02)
    assert record["served"] == 3
    assert ticks[:3] == pytest.approx([1.02, 2.04, 3.06])
    assert sorted(seen) == pytest.approx([0.51, 1.41, 3.01])


def test_the_simulator_sees_the_arrivals_at_the_live_tick_phase(tmp_path, monkeypatch):
    """sim_run at phase 0.75 moves the arrivals 0.25 s later: a request at 0.9 s of the load,
    after the live tick at 0.75, is seen by the simulator's tick at 2 s, not 1 s."""
    from loadtests.bench import simlive

    path = tmp_path / "window.csv"
    path.write_text(csv_text([0.0, 0.9, 2.5]))
    window = simlive.Window(path, 4.0, 3, "test", 1.0, 1.0)
    seen = []

    class Watch(simlive.live_data_path()):
        def _serve(self, a, f, t0, t1, until):
            seen.extend(a.tolist())
            return super()._serve(a, f, t0, t1, until)

    monkeypatch.setattr(simlive, "live_data_path", lambda *_: Watch)
    record = simlive.sim_run("ray", window, 2.0, phase=0.75)
    assert record["served"] == 3
    assert sorted(seen) == pytest.approx([0.25, 1.15, 2.75])


SECONDS = batch_seconds(((1, 40.0), (8, 120.0)), 8)  # the emulated code profile's batches, by rows


def _batch(answered, rows, sent, stagger=0.0):
    """`rows` requests sent at `sent`, answered from `answered` on, `stagger` apart (as a
    gateway sends a batch's answers back one after another)."""
    return [(sent, answered + k * stagger - sent) for k in range(rows)]


OVERHEAD_CASES = [
    # id, requests as (sent, latency), expected overhead (s) or None
    # the docstring's: batches of 8 answered at 1.000, 1.1207 and 1.2414 s, all sent before 0.9 s:
    # 120.7 - 120 ms each
    ("back-to-back", _batch(1.0, 8, 0.85) + _batch(1.1207, 8, 0.86) + _batch(1.2414, 8, 0.87), 0.0007),
    # answers 0.2 ms apart are one batch, timed by its first: 3 rows = 62.86 ms, + 0.5 ms
    ("staggered", _batch(1.0, 2, 0.9, 0.0002) + _batch(1.0 + SECONDS[2] + 0.0005, 3, 0.95, 0.0002), 0.0005),
    # the second batch's request came after the first was answered: the replica was idle, and
    # the 90.7 ms between the answers is not a batch's latency
    ("idle-between", _batch(1.0, 1, 0.95) + _batch(1.0907, 1, 1.05), None),
    # sent 1 ms before the answer, within the 2 ms path: it may have reached the replica after it
    # freed, so it is left out
    ("inside-the-path", _batch(1.0, 1, 0.95) + _batch(1.0412, 1, 0.999), None),
    # the median of 0.3, 0.7 and 0.9 ms
    ("median", _batch(1.0, 1, 0.9) + _batch(1.0403, 1, 0.91) + _batch(1.0810, 1, 0.92) + _batch(1.1219, 1, 0.93),
     0.0007),
    ("one-batch", _batch(1.0, 8, 0.9), None),
]


@pytest.mark.parametrize("requests,expected", [c[1:] for c in OVERHEAD_CASES], ids=[c[0] for c in OVERHEAD_CASES])
def test_batch_overhead(requests, expected):
    sent, latency = [r[0] for r in requests], [r[1] for r in requests]
    got = batch_overhead_s(sent, latency, SECONDS)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-9)


def test_batch_overhead_refuses_unpaired_lists():
    with pytest.raises(ValueError, match="2 sends and 1 latencies"):
        batch_overhead_s([0.0, 0.1], [0.04], SECONDS)


def test_the_simulated_profile_carries_the_overhead():
    assert sim_profile(PROFILE, 2.0).latency_ms == ((1, 40.0), (8, 120.0))
    (b1, ms1), (b8, ms8) = sim_profile(PROFILE, 2.0, 0.0007).latency_ms
    assert (b1, b8) == (1, 8) and (ms1, ms8) == pytest.approx((40.7, 120.7))
    with pytest.raises(ValueError, match="overhead_s"):
        sim_profile(PROFILE, 2.0, -0.001)


def test_the_overhead_measured_from_a_simulated_run_is_the_one_it_ran_with(tmp_path, monkeypatch):
    """Forty requests held through a 2 s cold start run as five batches of 8 back to back, each
    0.7 ms over the profile's 120 ms: the answers' spacing gives 0.7 ms back, and without the
    overhead 0."""
    from loadtests.bench import simlive

    path = tmp_path / "window.csv"
    path.write_text(csv_text([0.001 * k for k in range(40)]))
    window = simlive.Window(path, 10.0, 40, "test", 1.0, 1.0)
    data_path = simlive.live_data_path()
    for overhead in (0.0007, 0.0):
        answers = []

        class Watch(data_path):
            def _serve_batches(self, *args):
                out = super()._serve_batches(*args)
                answers.extend(zip(out[4].tolist(), out[1].tolist()))  # (arrival, latency) of those run
                return out

        monkeypatch.setattr(simlive, "live_data_path", lambda *_, W=Watch: W)
        record = simlive.sim_run("ray", window, 2.0, overhead_s=overhead)
        assert record["served"] == 40 and len(answers) == 40
        got = batch_overhead_s([a for a, _ in answers], [lat for _, lat in answers], SECONDS)
        assert got == pytest.approx(overhead, abs=1e-9)


@pytest.mark.parametrize("flag", ["--overhead-ms", "--path-ms"])
@pytest.mark.parametrize("value", ["-0.5", "nan"])
def test_a_bad_overhead_or_path_is_refused_before_any_run(flag, value, capsys):
    from loadtests.bench import simlive

    assert simlive.main([flag, value, "--sim-only"]) == 2
    assert flag in capsys.readouterr().err


PATH_CASES = [
    # id, requests as (sent, latency), expected path (s) or None, against 40.7 ms alone
    # the docstring's: three alone, 42.3, 42.5 and 42.6 ms: median 42.5 - 40.7
    ("alone", [(0.0, 0.0423), (1.0, 0.0425), (2.0, 0.0426)], 0.0018),
    # the second is sent before the first is answered: neither is alone; the third is
    ("overlapping", [(0.0, 0.0423), (0.02, 0.0600), (2.0, 0.0426)], 0.0019),
    # a request sent before an earlier, longer one is answered is not alone, though the one
    # just before it was answered: 0.0 is answered at 0.5, 0.1 at 0.1423, 0.2 comes in between
    ("a-long-one-still-out", [(0.0, 0.5), (0.1, 0.0423), (0.2, 0.0425)], None),
    ("none", [], None),
]


@pytest.mark.parametrize("requests,expected", [c[1:] for c in PATH_CASES], ids=[c[0] for c in PATH_CASES])
def test_request_path(requests, expected):
    got = request_path_s([t for t, _ in requests], [lat for _, lat in requests], 0.0407)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-9)


def test_request_path_refuses_unpaired_lists():
    with pytest.raises(ValueError, match="1 sends and 2 latencies"):
        request_path_s([0.0], [0.04, 0.05], 0.0407)


def test_the_path_measured_from_a_simulated_run_is_the_one_it_ran_with(tmp_path, monkeypatch):
    """A request at 0 s, held through a 2 s cold start, then one every half second from 5 s,
    each alone: their latencies less the batch of one (40.7 ms, at the 0.7 ms overhead given)
    give the path the simulator ran with back (1.8 ms), and without a path 0. The replica's
    time is not the path's: ray's one replica stays busy 40.7 ms a request either way."""
    from loadtests.bench import simlive

    times = [0.0] + [5.0 + 0.5 * k for k in range(20)]
    path = tmp_path / "window.csv"
    path.write_text(csv_text(times))
    window = simlive.Window(path, 20.0, len(times), "test", 1.0, 1.0)
    data_path = simlive.live_data_path  # the real one: monkeypatched below
    for path_s in (0.0018, 0.0):
        latencies, busy = [], []

        class Watch(data_path(path_s)):
            def _account(self, f, latency, s, n_f):
                latencies.extend(latency.tolist())
                busy.extend(s.tolist())
                return super()._account(f, latency, s, n_f)

        monkeypatch.setattr(simlive, "live_data_path", lambda *_, W=Watch: W)
        record = simlive.sim_run("ray", window, 2.0, path_s=path_s, overhead_s=0.0007)
        assert record["served"] == len(times) and len(latencies) == len(times)
        assert request_path_s(times, latencies, 0.0407) == pytest.approx(path_s, abs=1e-9)
        assert busy[1:] == pytest.approx([0.0407] * 20)


def test_a_bad_path_is_refused():
    from loadtests.bench import simlive

    with pytest.raises(ValueError, match="path_s"):
        simlive.live_data_path(-0.001)


def test_the_path_read_from_a_live_report_folder(tmp_path):
    """live_path_s reads a report folder's requests.csv as the load test writes it (the
    locustfile's LOG_FIELDS, read from its source here: importing locust patches the process),
    keeps the answered (200) rows and measures against the profile's batch of one plus the
    serving overhead it is given (40 + 0.7 ms): three alone that took 42.3, 42.5 and 42.6 ms
    give 1.8 ms; against 40 + 1.3 ms, 1.2 ms. A
    503 in between, answered quickly, counts for nothing; a folder with no request alone gives
    None."""
    import csv

    from loadtests.bench.simlive import live_path_s

    fields = ("start", "scheduled", "latency_ms", "status", "function", "error", "cold_start")
    written = "LOG_FIELDS = (" + ", ".join(f'"{name}"' for name in fields) + ")"
    assert written in (Path(__file__).parents[2] / "loadtests" / "locustfile.py").read_text()

    def folder(name, rows):
        d = tmp_path / name
        d.mkdir()
        with (d / "requests.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(fields)
            for start, ms, status in rows:  # in the order of `fields`
                w.writerow([f"{start:.6f}", "", f"{ms:.3f}", status, "f", "", ""])
        return d

    alone = folder("alone", [(0.0, 42.3, "200"), (1.0, 42.5, "200"), (1.5, 1.0, "503"), (2.0, 42.6, "200")])
    assert live_path_s(alone, overhead_s=0.0007) == pytest.approx(0.0018, abs=1e-9)
    assert live_path_s(alone, overhead_s=0.0013) == pytest.approx(0.0012, abs=1e-9)
    overlapping = folder("overlapping", [(0.0, 500.0, "200"), (0.1, 42.3, "200"), (0.2, 42.5, "200")])
    assert live_path_s(overlapping) is None


def test_the_phase_sweep_runs_each_phase_and_gives_the_spread(tmp_path, monkeypatch):
    """--phases 4: sim_run at phases 0, 0.25, 0.5 and 0.75 with the live run's cold start and
    tick; the ranges are those of the four runs."""
    from loadtests.bench import simlive

    window = simlive.Window(tmp_path / "window.csv", 4.0, 3, "test", 1.0, 1.0)
    calls = []

    def fake(policy, w, cold, phase=0.0, **run):
        calls.append((policy, cold, phase, run["tick_s"]))
        return {"slo_attainment": 1.0 - phase / 10, "replica_slice_seconds": 100.0 + 40 * phase, "replica_starts": 2}

    monkeypatch.setattr(simlive, "sim_run", fake)
    sweep = simlive.phase_sweep("shoal", window, 2.07, 4, tick_s=1.0005, overhead_s=0.0007, path_s=0.0018)
    assert calls == [("shoal", 2.07, p, 1.0005) for p in (0.0, 0.25, 0.5, 0.75)]
    assert sweep["slo"] == pytest.approx((0.925, 1.0)) and sweep["slice_seconds"] == pytest.approx((100.0, 130.0))
    assert [r["phase"] for r in sweep["runs"]] == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="at least 1"):
        simlive.phase_sweep("shoal", window, 2.07, 0)


def test_a_negative_phase_count_is_refused(capsys):
    from loadtests.bench import simlive

    assert simlive.main(["--phases", "-1", "--sim-only"]) == 2
    assert "--phases" in capsys.readouterr().err


def test_initial_replicas_start_the_simulator_warm(tmp_path):
    """--initial 1: the simulator's function starts with one replica ready (live, the load
    begins once the initial replica is), so the window's first requests wait for no cold start
    (2 s, ten times the 200 ms SLO); from zero both of the first second's miss it."""
    from loadtests.bench import simlive

    path = tmp_path / "window.csv"
    path.write_text(csv_text([0.0, 0.3, 5.0]))
    window = simlive.Window(path, 8.0, 3, "test", 1.0, 1.0)
    cold = simlive.sim_run("shoal", window, 2.0)
    warm = simlive.sim_run("shoal", window, 2.0, initial=1)
    assert cold["served"] == warm["served"] == 3
    assert cold["slo_attainment"] == pytest.approx(1 / 3) and warm["slo_attainment"] == 1.0


def test_initial_replicas_in_the_commands_and_a_negative_count_refused(tmp_path, capsys):
    from loadtests.bench import simlive

    args = simlive.build_parser().parse_args(["--policies", "shoal", "--initial", "1", "--compress", "1"])
    args.policies = ["shoal"]
    window = simlive.Window(tmp_path / "window.csv", 60.0, 3, "test", 1.0, 1.0)
    lines = simlive.commands(args, window, tmp_path)
    assert "--initial 1" in lines[0] and "--initial 1 " in lines[1] and "--from-zero" not in lines[1]
    assert "1 replica(s) ready at the start" in lines[2]
    assert simlive.main(["--initial", "-1", "--sim-only"]) == 2
    assert "--initial" in capsys.readouterr().err


def test_a_live_folder_says_how_it_was_started(tmp_path):
    """started_with: the --initial a live run was deployed with (live_run writes simlive.json);
    a folder without one is of a run from zero, made before --initial existed."""
    from loadtests.bench import simlive

    assert simlive.started_with(tmp_path) == 0
    (tmp_path / "simlive.json").write_text('{"policy": "shoal", "initial": 2}\n')
    assert simlive.started_with(tmp_path) == 2


def test_another_profile_and_trace_are_in_the_commands(tmp_path):
    from loadtests.bench import simlive

    profile = simlive.ROOT / "functions" / "examples" / "emulated_resnet.yaml"
    trace = tmp_path / "steady.csv"
    args = simlive.build_parser().parse_args(["--policies", "shoal", "--profile", str(profile), "--trace", str(trace)])
    args.policies = ["shoal"]
    window = simlive.Window(tmp_path / "window.csv", 60.0, 3, "test", 1.0, 1.0)
    lines = simlive.commands(args, window, tmp_path)
    assert f"--profile {profile}" in lines[0] and f"--trace {trace}" in lines[0]
    assert "shoal deploy functions/examples/emulated_resnet.yaml " in lines[1] and "--batch 32 " in lines[1]
    plain = simlive.build_parser().parse_args(["--policies", "shoal"])
    plain.policies = ["shoal"]
    default = simlive.commands(plain, window, tmp_path)
    assert "--profile" not in default[0] and "emulated_code.yaml" in default[1]


def test_the_deploy_before_the_load_sets_the_simulators_first_look(tmp_path, monkeypatch):
    """A live run records its deploy (simlive.json's deployed_at, on requests.t0's clock);
    deployed_before_s is the load's start less it, and sim_run's first look at the function is
    the deploy itself, as the deploy pokes the live loop. Phase 0.3: the simulator's ticks at 0
    and 1 s with the arrivals 0.7 s later, so the load's start is its 0.7. Deployed 1.5 s before
    the load: a first look at 0.7 - 1.5 = -0.8, before the simulator's first tick; 0.5 s before:
    at 0.2, before the request at 0.7 pokes; no deploy recorded: at 0."""
    from loadtests.bench import simlive

    path = tmp_path / "window.csv"
    path.write_text(csv_text([0.0, 0.9, 2.5]))
    window = simlive.Window(path, 4.0, 3, "test", 1.0, 1.0)
    (tmp_path / "requests.t0").write_text("1000.0\n")
    assert simlive.deployed_before_s(tmp_path) is None  # a run that recorded no deploy
    (tmp_path / "simlive.json").write_text('{"policy": "shoal", "initial": 0, "deployed_at": 998.5}\n')
    assert simlive.deployed_before_s(tmp_path) == pytest.approx(1.5)
    firsts = []

    class Watch(simlive.live_data_path()):
        def _settle(self, fid, snapshot, decision, now):
            firsts.append(now)
            return super()._settle(fid, snapshot, decision, now)

    monkeypatch.setattr(simlive, "live_data_path", lambda *_: Watch)
    for before, first in ((1.5, -0.8), (0.5, 0.2), (None, 0.0)):
        firsts.clear()
        simlive.sim_run("shoal", window, 2.0, phase=0.3, deployed_s=before)
        assert firsts[0] == pytest.approx(first), before


def test_the_poke_lag_is_timed_from_the_runs_looks_from_zero(tmp_path):
    """live_poke_lag_s: each scale event from zero that records its look (after_look_s) against
    the first request sent since the function was last at zero. A look 3.4 ms after the request
    at 100.0 and one 10.0 ms after the first request since the drop at 140 (150.0): median 6.7 ms.
    Left out: an event with no look recorded (a run before it), and a pre-warm at 200 that no
    request came before (the next, at 300.0, comes after its look)."""
    from loadtests.bench import simlive

    assert simlive.live_poke_lag_s(tmp_path) is None  # no run here
    rows = [(100.0, 0), (100.003, 1), (120.0, 2), (150.0, 3), (300.0, 4)]
    (tmp_path / "requests.csv").write_text("start,scheduled,latency_ms,status,function,error,cold_start\n" + "".join(
        f"{sent},{sent},50.0,200,code,,\n" for sent, _ in rows))

    def scale(at, before, to, after_look_s=None):
        data = {"from": before, "to": to, "reason": "R", "policy": "shoal"}
        if after_look_s is not None:
            data["after_look_s"] = after_look_s
        return {"at": at, "function": "code", "kind": "scale", "message": "", "data": data}

    events = [scale(100.0081, 0, 1, 0.0047), scale(140.0, 1, 0, 0.001), scale(150.012, 0, 2, 0.002),
              scale(160.0, 2, 0, 0.001), scale(200.0, 0, 1, 0.001), scale(210.0, 1, 0, 0.001),
              {"at": 299.0, "function": "code", "kind": "replica_ready", "message": "", "data": {}}]
    (tmp_path / "events.json").write_text(json.dumps(events))
    assert simlive.live_poke_lag_s(tmp_path) == pytest.approx(0.0067)
    events[0] = scale(100.0081, 0, 1)  # recorded no look: the one left is 10.0 ms
    (tmp_path / "events.json").write_text(json.dumps(events))
    assert simlive.live_poke_lag_s(tmp_path) == pytest.approx(0.010)
