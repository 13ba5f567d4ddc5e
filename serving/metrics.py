"""The replica's Prometheus metrics (DESIGN.md section 5), in a registry of its own; the rate of
`shoal_replica_busy_seconds_total` (the executor's busy time) is the slice's duty cycle, and that
of `shoal_replica_inflight_seconds_total` the time-averaged requests inside it (`InFlight`, the
integral the gateway keeps of each function's requests in flight too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily

from autoscaler.metrics import LATENCY_BUCKETS_S  # the bounds the controller reads p95 in: one place

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(eq=False, slots=True)
class InFlight:
    """Requests in flight (a function's, sent by the gateway to its replicas; a replica's, inside
    it) and their integral over time in request-seconds, kept up to date at each change. A
    reader's average concurrency over a span is the integral's growth over it divided by its
    length: time-weighted, as Knative's queue-proxy reports concurrency (pkg/queue/stats.go,
    network.RequestStats: the time spent at each concurrency, averaged at each report), not a
    count at one instant. E.g. one request for 0.4 s of a 1 s span, then two for 0.2 s:
    (0.4 + 0.4) / 1 = 0.8."""

    count: int = 0
    area_s: float = 0.0  # request-seconds up to `at`
    at: float = 0.0

    def change(self, by: int, now: float) -> None:
        self.area_s += self.count * max(0.0, now - self.at)
        self.at = max(self.at, now)
        self.count += by

    def area(self, now: float) -> float:
        """Request-seconds up to `now`."""
        return self.area_s + self.count * max(0.0, now - self.at)


class ReplicaMetrics:
    def __init__(self, function: str, labels: dict[str, str], clock: Callable[[], float] = time.monotonic):
        disable_created_metrics()  # the *_created series only double the scrape
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.function = function
        self.requests = Counter(
            "shoal_replica_requests", "Requests answered, by status code", ["function", "code"], registry=r
        )
        self.request_duration = Histogram(
            "shoal_replica_request_duration_seconds", "Time from request received to response ready",
            ["function"], buckets=LATENCY_BUCKETS_S, registry=r,
        ).labels(function)
        self.queue_duration = Histogram(
            "shoal_replica_queue_duration_seconds", "Time a request waited for its batch to start",
            ["function"], buckets=LATENCY_BUCKETS_S, registry=r,
        ).labels(function)
        self.batch_size = Histogram(
            "shoal_replica_batch_size", "Rows per executed batch", ["function"], buckets=BATCH_BUCKETS, registry=r,
        ).labels(function)
        self._clock = clock
        self.inside = InFlight(at=clock())  # the count, and its integral: the integral's rate is the time average
        Gauge(
            "shoal_replica_inflight", "Requests inside the replica (queued or running)", ["function"], registry=r,
        ).labels(function).set_function(lambda: self.inside.count)
        r.register(_Collector("shoal_replica_inflight_seconds", "Request-seconds inside the replica; rate = "
                              "time-averaged requests inside", function, lambda: self.inside.area(self._clock())))
        self.queued = Gauge(
            "shoal_replica_queued", "Requests waiting for a batch", ["function"], registry=r,
        ).labels(function)
        self._busy_source = lambda: 0.0
        r.register(_Collector("shoal_replica_busy_seconds", "Seconds the slice's executor spent running the model; "
                              "rate = duty cycle", function, lambda: self._busy_source()))
        self.model_load = Gauge(
            "shoal_replica_model_load_seconds", "Seconds the model took to load and warm up", ["function"], registry=r,
        ).labels(function)
        # one batch of 1 row and one of the largest, timed on zeros before the replica was ready
        # (DataPlane._probe): how a batch grows, for the controller (metrics.seed_batch_latency)
        self._probe = Gauge(
            "shoal_replica_batch_probe_seconds", "Seconds a batch of this many rows of zeros took at load",
            ["function", "rows"], registry=r,
        )
        self.ready = Gauge(
            "shoal_replica_ready", "1 when the model is loaded and serving", ["function"], registry=r,
        ).labels(function)
        self.stalled = Gauge(
            "shoal_replica_stalled_seconds", "How long the model call running now has run (0 when idle)",
            ["function"], registry=r,
        ).labels(function)
        info = Gauge(
            "shoal_replica_info", "The replica's slice and device (emulated devices say so)",
            ["function", *labels], registry=r,
        )
        info.labels(function, *labels.values()).set(1)
        # the success series exists from the start, at 0: Prometheus' rate() drops what a series
        # counted before its first scrape, so one created at the first request would read low
        self._codes: dict[int, Counter] = {200: self.requests.labels(function, "200")}

    def probed(self, rows: int, seconds: float) -> None:
        self._probe.labels(self.function, str(rows)).set(seconds)

    def enter(self) -> None:
        """A request is inside the replica (queued or running) from now."""
        self.inside.change(+1, self._clock())

    def leave(self) -> None:
        self.inside.change(-1, self._clock())

    def track_busy(self, source) -> None:
        """Export `source()` (the executor's busy seconds) as shoal_replica_busy_seconds_total."""
        self._busy_source = source

    def count(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.requests.labels(self.function, str(code))
        child.inc()


class _Collector:
    """A counter read from `source` at scrape time (e.g. shoal_replica_busy_seconds_total, the
    executor's busy seconds)."""

    def __init__(self, name: str, doc: str, function: str, source):
        self.name, self.doc, self.function, self.source = name, doc, function, source

    def collect(self):
        family = CounterMetricFamily(self.name, self.doc, labels=["function"])
        family.add_metric([self.function], self.source())
        yield family

    def describe(self):
        return list(self.collect())
