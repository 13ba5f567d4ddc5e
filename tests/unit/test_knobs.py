"""The knob bench (loadtests/bench/knobs.py): its settings' parsing and refusals, the four clauses
against the defaults on made-up figures, and one small run end to end (the bench's quick
gamma-cv1 in place of its traces)."""

from __future__ import annotations

import json

import pytest

from loadtests.bench import knobs
from loadtests.bench.policy import traces
from tests.fakes.pool import InProcessPool


@pytest.mark.parametrize("text, expected", [
    pytest.param("sdd15=scale_down_delay_s:15", ("sdd15", {"scale_down_delay_s": 15.0}), id="one knob"),
    pytest.param("two=max_duty:0.95,burst_window_s:3", ("two", {"max_duty": 0.95, "burst_window_s": 3.0}),
                 id="two knobs"),
    pytest.param("bcw=budget_clean_windows:20", ("bcw", {"budget_clean_windows": 20}), id="a whole number"),
])
def test_a_setting_is_parsed(text, expected):
    name, over = knobs.parse_setting(text)
    assert (name, over) == expected
    assert all(type(v) is type(expected[1][k]) for k, v in over.items())


@pytest.mark.parametrize("text, message", [
    pytest.param("scale_down_delay_s:15", "NAME=knob:value", id="no name"),
    pytest.param("=max_duty:0.9", "NAME=knob:value", id="an empty name"),
    pytest.param("defaults=max_duty:0.8", "the bench's own", id="the defaults' name"),
    pytest.param("peers=max_duty:0.8", "the bench's own", id="the peers' name"),
    pytest.param("x=scale_down_delay_s", "has no ':value'", id="no value"),
    pytest.param("x=no_such_knob:1", "is not a knob", id="unknown knob"),
    pytest.param("x=kept_s:1", "is not a knob", id="a derived field"),
    pytest.param("x=max_duty:0.8,max_duty:0.95", "max_duty set twice", id="a knob twice"),
    pytest.param("x=max_duty:hot", "is not a number", id="not a number"),
    pytest.param("x=budget_clean_windows:2.5", "takes whole numbers", id="a fraction of a whole number"),
    pytest.param("x=slice_hints:0", "is a switch", id="a switch"),
    pytest.param("x=max_duty:1.5", "max_duty", id="refused by PolicyConfig"),
])
def test_a_bad_setting_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        knobs.parse_setting(text)


PEERS = {("a", 3): {"kpa-tuned": {"slo": 0.99, "slice_s": 100.0}, "ray-tuned": {"slo": 0.98, "slice_s": 90.0}},
         ("b", 3): {"kpa-tuned": {"slo": 1.0, "slice_s": 50.0}, "ray-tuned": {"slo": 1.0, "slice_s": 50.0}},
         ("real-1x", 3): {"kpa-tuned": {"slo": 0.9, "slice_s": 1.0}, "ray-tuned": {"slo": 0.9, "slice_s": 1.0}}}


def test_score_counts_the_synthetic_cells_and_leaves_out_the_named():
    shoal = {("a", 3): {"slo": 0.9995, "slice_s": 80.0},  # at the bar, under both peers: dominates
             ("b", 3): {"slo": 0.97, "slice_s": 40.0},  # cheaper, but not as good
             ("real-1x", 3): {"slo": 1.0, "slice_s": 0.5}}  # not judged
    s = knobs.score(shoal, PEERS, leave_out=set())
    assert s == {"at_bar": 1, "dominates": 1, "mean_slo_pct": pytest.approx((99.95 + 97.0) / 2), "slice_s": 120.0}
    s = knobs.score(shoal, PEERS, leave_out={("b", 3)})
    assert (s["mean_slo_pct"], s["slice_s"]) == (pytest.approx(99.95), 80.0)


def test_score_leaves_the_counts_whole_and_ties_do_not_dominate():
    shoal = {("a", 3): {"slo": 0.9995, "slice_s": 80.0}, ("b", 3): {"slo": 1.0, "slice_s": 50.0}}
    s = knobs.score(shoal, PEERS, leave_out={("a", 3)})
    # ("a", 3) still counts at the bar and as dominating; ("b", 3) ties on slice-seconds: no
    assert (s["at_bar"], s["dominates"], s["mean_slo_pct"], s["slice_s"]) == (2, 1, 100.0, 50.0)
    with pytest.raises(ValueError, match="every synthetic cell is left out"):
        knobs.score(shoal, PEERS, leave_out={("a", 3), ("b", 3)})


@pytest.mark.parametrize("text, expected", [
    pytest.param("", set(), id="none"),
    pytest.param("gamma-cv4-40:3, spike:4", {("gamma-cv4-40", 3), ("spike", 4)}, id="two, with a space"),
])
def test_cells_left_out_are_parsed(text, expected):
    assert knobs.parse_cells(text, [3, 4]) == expected


@pytest.mark.parametrize("text, message", [
    pytest.param("spike", "trace:seed", id="no seed"),
    pytest.param("spike:x", "trace:seed", id="not a seed"),
    pytest.param("no-such:3", "not a synthetic trace", id="unknown trace"),
    pytest.param("real-1x:3", "not a synthetic trace", id="the real trace"),
    pytest.param("spike:1", "seed 1 is not run", id="a seed not run"),
])
def test_bad_cells_left_out_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        knobs.parse_cells(text, [3, 4])


@pytest.mark.parametrize("candidate, expected", [
    pytest.param({"at_bar": 5, "dominates": 4, "mean_slo_pct": 98.99, "slice_s": 98.0}, [True] * 4,
                 id="the bounds: 0.01 points less, 2 % saved"),
    pytest.param({"at_bar": 5, "dominates": 4, "mean_slo_pct": 99.0, "slice_s": 98.0}, [True] * 4, id="passes"),
    pytest.param({"at_bar": 4, "dominates": 4, "mean_slo_pct": 99.0, "slice_s": 90.0}, [False, True, True, True],
                 id="one cell falls under 99.9 %"),
    pytest.param({"at_bar": 5, "dominates": 3, "mean_slo_pct": 99.0, "slice_s": 90.0}, [True, False, True, True],
                 id="one cell no longer dominates"),
    pytest.param({"at_bar": 5, "dominates": 4, "mean_slo_pct": 98.98, "slice_s": 90.0}, [True, True, False, True],
                 id="the mean falls 0.02 points"),
    pytest.param({"at_bar": 5, "dominates": 4, "mean_slo_pct": 99.5, "slice_s": 98.5}, [True, True, True, False],
                 id="saves 1.5 %"),
])
def test_the_four_clauses(candidate, expected):
    defaults = {"at_bar": 5, "dominates": 4, "mean_slo_pct": 99.0, "slice_s": 100.0}
    assert knobs.passes(candidate, defaults, slo_slack=0.01, min_saving=0.02) == expected


def test_a_small_run_end_to_end(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(knobs, "traces", lambda quick, seed: traces(True, seed, "gamma-cv1"))
    monkeypatch.setattr(knobs, "ProcessPoolExecutor", InProcessPool)
    out = tmp_path / "knobs.json"
    assert knobs.main(["--seeds", "3", "--set", "same=max_duty:0.9", "--set", "cold=max_duty:0.5",
                       "--leave-out", "", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # a setting equal to the default runs the same simulation; a lower duty ceiling holds more
    assert result["cells"]["same"] == result["cells"]["defaults"]
    assert result["scores"]["cold"]["slice_s"] > result["scores"]["defaults"]["slice_s"]
    assert result["passes"] == {"defaults": None, "same": False, "cold": False}
    assert set(result["peers"]["gamma-cv1:3"]) == {"kpa-tuned", "ray-tuned"}
    lines = capsys.readouterr().out.splitlines()
    same = next(line for line in lines if line.startswith("  same "))
    cold = next(line for line in lines if line.startswith("  cold "))
    assert "(1.000x)" in same and "clauses 123-: fails" in same
    # max_duty 0.5 holds more than the tuned peers there: it loses the cell it dominated, and saves nothing
    assert result["scores"]["defaults"]["dominates"] == 1 and result["scores"]["cold"]["dominates"] == 0
    assert "clauses 1-3-: fails" in cold
    assert lines[-1] == "  passing, least slice-seconds first: none"


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--seeds", "3"], "at least one setting", id="no setting"),
    pytest.param(["--set", "a=max_duty:0.8", "--set", "a=max_duty:0.7"], "each NAME once", id="a name twice"),
    pytest.param(["--set", "a=max_duty:0.8", "--leave-out", "spike:5"], "seed 5 is not run", id="a cell not run"),
    pytest.param(["--seeds", "3", "--set", "a=max_duty:0.8", "--leave-out",
                  ",".join(f"{n}:3" for n in knobs.synthetic_traces())],
                 "nothing would be judged", id="every cell left out"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        knobs.main(argv)
    assert message in capsys.readouterr().err

