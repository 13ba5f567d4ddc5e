"""The ticks' phase bench (loadtests/bench/phase.py) on a small trace: Shoal alone at each shift of
its arrivals, the rows and the summary line it prints, and its refusals."""

from __future__ import annotations

import json

import pytest

from loadtests.bench import phase
from loadtests.bench.policy import traces


@pytest.fixture
def small(monkeypatch):
    """The bench's quick gamma-cv1 in place of the named trace (a smoke run's size)."""
    monkeypatch.setattr(phase, "traces", lambda quick, seed, name: traces(True, seed, "gamma-cv1"))


def test_each_shift_runs_the_same_traffic_at_another_phase(small, tmp_path, capsys):
    out = tmp_path / "phase.json"
    assert phase.main(["gamma-cv4-40", "--seed", "3", "--shifts-ms", "0,10", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["shift_ms"] for r in rows] == [0.0, 10.0]
    assert all(0.0 <= r["slo"] <= 1.0 and r["slice_s"] > 0 for r in rows)
    # 10 ms later the same traffic: the requests counted (those after the warm-up) differ only by
    # those the shift moves past the trace's end or into the count from the warm-up's last 10 ms
    assert rows[0]["requests"] != rows[1]["requests"]
    assert abs(rows[0]["requests"] - rows[1]["requests"]) < 0.001 * rows[0]["requests"]
    printed = capsys.readouterr().out
    assert "shifted 10 ms:" in printed and "points, mean" in printed


@pytest.mark.parametrize("shifts", ["", "a,b", "-1", "1000"])
def test_bad_shifts_are_refused(shifts, capsys):
    with pytest.raises(SystemExit):
        phase.main(["real-1x", "--shifts-ms", shifts])
    assert "--shifts-ms" in capsys.readouterr().err
