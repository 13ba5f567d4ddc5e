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


@pytest.mark.parametrize("shifts, message", [
    pytest.param("", "comma-separated numbers", id="none"),
    pytest.param("a,b", "comma-separated numbers", id="not numbers"),
    pytest.param("-1", "each must be >= 0 and under 1000", id="negative"),
    pytest.param("1000", "each must be >= 0 and under 1000", id="a whole tick"),
])
def test_bad_shifts_are_refused(small, shifts, message, capsys):
    with pytest.raises(SystemExit):
        phase.main(["gamma-cv4-40", "--shifts-ms", shifts])
    assert message in capsys.readouterr().err
