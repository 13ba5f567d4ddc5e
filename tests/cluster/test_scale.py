"""Issue 21, must-show 6, the bounded half: the controller's API requests per steady tick do not
grow with the number of functions (one list per kind per tick and the Lease, never a request per
function), against the real API server, read from its audit log by the controller's
ServiceAccount token. 20 against 200 functions, to stay quick; tests/cluster/bench_scale.py is
the benchmark (200 against 2,000 functions on 1,000 nodes, with tick times: docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from bench_scale import per_tick, run_one

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def _steady(run) -> dict:
    return {(verb, resource): mm for (verb, resource, code), mm in per_tick(run.steady).items()}


def test_requests_per_tick_do_not_grow_with_functions(cluster, tmp_path):
    small = run_one(cluster, 20, ticks=5, interval_s=0.2, tmp=tmp_path)
    large = run_one(cluster, 200, ticks=5, interval_s=0.2, tmp=tmp_path)
    try:
        for run in (small, large):
            # the first tick made every Deployment and Service; the next made nothing
            assert sum(t.applied for t in run.setup) == run.functions, [t.applied for t in run.setup]
            assert all(t.applied == 0 for t in run.steady)
            assert all(k[2] < 300 for t in run.steady for k in t.requests), run.steady[0].requests
        assert _steady(small) == _steady(large), (_steady(small), _steady(large))
        # what a steady tick is: the Lease twice (the tick's and apply's: read, then update), and
        # one list of each kind it reads
        assert _steady(large) == {("get", "leases"): (2, 2), ("update", "leases"): (2, 2),
                                  ("list", "configmaps"): (1, 1), ("list", "deployments"): (1, 1),
                                  ("list", "services"): (1, 1)}
    finally:
        for run in (small, large):
            cluster.kubectl_run("delete", "namespace", run.namespace, "--wait=false", check=False)
