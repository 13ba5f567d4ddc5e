"""The frontier bench (loadtests/bench/frontier.py): when a peer's setting beats Shoal, on made-up
figures; its grid and names; simulate()'s extra policies, whose frozen settings give the tuned
peers' own runs; and one small run end to end (the bench's quick gamma-cv1, a smaller grid)."""

from __future__ import annotations

import json

import pytest

from autoscaler.baselines import tuned
from autoscaler.simulator import SimConfig, kpa_tuned_policy, simulate
from loadtests.bench import frontier
from loadtests.bench.policy import traces
from tests.fakes.pool import InProcessPool

SHOAL = {"slo_attainment": 0.999, "replica_slice_seconds": 100.0}


def point(slo: float, cost: float) -> dict:
    return {"slo_attainment": slo, "replica_slice_seconds": cost}


@pytest.mark.parametrize("setting, beaten", [
    pytest.param(point(0.999, 99.0), True, id="cheaper at the same SLO"),
    pytest.param(point(0.9995, 100.0), True, id="a better SLO at the same cost"),
    pytest.param(point(1.0, 50.0), True, id="better in both"),
    pytest.param(point(0.999, 100.0), False, id="the same in both: a tie"),
    pytest.param(point(1.0, 101.0), False, id="a better SLO, dearer"),
    pytest.param(point(0.998, 50.0), False, id="cheaper, a worse SLO"),
])
def test_a_setting_beats_shoal(setting, beaten):
    assert frontier.beats(setting, SHOAL) is beaten


def test_the_verdict_names_the_cheapest_as_good_and_the_best_within_cost():
    settings = {"a": point(0.9995, 150.0), "b": point(0.9999, 120.0), "c": point(0.99, 80.0),
                "d": point(0.995, 100.0)}
    verdict = frontier.judge(SHOAL, settings)
    assert verdict == {"frontier": True, "beaten_by": [], "cheapest_as_good": "b", "best_within_cost": "d"}
    line = frontier.cell_line(SHOAL, settings, verdict)
    assert line == ("on the frontier; cheapest at Shoal's SLO or better: b at 1.20x Shoal's slice-s (99.990%); "
                    "best SLO at Shoal's slice-s or fewer: d 99.500%")
    settings["e"] = point(0.9992, 90.0)
    settings["f"] = point(0.9999, 95.0)
    verdict = frontier.judge(SHOAL, settings)
    assert verdict["beaten_by"] == ["e", "f"] and not verdict["frontier"]
    assert verdict["cheapest_as_good"] == "e" and verdict["best_within_cost"] == "f"
    assert frontier.cell_line(SHOAL, settings, verdict).startswith("beaten by 2; cheapest at Shoal's SLO or "
                                                                   "better: e at 0.90x")


def test_a_family_that_never_reaches_shoal_nor_costs_as_little():
    settings = {"a": point(0.99, 150.0), "b": point(0.995, 120.0)}
    verdict = frontier.judge(SHOAL, settings)
    assert verdict == {"frontier": True, "beaten_by": [], "cheapest_as_good": None, "best_within_cost": None}
    assert frontier.cell_line(SHOAL, settings, verdict) == (
        "on the frontier; no setting reaches Shoal's SLO (best 99.500%); every setting dearer")


def test_the_grid_holds_the_frozen_settings():
    (kpa,) = frontier.grid("kpa")
    assert list(kpa) == [f"kpa-tuned@{h:g}" for h in frontier.HEADROOMS]
    ray = frontier.grid("ray")
    assert len(ray) == len(frontier.RAY_DELAYS) and all(len(chunk) == len(frontier.HEADROOMS) for chunk in ray)
    names = {name for chunk in ray for name in chunk}
    assert f"kpa-tuned@{tuned.KPA_HEADROOM:g}" in kpa
    assert f"ray-tuned@{tuned.RAY_HEADROOM:g}/{tuned.RAY_DOWNSCALE_COLD_STARTS:g}" in names
    with pytest.raises(ValueError, match="unknown family 'hpa'"):
        frontier.grid("hpa")


def test_an_extra_policy_runs_as_a_named_one():
    (_, trace, profiles, cluster), = traces(True, 1, "gamma-cv1")
    (kpa,) = frontier.grid("kpa")
    ray = {name: make for chunk in frontier.grid("ray") for name, make in chunk.items()}
    result = simulate(trace, ["kpa-tuned", "ray-tuned"], cluster, seed=1, profiles=profiles,
                      extra={"kpa-tuned@0.05": kpa["kpa-tuned@0.05"], "kpa-tuned@0.01": kpa["kpa-tuned@0.01"],
                             "ray-tuned@0.2/100": ray["ray-tuned@0.2/100"]})
    runs = {name: {k: v for k, v in r.items() if k != "wall_s"} for name, r in result["policies"].items()}
    assert list(runs) == ["kpa-tuned", "ray-tuned", "kpa-tuned@0.05", "kpa-tuned@0.01", "ray-tuned@0.2/100"]
    # the frozen settings are the tuned peers, every figure but the wall time
    assert runs["kpa-tuned@0.05"] == runs["kpa-tuned"] and runs["ray-tuned@0.2/100"] == runs["ray-tuned"]
    # a fifth of the target per replica: more replicas (7,680 slice-s against 3,570, both at 100 %)
    assert runs["kpa-tuned@0.01"]["replica_slice_seconds"] > runs["kpa-tuned"]["replica_slice_seconds"]
    with pytest.raises(ValueError, match="'kpa' has the name of a built-in one"):
        simulate(trace, [], SimConfig(), extra={"kpa": lambda profiles: kpa_tuned_policy(profiles)})


def test_a_small_run_end_to_end(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(frontier, "traces", lambda quick, seed, names: traces(True, seed, names))
    monkeypatch.setattr(frontier, "ProcessPoolExecutor", InProcessPool)
    monkeypatch.setattr(frontier, "HEADROOMS", (0.05, 0.2))
    monkeypatch.setattr(frontier, "RAY_DELAYS", (100.0,))
    out = tmp_path / "frontier.json"
    assert frontier.main(["--seeds", "1", "--traces", "gamma-cv1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    cell = result["cells"]["gamma-cv1/1"]
    kpa, ray = cell["families"]["kpa"], cell["families"]["ray"]
    assert set(kpa["settings"]) == {"kpa", "kpa-tuned@0.05", "kpa-tuned@0.2"}
    assert set(ray["settings"]) == {"ray", "ray-tuned@0.05/100", "ray-tuned@0.2/100"}
    # each runs as the policy bench runs it: the same figures as simulate()'s own policies there
    (_, trace, profiles, cluster), = traces(True, 1, "gamma-cv1")
    bench = simulate(trace, ["shoal", "kpa", "kpa-tuned", "ray", "ray-tuned"], cluster, seed=1,
                     profiles=profiles)["policies"]
    figures = ("slo_attainment", "replica_slice_seconds")
    for name, ours in [("shoal", cell["shoal"]), ("kpa", kpa["settings"]["kpa"]),
                       ("kpa-tuned", kpa["settings"]["kpa-tuned@0.05"]), ("ray", ray["settings"]["ray"]),
                       ("ray-tuned", ray["settings"]["ray-tuned@0.2/100"])]:
        assert ours == {k: bench[name][k] for k in figures}, name
    for family in (kpa, ray):  # the verdicts are judge()'s on the figures written beside them
        verdict = frontier.judge(cell["shoal"], family["settings"])
        assert {k: family[k] for k in verdict} == verdict
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "" and lines[1].startswith("By the rule batcher; simulated")
    assert lines[3].startswith("== gamma-cv1/1: shoal ")
    on = sum(f["frontier"] for f in (kpa, ray))
    assert lines[-1] == (f"Shoal on the family's frontier in {on} of 2 (cell, family) pairs; "
                         f"on both in {int(on == 2)} of 1 cells")


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--traces", "gamma-cv9"], "unknown trace 'gamma-cv9'", id="an unknown trace"),
    pytest.param(["--seeds", "1,x"], "comma-separated whole numbers", id="a seed not a number"),
    pytest.param(["--workers", "0"], "--workers must be >= 1", id="no workers"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        frontier.main(argv)
    assert message in capsys.readouterr().err
