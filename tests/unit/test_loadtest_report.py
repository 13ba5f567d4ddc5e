"""loadtests/report.py: every chart over time shares one axis, the run's start to its end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtests import analysis, report
from tests.unit.test_loadtest_analysis import requests, sample

SECONDS = 30


def a_run() -> tuple[dict, dict]:
    """30 s of one request a second; samples from 1 s before the schedule to 1 s after the last answer;
    the one replica is scaled to zero at 20 s, so its duty samples end there."""
    req = requests([(i + 0.1, 20.0, 200, "f") for i in range(SECONDS)])
    samples = [sample(t, [("f-1", "ready", "1/4", "cpu:0")] if t < 20 else []) for t in range(-1, SECONDS + 2)]
    ts = analysis.timeseries(req, np.ones(SECONDS, int), samples, duration_s=SECONDS, slo_ms={"f": 100.0})
    s = {"scale_decisions": [{"t": 20.0, "kind": "scale", "from": 1, "to": 0, "reason": "TO_ZERO"}],
         "cold_starts": {"replica_starts": []}, "errors_by_status": {}, "title": "spike"}
    return s, ts


def test_the_time_axis_is_the_runs_start_to_its_end():
    _, ts = a_run()
    assert ts["seconds"] == SECONDS and report.time_axis(ts) == (0.0, 30.0)


def test_every_chart_over_time_has_the_same_x_range(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    limits: dict[str, list[tuple[float, float]]] = {}
    real = Figure.savefig

    def recording(fig, path, **kw):
        limits[path.stem] = [ax.get_xlim() for ax in fig.axes if ax.get_xlabel() == "seconds since start"]
        return real(fig, path, **kw)

    monkeypatch.setattr(Figure, "savefig", recording)
    s, ts = a_run()
    charts = report.draw(tmp_path, s, ts, other=(s, ts))
    assert set(charts) == {"latency", "throughput", "replicas", "duty", "compare"}
    # before: latency (0, 30); throughput auto-scaled to (-1.45, 30.45); replicas and compare to
    # (-2.6, 32.6), from the sample before the schedule to the one after the last answer, with margins;
    # the duty heatmap (-0.5, 19.5), ending at its last sample
    assert limits == {name: [(0.0, 30.0)] for name in charts}


def test_duty_grid_has_one_column_per_second_of_the_run():
    duty = {"f-2": {"t": [5.2, 6.2], "duty": [0.5, None]},
            "f-1": {"t": [-0.6, 0.4, 0.9, 29.9, 30.4], "duty": [0.9, 0.1, 0.2, 0.3, 0.4]}}
    ids, grid = report.duty_grid(duty, 30)
    assert ids == ["f-1", "f-2"] and grid.shape == (2, 30)
    # f-1: -0.6 is before the run and 30.4 after it (left out); 0.4 and 0.9 share second 0 (the last wins)
    assert grid[0, 0] == 0.2 and grid[0, 29] == 0.3 and np.isnan(grid[0, 1:29]).all()
    # f-2: 5.2 in second 5; at 6.2 it had no duty (None)
    assert grid[1, 5] == 0.5 and np.count_nonzero(~np.isnan(grid[1])) == 1


@pytest.mark.parametrize("values, xs, ys", [
    ([3, 1, 2], [0, 1, 2, 3], [3, 1, 2, 2]),  # the last second, [2, 3), drawn whole
    ([], [0], [0]),
], ids=["three-seconds", "empty"])
def test_per_second_steps_end_at_the_end_of_their_last_second(values, xs, ys):
    x, y = report._seconds(values)
    assert x.tolist() == xs and y.tolist() == ys and not any(map(math.isnan, y))


def test_cold_starts_are_raises_from_zero_and_replica_starts_are_counted_apart():
    """One meaning of a cold start live and in the simulator: a function raised from zero replicas
    (the control plane's shoal_scale_from_zero_total); a scale-out's replica starts are not cold starts."""
    starts = [{"t": t, "replica": f"f-{i}", "spawn_s": 0.1, "load_s": 2.0, "ready_s": 2.1}
              for i, t in enumerate((1.0, 1.0, 15.0), start=1)]  # 2 from zero at 1 s, 1 scale-out at 15 s
    c = {"count": 1, "replica_starts": starts, "requests_held": 4, "worst_wait_ms": 2150.0,
         "phases_max_s": {}, "phases_mean_s": {}}
    text = report._cold({"cold_starts": c})
    assert text.startswith("<p>1 cold start(s), each a function raised from zero replicas; 3 replica start(s)")


def test_two_runs_slice_seconds_are_compared_by_one_measure():
    # both counted: the counts; one of them sampled only (recorded before the count): both sampled
    counted = {"replica_slice_seconds": 490.8, "replica_slice_seconds_source": "allocator",
               "replica_slice_seconds_sampled": 530.1}
    old = {"replica_slice_seconds": 546.7}
    assert report._same_measure(counted, dict(counted, replica_slice_seconds=500.0)) == (490.8, 500.0)
    assert report._same_measure(counted, old) == (530.1, 546.7)
    assert report._same_measure(old, counted) == (546.7, 530.1)
