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
    assert {r["policy"] for r in rows} == {"shoal"}  # the default: Shoal alone
    printed = capsys.readouterr().out
    assert "shifted 10 ms:" in printed and "points, mean" in printed
    assert "Shoal alone" in printed and " shoal:" not in printed


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


def test_policies_run_side_by_side_on_each_shift(small, tmp_path, capsys):
    out = tmp_path / "phase.json"
    assert phase.main(["real-4x", "--shifts-ms", "0,5", "--policies", "shoal,static", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["policies"] == ["shoal", "static"]
    rows = data["rows"]
    assert [(r["policy"], r["shift_ms"]) for r in rows] == [("shoal", 0.0), ("static", 0.0), ("shoal", 5.0),
                                                              ("static", 5.0)]
    # both on the same arrivals at each shift
    assert rows[0]["requests"] == rows[1]["requests"] and rows[2]["requests"] == rows[3]["requests"]
    printed = capsys.readouterr().out
    assert " shoal:" in printed and " static:" in printed and printed.count("points, mean") == 2


def test_summary_works_out_the_range_and_means():
    rows = [{"slo": 0.99, "slice_s": 100.0}, {"slo": 0.995, "slice_s": 120.0}]
    # SLO 99.0 and 99.5 %: range 0.5, mean 99.25; slice-s 100 and 120: 1.2x, mean 110
    assert phase.summary(rows) == ("SLO 99.000-99.500 % (range 0.500 points, mean 99.250); "
                                   "slice-s 100.0-120.0 (1.200x, mean 110.0)")


@pytest.mark.parametrize("policies", [pytest.param("", id="none"), pytest.param("shoal,knative", id="unknown")])
def test_unknown_policies_are_refused(small, policies, capsys):
    with pytest.raises(SystemExit):
        phase.main(["real-4x", "--policies", policies])
    err = capsys.readouterr().err
    assert "unknown; expected comma-separated names of shoal" in err
    assert ("'knative'" in err) == ("knative" in policies)  # the one not known is named


def test_a_csv_runs_as_the_real_traces_cell(tmp_path, capsys):
    """`csv --path F --compress X`: the real trace's cell (its profile and cluster) on F's
    arrivals, compressed X times."""
    arrivals = tmp_path / "arrivals.csv"
    stamps = [f"2023-11-16 18:00:{s:02d}.{ms:03d}0000,1,1" for s in range(0, 40) for ms in (0, 250, 500)]
    arrivals.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(stamps) + "\n")
    out = tmp_path / "phase.json"
    assert phase.main(["csv", "--path", str(arrivals), "--compress", "0.5", "--seed", "1", "--shifts-ms", "0",
                       "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["trace"] == "arrivals.csv compressed 0.5x"
    # 3 a second for 40 s, stretched 2x (0.5x) to 80 s; the warm-up (60 s) not counted: the
    # arrivals of 30.0-39.5 s, at 60-79 s: 30
    assert data["rows"][0]["requests"] == 30 and data["rows"][0]["slo"] == 1.0
    assert "arrivals.csv compressed 0.5x" in capsys.readouterr().out
    # the real trace's cell: its profile and cluster, these arrivals
    name, options, config = phase.real_scenario(arrivals, 0.5)
    assert (name, options["path"], options["compress"]) == ("real-0.5x", str(arrivals), 0.5)
    real = {n: (o, c) for n, o, c in phase.scenarios(False)}
    if "real-4x" in real:  # ../shared beside the checkout
        assert real["real-4x"][1] == config and real["real-4x"][0]["profile"] == options["profile"]


@pytest.mark.parametrize("argv, message", [
    pytest.param(["csv"], "--path is for the trace csv, and csv needs it", id="csv without a path"),
    pytest.param(["gamma-cv4-40", "--path", "x.csv"], "--path is for the trace csv, and csv needs it",
                 id="a path elsewhere"),
    pytest.param(["gamma-cv4-40", "--compress", "4"], "--compress is for the trace csv", id="compress elsewhere"),
    pytest.param(["csv", "--path", "/nonexistent.csv"], "no such file", id="no file"),
])
def test_csv_arguments_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        phase.main(argv)
    assert message in capsys.readouterr().err


def test_a_csv_compressed_by_nothing_is_refused(tmp_path, capsys):
    arrivals = tmp_path / "a.csv"
    arrivals.write_text("TIMESTAMP\n2023-11-16 18:00:00.0\n2023-11-16 18:00:01.0\n")
    with pytest.raises(SystemExit):
        phase.main(["csv", "--path", str(arrivals), "--compress", "0"])
    assert "--compress 0.0: must be > 0" in capsys.readouterr().err
