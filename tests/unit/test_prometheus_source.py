"""Prometheus as the metrics source, without a Prometheus: recorded answers of its HTTP API
mapped to ReplicaStats (the pure half), the source's error handling over an httpx mock
transport, and the controller keeping its rates when two ticks see the same scrape.

recorded/ holds one real scrape, taken at a quiet moment by the integration test's
setup: a replica's /metrics page, and Prometheus 2.42's answer to `replica_query` for the
same replica (range selector, three scrapes one second apart, the last one = the page).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from autoscaler.replicas import Replica, ReplicaScaler
from autoscaler.sources.direct import ReplicaScrapes
from autoscaler.metrics import (
    ReplicaStat,
    advance_window,
    duty_cycle,
    histogram_delta,
    parse_replica_metrics,
    request_rate,
)
from autoscaler.placement import Inventory
from autoscaler.sources.promql import PrometheusSource, replica_query, stat_from_query
from deploy.local.server import build_parser, metrics_source_url

RECORDED = Path(__file__).parent / "recorded"
ANSWER = json.loads((RECORDED / "prometheus_replica_query.json").read_text())
PAGE = (RECORDED / "replica_metrics.txt").read_text()
LAST_SCRAPE = 1795323972.711  # the newest sample's timestamp in ANSWER


def _data(*series: dict) -> dict:
    return {"resultType": "matrix", "result": list(series)}


def _series(name: str, *values: tuple[float, str], **labels: str) -> dict:
    return {"metric": {"__name__": name, "instance": "127.0.0.1:9001", "job": "shoal", **labels},
            "values": [list(v) for v in values]}


# ---------------------------------------------------------------------- the pure mapping


def test_recorded_answer_maps_to_what_the_page_parses_to():
    stat = stat_from_query(ANSWER["data"], "digits-1")
    # recorded before the query took the batch-size histogram's count and sum along: the
    # page has them, the answer does not (test_batch_series_are_read covers them)
    page = dataclasses.replace(parse_replica_metrics(PAGE, "digits-1", at=LAST_SCRAPE), batches=0.0, batch_rows=0.0)
    assert stat == page
    # the numbers of that scrape, as a reader would check them on the page
    assert (stat.completed, stat.errors, stat.busy_s) == (654.0, 0.0, 0.10972575002597296)
    assert stat.latency_buckets[-1] == (math.inf, 654.0) and len(stat.latency_buckets) == 16
    assert [le for le, _ in stat.latency_buckets] == sorted(le for le, _ in stat.latency_buckets)


def test_the_newest_scrape_time_is_at_not_the_evaluation_time():
    # the last of the three samples (…70.711, …71.711, …72.711) of each series
    assert stat_from_query(ANSWER["data"], "r").at == LAST_SCRAPE


T0, T1 = 1000.0, 1001.0


@pytest.mark.parametrize("data, expected", [
    pytest.param(_data(), None, id="empty result: not scraped yet or gone"),
    pytest.param({}, None, id="no result key"),
    pytest.param(_data(_series("shoal_replica_inflight")), None, id="a series without samples"),
    pytest.param(
        _data(_series("shoal_replica_requests_total", (T1, "90"), code="200"),
              _series("shoal_replica_requests_total", (T1, "4"), code="404"),
              _series("shoal_replica_requests_total", (T1, "5"), code="500"),
              _series("shoal_replica_requests_total", (T1, "1"), code="503")),
        # completed = 90 + 4 + 5 + 1 = 100; errors = 5xx only = 5 + 1 = 6
        ReplicaStat("r", T1, completed=100.0, errors=6.0), id="codes summed, errors are 5xx"),
    pytest.param(
        _data(_series("shoal_replica_inflight", (T0, "7"), (T1, "3")),
              _series("shoal_replica_queued", (T1, "1")),
              _series("shoal_replica_busy_seconds_total", (T0, "1.5"), (T1, "2.25")),
              _series("shoal_replica_model_load_seconds", (T1, "0.5")),
              _series("shoal_replica_stalled_seconds", (T0, "0"), (T1, "4.5"))),
        ReplicaStat("r", T1, inflight=3.0, queued=1.0, busy_s=2.25, model_load_s=0.5, stalled_s=4.5),
        id="gauges and busy seconds take the newest sample"),
    pytest.param(
        _data(_series("shoal_replica_inflight", (T1, "NaN")),
              _series("shoal_replica_busy_seconds_total", (T1, "NaN")),
              _series("shoal_replica_model_load_seconds", (T1, "NaN")),
              _series("shoal_replica_requests_total", (T1, "NaN"), code="200"),
              _series("shoal_replica_requests_total", (T1, "8"), code="500")),
        # a NaN sample is absent: inflight and busy_s default to 0, model_load_s to None
        ReplicaStat("r", T1, completed=8.0, errors=8.0), id="NaN samples count as absent"),
    pytest.param(
        _data(_series("shoal_replica_request_duration_seconds_bucket", (T1, "10"), le="+Inf"),
              _series("shoal_replica_request_duration_seconds_bucket", (T1, "9"), le="0.1"),
              _series("shoal_replica_request_duration_seconds_bucket", (T1, "4"), le="0.01")),
        ReplicaStat("r", T1, latency_buckets=((0.01, 4.0), (0.1, 9.0), (math.inf, 10.0))),
        id="buckets sorted by le, +Inf last"),
    pytest.param(
        _data(_series("shoal_replica_request_duration_seconds_bucket", (T1, "9"), le="0.1"),
              _series("shoal_replica_request_duration_seconds_bucket", (T1, "4"), le="0.01"),
              _series("shoal_replica_inflight", (T1, "2"))),
        ReplicaStat("r", T1, inflight=2.0), id="no +Inf bucket: histogram dropped (it holds the total)"),
    pytest.param(
        _data(_series("shoal_replica_request_duration_seconds_bucket", (T1, "10"), le="+Inf"),
              _series("shoal_replica_request_duration_seconds_bucket", (T1, "NaN"), le="0.1"),
              _series("shoal_replica_request_duration_seconds_bucket", (T1, "4"), le="0.01")),
        ReplicaStat("r", T1, latency_buckets=((0.01, 4.0), (math.inf, 10.0))),
        id="a NaN bucket is a missing bucket; the rest still make a histogram"),
    pytest.param(
        _data(_series("shoal_replica_requests_total", (T0, "50"), code="200"),
              _series("shoal_replica_requests_total", (T0, "3"), code="500"),
              _series("shoal_replica_requests_total", (T0, "60"), (T1, "61"), code="200", replica="new")),
        # only the newest scrape is the replica's page now: 61, not 61 + 50 + 3
        ReplicaStat("r", T1, completed=61.0), id="series of an older scrape are not on the page any more"),
])
def test_stat_from_query(data, expected):
    assert stat_from_query(data, "r") == expected


@pytest.mark.parametrize("instance, lookback_s, expected", [
    pytest.param("127.0.0.1:9001", 60.0, '{__name__=~"shoal_replica_(requests_total|request_duration_seconds_bucket|'
                 'inflight|queued|busy_seconds_total|model_load_seconds|stalled_seconds|batch_size_count|batch_size_sum|batch_probe_seconds)",instance="127.0.0.1:9001"}[60000ms]',
                 id="one selector for every series"),
    pytest.param('a"b', 0.0001, '{__name__=~"shoal_replica_(requests_total|request_duration_seconds_bucket|'
                 'inflight|queued|busy_seconds_total|model_load_seconds|stalled_seconds|batch_size_count|batch_size_sum|batch_probe_seconds)",instance="a\\"b"}[1ms]',
                 id="quotes escaped, at least 1 ms"),
])
def test_replica_query(instance, lookback_s, expected):
    assert replica_query(instance, lookback_s) == expected


# ---------------------------------------------------------------------- the source, over a mock transport


def _scrape(handler) -> ReplicaStat | None:
    async def run():
        source = PrometheusSource("http://prom:9090/", transport=httpx.MockTransport(handler))
        try:
            return await source.scrape("digits-1", "127.0.0.1", 52445, at=5.0)
        finally:
            await source.close()

    return asyncio.run(run())


def test_scrape_asks_one_instant_query_and_maps_the_answer():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ANSWER)

    stat = _scrape(handler)
    assert stat == stat_from_query(ANSWER["data"], "digits-1") and stat.at == LAST_SCRAPE  # not the 5.0 passed in
    assert len(seen) == 1 and seen[0].url.path == "/api/v1/query"
    assert seen[0].url.params["query"] == replica_query("127.0.0.1:52445", 60.0)


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.mark.parametrize("handler", [
    pytest.param(_refused, id="Prometheus down"),
    pytest.param(lambda r: httpx.Response(503, text="Service Unavailable"), id="503 with a text body"),
    pytest.param(lambda r: httpx.Response(400, json={"status": "error", "errorType": "bad_data",
                                                     "error": "parse error"}), id="400 bad_data"),
    pytest.param(lambda r: httpx.Response(200, json={"status": "error", "error": "odd"}), id="200 but status error"),
    pytest.param(lambda r: httpx.Response(200, json=["not", "an", "object"]), id="200 with a list"),
    pytest.param(lambda r: httpx.Response(200, json={"status": "success", "data": _data()}), id="no sample"),
])
def test_scrape_failures_read_as_not_scraped(handler):
    assert _scrape(handler) is None


def test_scrape_failure_is_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="shoal.prometheus"):
        _scrape(_refused)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "digits-1" in caplog.records[0].getMessage()


def test_lookback_must_be_positive():
    with pytest.raises(ValueError, match=r"lookback_s \(0\) must be > 0"):
        PrometheusSource("http://prom:9090", lookback_s=0)


# ---------------------------------------------------------------------- two ticks, one scrape


A = ReplicaStat("r", 10.0, completed=100.0, busy_s=1.0)
B = ReplicaStat("r", 25.0, completed=400.0, busy_s=7.0)
C = ReplicaStat("r", 40.0, completed=550.0, busy_s=10.0)


@pytest.mark.parametrize("window, stat, expected", [
    pytest.param([], A, [A], id="first scrape"),
    pytest.param([A], B, [A, B], id="second scrape"),
    pytest.param([A, B], C, [B, C], id="a newer scrape slides the window"),
    pytest.param([A, B], B, [A, B], id="the same scrape again keeps the window"),
    pytest.param([A, B], replace(B, at=20.0), [A, B], id="an older scrape keeps the window"),
    pytest.param([A], A, [A], id="the first scrape again"),
])
def test_advance_window(window, stat, expected):
    assert advance_window(window, stat) == expected


INF = float("inf")


@pytest.mark.parametrize("prev, cur, expected", [
    pytest.param(None, ((0.1, 90.0), (INF, 100.0)), ((0.1, 90.0), (INF, 100.0)), id="first reading: all of it"),
    # 93 - 90 = 3 at or under 0.1 s, 104 - 100 = 4 in all
    pytest.param(((0.1, 90.0), (INF, 100.0)), ((0.1, 93.0), (INF, 104.0)), ((0.1, 3.0), (INF, 4.0)), id="the gain"),
    pytest.param(((0.1, 90.0), (INF, 100.0)), ((0.1, 90.0), (INF, 100.0)), ((0.1, 0.0), (INF, 0.0)), id="none since"),
    pytest.param(((INF, 5.0),), ((0.1, 1.0), (INF, 2.0)), ((0.1, 1.0), (INF, 2.0)), id="other bounds: all of it"),
])
def test_histogram_delta(prev, cur, expected):
    assert histogram_delta(prev, cur) == expected


def test_rates_over_zero_seconds_are_zero_not_a_division_by_zero():
    assert duty_cycle(B, B) == 0.0 and request_rate(B, B) == 0.0


class _Sequence:
    """A MetricsSource that answers the given stats in turn, as Prometheus would between scrapes."""

    def __init__(self, *stats: ReplicaStat):
        self.stats = list(stats)

    async def scrape(self, replica, host, port, at):
        return self.stats.pop(0)


class _IdleRouter:
    def outstanding(self, function):
        return 0

    def inflight_seconds(self, function):
        return 0.0, 0.0  # no integral: the reading takes the count now (outstanding)

    def held(self, function):
        return 0

    def latencies(self):
        return {}


def test_controller_keeps_the_last_rates_while_prometheus_has_not_scraped_again():
    # scrapes at 10 and 25, four ticks: 10, 25, 25 again, 40
    source = _Sequence(A, B, B, C)
    router = _IdleRouter()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    controller = ReplicaScrapes(scaler, source, router)
    scaler.replicas["r"] = Replica("r", "f", 1, placement=None, state="ready",
                                       handle=SimpleNamespace(host="127.0.0.1", port=1))

    def tick(now):
        return asyncio.run(controller.snapshot("f", now))

    assert tick(1.0).duty == ()
    second = tick(2.0)
    # A -> B: (7 - 1) busy s / 15 s = 0.4 duty; (400 - 100) / 15 s = 20 requests/s
    assert second.duty == pytest.approx((0.4,)) and second.rps == pytest.approx(20.0)
    assert second.window_s == 15.0
    again = tick(3.0)
    assert (again.duty, again.rps, again.service_s) == (second.duty, second.rps, second.service_s)
    assert again.window_s == 0.0  # the same window read again: no new measurement of the rate
    third = tick(4.0)
    # B -> C: (10 - 7) / 15 = 0.2 duty; (550 - 400) / 15 = 10 requests/s
    assert third.duty == pytest.approx((0.2,)) and third.rps == pytest.approx(10.0) and third.window_s == 15.0


def test_a_look_between_ticks_leaves_a_replicas_scrape_window_where_it_was():
    # scrapes at 10 (a tick), 25 (a poked look) and 40 (the next tick): the poked look reads A -> B
    # and no window of its own (window_s 0); the tick then reads A -> C, its whole window, not B -> C
    router = _IdleRouter()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    controller = ReplicaScrapes(scaler, _Sequence(A, B, C), router)
    scaler.replicas["r"] = Replica("r", "f", 1, placement=None, state="ready",
                                   handle=SimpleNamespace(host="127.0.0.1", port=1))

    def look(now, between_ticks):
        return asyncio.run(controller.reading("f", now, between_ticks=between_ticks)).snapshot

    look(1.0, False)
    poked = look(2.0, True)
    assert poked.rps == pytest.approx(20.0) and poked.window_s == 0.0  # A -> B, read, not a new window
    tick = look(3.0, False)
    # A -> C: (10 - 1) busy s / 30 s = 0.3 duty; (550 - 100) / 30 s = 15 requests/s
    assert tick.duty == pytest.approx((0.3,)) and tick.rps == pytest.approx(15.0) and tick.window_s == 30.0


# ---------------------------------------------------------------------- shoal up options


@pytest.mark.parametrize("argv, expected", [
    pytest.param([], None, id="direct by default"),
    pytest.param(["--metrics-source", "prometheus", "--prometheus-url", "http://127.0.0.1:9090"],
                 "http://127.0.0.1:9090", id="prometheus"),
])
def test_metrics_source_options(argv, expected):
    args = build_parser().parse_args(argv)
    assert metrics_source_url(args.metrics_source, args.prometheus_url) == expected


@pytest.mark.parametrize("source, url, message", [
    pytest.param("prometheus", None, "--metrics-source prometheus needs --prometheus-url", id="no url"),
    pytest.param("direct", "http://p:9090", r"--prometheus-url \(http://p:9090\) is only read with", id="url unused"),
    pytest.param("prometheus", "p:9090", r"--prometheus-url \(p:9090\) must start with http", id="no scheme"),
])
def test_metrics_source_options_refused(source, url, message):
    with pytest.raises(ValueError, match=message):
        metrics_source_url(source, url)


def test_batch_series_are_read():
    """The batch-size histogram's count and sum become the stat's batches and rows."""
    data = _data(_series("shoal_replica_batch_size_count", (100.0, "40")),
                 _series("shoal_replica_batch_size_sum", (100.0, "190")),
                 _series("shoal_replica_busy_seconds_total", (100.0, "0.2")))
    stat = stat_from_query(data, "r")
    assert (stat.batches, stat.batch_rows, stat.busy_s) == (40.0, 190.0, 0.2)
    assert "batch_size_count" in replica_query("127.0.0.1:9001", 60) and "batch_size_sum" in replica_query(
        "127.0.0.1:9001", 60)


def test_a_look_between_ticks_reads_the_windows_without_ending_them():
    """Held requests poke looks between ticks (MetricsSource.read's between_ticks); those read
    the gateway's windows so far and leave them open, so the next tick still reads a whole tick.
    A backlog released at 11.05 s, 45 requests in flight to 11.2 s: 6.75 request-seconds. The
    tick at 11.2 reads them over the 1.2 s since the tick at 10.0 (5.625 in flight), not over the
    0.3 s since a poke at 10.9 (22.5, nearly the count). Ten requests answered at 2.5 s before
    the poke and ten at 40 ms after: the tick's p95 is of all twenty (the slow ones' bucket),
    not of the ten fast ones alone."""
    class Router(_IdleRouter):
        def __init__(self):
            self.area, self.at, self.count, self.hist = 0.0, 10.0, 0, ()

        def inflight_seconds(self, function):
            return self.area, self.at

        def outstanding(self, function):
            return self.count

        def latencies(self):
            return {"f": self.hist}

    router = Router()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    scrapes = ReplicaScrapes(scaler, _Sequence(), router)

    def look(area, at, hist, between_ticks):
        router.area, router.at, router.hist = area, at, hist
        return asyncio.run(scrapes.reading("f", at, between_ticks=between_ticks)).snapshot

    look(0.0, 10.0, ((0.05, 0.0), (2.5, 0.0), (math.inf, 0.0)), False)  # a tick
    poked = look(0.0, 10.9, ((0.05, 0.0), (2.5, 10.0), (math.inf, 10.0)), True)
    assert poked.inflight == 0.0 and poked.p95_s is not None and poked.p95_s > 0.05  # it reads the window so far
    tick = look(6.75, 11.2, ((0.05, 10.0), (2.5, 20.0), (math.inf, 20.0)), False)
    assert tick.inflight == pytest.approx(6.75 / 1.2)
    assert tick.p95_s is not None and tick.p95_s > 0.05
    # the tick ended the windows: the next one reads from 11.2 (nothing answered since)
    after = look(7.75, 12.2, ((0.05, 20.0), (2.5, 20.0), (math.inf, 20.0)), False)
    assert after.inflight == pytest.approx(1.0) and after.p95_s is None


def test_the_controllers_in_flight_is_the_gateways_average_since_its_last_reading():
    """A snapshot's in-flight is the growth of the gateway's integral over the time between two
    readings (InFlight): 0.9 request-seconds over 1.5 s is 0.6 in flight, whatever the count at
    that instant (3). A first reading, a second at the same instant, or one after the gateway
    forgot the function (its integral started over) takes the count now."""
    class Router(_IdleRouter):
        def __init__(self):
            self.area, self.at, self.count = 0.0, 10.0, 3

        def inflight_seconds(self, function):
            return self.area, self.at

        def outstanding(self, function):
            return self.count

    router = Router()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    scrapes = ReplicaScrapes(scaler, _Sequence(), router)

    def inflight(area: float, at: float) -> float:
        router.area, router.at = area, at
        return asyncio.run(scrapes.snapshot("f", at)).inflight

    assert inflight(0.0, 10.0) == 3.0  # first reading: the count now
    assert inflight(0.9, 11.5) == pytest.approx(0.6)
    assert inflight(0.9, 12.0) == 0.0  # nothing in flight for 0.5 s
    assert inflight(0.9, 12.0) == 3.0  # no time between: the count
    router.count = 1
    assert inflight(0.1, 13.0) == 1.0  # forgotten and begun again: smaller


def test_slice_window_option_sets_the_shoal_policys_window():
    """`shoal up --slice-window-s 20`: the shoal policy averages duty over 20 s before it asks
    another slice; by default it keeps PolicyConfig's 300 s."""
    from autoscaler.policies import policy_named

    assert policy_named("shoal", build_parser().parse_args([]).slice_window_s).config.slice_window_s == 300.0
    args = build_parser().parse_args(["--slice-window-s", "20"])
    assert policy_named(args.policy, args.slice_window_s).config.slice_window_s == 20.0


@pytest.mark.parametrize("policy, window, message", [
    pytest.param("kpa", 20.0, "applies to the shoal policy, not 'kpa'", id="a baseline"),
    pytest.param("shoal", 0.0, r"slice_window_s \(0.0\) must be > 0", id="zero"),
    pytest.param("knative", None, "policy 'knative' is not one of shoal, kpa, ray", id="unknown policy"),
])
def test_slice_window_option_refused(policy, window, message):
    from autoscaler.policies import policy_named

    with pytest.raises(ValueError, match=message):
        policy_named(policy, window)
