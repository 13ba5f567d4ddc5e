"""The replica's Prometheus metrics (DESIGN.md section 5), in a registry of its own; the rate of
`shoal_replica_busy_seconds_total` (the executor's busy time) is the slice's duty cycle.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily

from autoscaler.metrics import LATENCY_BUCKETS_S  # the bounds the controller reads p95 in: one place

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ReplicaMetrics:
    def __init__(self, function: str, labels: dict[str, str]):
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
        self.inflight = Gauge(
            "shoal_replica_inflight", "Requests inside the replica (queued or running)", ["function"], registry=r,
        ).labels(function)
        self.queued = Gauge(
            "shoal_replica_queued", "Requests waiting for a batch", ["function"], registry=r,
        ).labels(function)
        self._busy_source = lambda: 0.0
        r.register(_BusyCollector(function, lambda: self._busy_source()))
        self.model_load = Gauge(
            "shoal_replica_model_load_seconds", "Seconds the model took to load", ["function"], registry=r,
        ).labels(function)
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

    def track_busy(self, source) -> None:
        """Export `source()` (the executor's busy seconds) as shoal_replica_busy_seconds_total."""
        self._busy_source = source

    def count(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.requests.labels(self.function, str(code))
        child.inc()


class _BusyCollector:
    """shoal_replica_busy_seconds_total, read from the executor at scrape time."""

    def __init__(self, function: str, source):
        self.function = function
        self.source = source

    def collect(self):
        family = CounterMetricFamily(
            "shoal_replica_busy_seconds", "Seconds the slice's executor spent running the model; rate = duty cycle",
            labels=["function"],
        )
        family.add_metric([self.function], self.source())
        yield family

    def describe(self):
        return list(self.collect())
