"""The first-call bench (loadtests/bench/firstcall.py) on the digits ONNX model: fresh processes
with and without the warm-up, each timing its calls, and the line it prints."""

from __future__ import annotations

import json

import pytest

from loadtests.bench import firstcall


def test_the_bench_loads_in_fresh_processes_with_and_without_the_warm_up(tmp_path, monkeypatch, capsys):
    from functions.examples.digits import build_digits_onnx

    monkeypatch.setattr(firstcall, "build", lambda folder, device: {"digits.onnx": build_digits_onnx(folder / "d.onnx")})
    out = tmp_path / "firstcall.json"
    assert firstcall.main(["--rounds", "1", "--calls", "4", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["results"]["digits.onnx"]
    (cold,), (warm,) = runs["cold"], runs["warm"]
    assert cold["warm_up"] == "not run" and cold["warm_s"] == 0.0
    assert warm["warm_up"] == "warmed up on zeros (X [1, 64]) x1" and warm["warm_s"] > 0.0
    assert len(cold["calls_s"]) == len(warm["calls_s"]) == 4 and min(cold["calls_s"] + warm["calls_s"]) > 0.0
    printed = capsys.readouterr().out
    assert "digits.onnx: without the warm-up: load" in printed and "first call without / with:" in printed


def test_the_bench_refuses_too_few_calls(capsys):
    with pytest.raises(SystemExit):
        firstcall.main(["--calls", "3"])
    assert "--calls must be at least 4" in capsys.readouterr().err
