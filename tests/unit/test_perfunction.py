"""loadtests.bench.perfunction: Shoal's slice-seconds and late requests on a trace of the bench, per
function, add up to what the bench counts for the whole run, every function counted on the same
ticks."""

from __future__ import annotations

import pytest

from loadtests.bench import perfunction


def test_the_functions_slice_seconds_add_up_to_the_runs():
    result, rows = perfunction.per_function("gamma-cv1", 1)
    assert len(rows) == 8 and all(r.shoal_slice_s > 0 and r.oracle_slice_s > 0 for r in rows)
    # the bench charges a replica from its start; this counts the ones alive at each tick's look
    assert sum(r.shoal_slice_s for r in rows) == pytest.approx(result["replica_slice_seconds"], rel=0.01)
    ticks = {sum(r.over.values()) for r in rows}  # every function looked at on every tick counted
    assert len(ticks) == 1 and ticks.pop() > 0


def test_the_functions_late_requests_add_up_to_the_runs_misses():
    """The saturated cluster (its misses by function), at seed 1: every request answered but not
    within its SLO is one function's late one."""
    result, rows = perfunction.per_function("saturated", 1)
    within = round(result["slo_attainment"] * result["requests"])
    assert sum(r.late for r in rows) == result["served"] - within > 0
