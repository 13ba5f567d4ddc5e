"""Idle slices are lent, live: ten small functions on one emulated device of eight 1/8 slices, Zipf
popularity, an open loop of 10 requests/s for 30 s through `shoal up` and Locust. Every request
is answered, none refused for want of a slice while an idle replica held one, and each take-back
is an event and a count. Without take-back (`shoal up --no-take-back`) the same run refuses
requests with "cannot place" and this test fails."""

from __future__ import annotations

import httpx
import pytest

from loadtests.analysis import counter_totals
from loadtests.manyfunctions import Fleet, run
from tests.conftest import start_plane

pytestmark = pytest.mark.timeout(300)


def test_idle_slices_are_lent_to_the_functions_waiting_for_one(tmp_path):
    many_small_functions(tmp_path)


def many_small_functions(tmp_path, *up_args: str) -> dict:
    plane = start_plane(tmp_path / "state", "--devices", "emulated:1x80GiB", *up_args)
    try:
        # 10 functions x 1/8 > 8 slices; keep-alive 60 s outlasts the run, so idle replicas would keep theirs
        fleet = Fleet(count=10, slice="1/8", latency_ms=5.0, load_s=0.5, slo_ms=500.0, idle_to_zero_s=60.0)
        o = run(plane.url, plane.state_dir, tmp_path / "run", fleet, rate=10.0, duration_s=30.0, drain_s=30.0)
        with plane.client() as client:
            events: list[dict] = []
            while page := client.events(after=events[-1]["id"] if events else 0, limit=500):
                events += page
        metrics = counter_totals(httpx.get(f"{plane.url}/metrics", timeout=10).text, ("shoal_slice_takebacks_total",))
    finally:
        assert plane.stop() == 0
    assert o["requests"] > 200  # about 10/s for 30 s
    assert o["refused_503"] == 0, o["refused_why"]
    assert o["answered"] == o["requests"], o
    # more functions than slices: slices changed hands, each one said and counted
    takebacks = [e for e in events if e["kind"] == "takeback"]
    assert len(takebacks) == o["takebacks"] >= 1
    for e in takebacks:
        assert e["data"]["from"] != e["function"] and f"{e['function']} took emulated:0 slice 1/8 from" in e["message"]
    took = metrics["shoal_slice_takebacks_total"]
    assert sum(v for k, v in took.items() if dict(k)["role"] == "took") == len(takebacks)
    assert sum(v for k, v in took.items() if dict(k)["role"] == "gave") == len(takebacks)
    # no "cannot place" refused a request: a replica that could not be placed waited for a slice
    assert not [e for e in events if e["kind"] == "unplaceable" and not (e.get("data") or {}).get("waiting")]
    return o
