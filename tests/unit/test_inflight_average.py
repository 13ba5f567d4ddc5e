"""In flight as a time average: the integral (`serving.metrics.InFlight`) the gateway keeps for
each function and each replica exports as `shoal_replica_inflight_seconds_total`, whose growth
over a span divided by its length is the span's average concurrency, as Knative's queue-proxy
reports it (pkg/queue/stats.go), where a gauge read at one instant gives whatever is in flight
then."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from serving.metrics import InFlight, ReplicaMetrics


def test_the_integral_weights_each_count_by_the_time_it_lasted():
    sent = InFlight(at=10.0)
    sent.change(+1, 10.0)  # one from 10.0
    sent.change(+1, 10.4)  # two from 10.4
    sent.change(-2, 10.6)  # none from 10.6
    assert sent.area(11.0) == pytest.approx(0.4 + 2 * 0.2)  # 0.8 over [10, 11]: 0.8 on average
    assert sent.count == 0
    sent.change(+1, 11.0)
    assert sent.area(11.5) - sent.area(11.0) == pytest.approx(0.5)  # still in flight: counted up to now


def test_a_replica_exports_its_request_seconds_inside_as_a_counter():
    clock = [100.0]
    m = ReplicaMetrics("f", {}, clock=lambda: clock[0])
    m.enter()  # 100.0
    clock[0] = 100.5
    m.enter()
    clock[0] = 101.0
    m.leave()
    clock[0] = 101.5
    m.leave()
    clock[0] = 102.0  # idle for 0.5 s

    def scraped() -> float:
        line = next(x for x in generate_latest(m.registry).decode().splitlines()
                    if x.startswith('shoal_replica_inflight_seconds_total{function="f"}'))
        return float(line.split()[-1])

    # 0.5 s at one, 0.5 s at two, 0.5 s at one, 0.5 s at none: 2.0 request-seconds over 2 s,
    # 1.0 in flight on average; the gauge, read at 102.0, says 0
    assert scraped() == pytest.approx(2.0)
    assert 'shoal_replica_inflight{function="f"} 0.0' in generate_latest(m.registry).decode()
