"""Prometheus as the controller's metrics source: one PromQL query per replica.

On a cluster the controller does not scrape pods; it asks the Prometheus that
already scrapes them (HTTP API, `/api/v1/query`). `PrometheusSource` implements
the controller's `MetricsSource`; `stat_from_query` is its pure half (the JSON
answer to a ReplicaStat), mapped exactly as `parse_replica_metrics` maps a
replica's own exposition: request counts summed over codes, errors = 5xx, the
latency buckets sorted by `le` with +Inf last.

Which time a stat carries: the query is a range selector over the last
`lookback_s` (`{...}[60s]`), which answers with the raw samples and the time
Prometheus scraped them, not with the evaluation time an instant vector carries.
`at` is that scrape time (unix seconds), so a rate between two stats divides the
counters' growth by the time that really passed between the two scrapes, whatever
the delay between a scrape and the controller's query. Two ticks that see the same
scrape get the same `at`: the controller then keeps the last window's rates (see
`autoscaler.metrics.advance_window`) rather than dividing by zero seconds.

Imports nothing from deploy or serving; the I/O is httpx only.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx

from autoscaler.metrics import ReplicaStat, cumulative_histogram

log = logging.getLogger("shoal.prometheus")

REQUESTS = "shoal_replica_requests_total"
BUCKETS = "shoal_replica_request_duration_seconds_bucket"
GAUGES = {  # metric name -> ReplicaStat field
    "shoal_replica_inflight": "inflight",
    "shoal_replica_queued": "queued",
    "shoal_replica_busy_seconds_total": "busy_s",
    "shoal_replica_model_load_seconds": "model_load_s",
    "shoal_replica_stalled_seconds": "stalled_s",
    "shoal_replica_batch_size_count": "batches",
    "shoal_replica_batch_size_sum": "batch_rows",
}
NAMES = (REQUESTS, BUCKETS, *GAUGES)


def replica_query(instance: str, lookback_s: float) -> str:
    """Every series the controller needs from one replica, with their raw samples.
    E.g. {__name__=~"shoal_replica_(requests_total|...)",instance="127.0.0.1:9001"}[60s]."""
    suffixes = "|".join(name.removeprefix("shoal_replica_") for name in NAMES)
    escaped = instance.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{__name__=~"shoal_replica_({suffixes})",instance="{escaped}"}}[{_duration(lookback_s)}]'


def _duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (2.42 takes no fractions): 60 -> 60000ms."""
    return f"{max(1, round(seconds * 1000))}ms"


def stat_from_query(data: dict[str, Any], replica: str) -> ReplicaStat | None:
    """The ReplicaStat in the `data` of a successful answer to `replica_query`; None when
    Prometheus holds no sample of the replica (not scraped yet, or gone).

    Only series sampled by the newest scrape count, as only they are on the replica's
    page now (an older series is one the replica stopped exporting, or a replica that
    had the same address before). NaN samples are treated as absent: a NaN counter
    would make every rate NaN. A histogram without its +Inf bucket is dropped, since
    `quantile()` reads the total count from the last bucket.
    """
    latest = [(series["metric"], series["values"][-1]) for series in data.get("result", []) if series.get("values")]
    if not latest:
        return None
    at = max(float(sample[0]) for _, sample in latest)
    fields: dict[str, float] = {}
    completed = errors = 0.0
    buckets: list[tuple[float, float]] = []
    for labels, (ts, text) in latest:
        value = float(text)
        if float(ts) != at or math.isnan(value):
            continue
        name = labels.get("__name__", "")
        if name == REQUESTS:
            completed += value
            if labels.get("code", "").startswith("5"):
                errors += value
        elif name == BUCKETS and "le" in labels:
            buckets.append((float(labels["le"]), value))
        elif name in GAUGES:
            fields[GAUGES[name]] = value
    return ReplicaStat(replica=replica, at=at, completed=completed, errors=errors,
                       latency_buckets=cumulative_histogram(buckets), **fields)


class PrometheusSource:
    """The controller's MetricsSource, read from Prometheus instead of the replicas.

    A replica is the series whose `instance` label is its host:port (Prometheus' default
    for a static or file_sd target). Prometheus unreachable, or an answer other than
    success, reads as "not scraped" (None), logged at debug like a failed direct scrape.
    """

    probes = False  # no sample yet says nothing about the replica: liveness is not judged by it

    def __init__(self, url: str, lookback_s: float = 60.0, timeout_s: float = 1.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        if lookback_s <= 0:
            raise ValueError(f"lookback_s ({lookback_s}) must be > 0: it must cover at least one scrape interval")
        self.url = url.rstrip("/")
        self.lookback_s = lookback_s
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)

    async def scrape(self, replica: str, host: str, port: int, at: float) -> ReplicaStat | None:
        """`at` (the controller's clock) is not used: the stat carries Prometheus' scrape time."""
        query = replica_query(f"{host}:{port}", self.lookback_s)
        try:
            response = await self._client.get(f"{self.url}/api/v1/query", params={"query": query})
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("Prometheus query for %s at %s failed: %s", replica, self.url, exc)
            return None
        if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            log.debug("Prometheus answered %s for %s: %s", response.status_code, replica,
                      body.get("error") if isinstance(body, dict) else body)
            return None
        return stat_from_query(body.get("data") or {}, replica)

    async def close(self) -> None:
        await self._client.aclose()
