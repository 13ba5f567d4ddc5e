"""Metrics through Prometheus's HTTP API (PromQL): one client (`PromQL`), two readers.

- `PrometheusSource`: shoal up's per-replica Scraper (`shoal up --metrics-source prometheus`): one
  range query per replica, mapped by `stat_from_query` exactly as `parse_replica_metrics` maps the
  replica's own page. A stat carries Prometheus's scrape time, not the query's, so a rate between
  two stats divides by the time that really passed between the two scrapes.
- `FunctionQueries`: the cluster's MetricsSource: `cluster_queries` (nine queries a tick, whatever
  the number of functions) mapped by `snapshot_from_results` (pure); Prometheus unreachable reads
  as no reading (every function keeps its count), not as zero load.

Imports neither deploy nor serving; the I/O is httpx only.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from typing import Any, Awaitable, Callable

import httpx

from autoscaler.loop import Fleet, Reading
from autoscaler.metrics import (
    ReplicaStat,
    batch_window,
    cumulative_histogram,
    fraction_over,
)
from autoscaler.snapshot import MetricsSnapshot
from functions.spec import FunctionSpec

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
PROBE = "shoal_replica_batch_probe_seconds"  # by rows: ReplicaStat.probe
NAMES = (REQUESTS, BUCKETS, *GAUGES, PROBE)


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
    probe: list[tuple[float, float]] = []
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
        elif name == PROBE and "rows" in labels:
            probe.append((float(labels["rows"]), value))
        elif name in GAUGES:
            fields[GAUGES[name]] = value
    return ReplicaStat(replica=replica, at=at, completed=completed, errors=errors,
                       latency_buckets=cumulative_histogram(buckets), probe=tuple(sorted(probe)), **fields)


class PromQLError(RuntimeError):
    """Prometheus answered, but not with a successful query result."""


class PromQL:
    """Instant queries against Prometheus's HTTP API (`/api/v1/query`)."""

    def __init__(self, url: str, timeout_s: float = 1.0, transport: httpx.AsyncBaseTransport | None = None):
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)

    async def query(self, promql: str) -> dict[str, Any]:
        """The `data` of a successful answer; raises httpx.HTTPError or PromQLError."""
        response = await self._client.get(f"{self.url}/api/v1/query", params={"query": promql})
        try:
            body = response.json()
        except ValueError:
            body = response.text[:200]
        if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            raise PromQLError(f"Prometheus answered {response.status_code}: "
                              f"{body.get('error', body) if isinstance(body, dict) else body}")
        return body.get("data") or {}

    async def vector(self, promql: str) -> list[dict[str, Any]]:
        """The `data.result` of an instant query."""
        return (await self.query(promql)).get("result") or []

    async def close(self) -> None:
        await self._client.aclose()


class PrometheusSource:
    """shoal up's Scraper, read from Prometheus instead of the replicas.

    A replica is the series whose `instance` label is its host:port (Prometheus' default
    for a static or file_sd target). Prometheus unreachable, or an answer other than
    success, reads as "not scraped" (None), logged at debug like a failed direct scrape.
    """

    probes = False  # no sample yet says nothing about the replica: liveness is not judged by it

    def __init__(self, url: str, lookback_s: float = 60.0, timeout_s: float = 1.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        if lookback_s <= 0:
            raise ValueError(f"lookback_s ({lookback_s}) must be > 0: it must cover at least one scrape interval")
        self.promql = PromQL(url, timeout_s, transport)
        self.lookback_s = lookback_s

    async def scrape(self, replica: str, host: str, port: int, at: float) -> ReplicaStat | None:
        """`at` (the controller's clock) is not used: the stat carries Prometheus' scrape time."""
        try:
            data = await self.promql.query(replica_query(f"{host}:{port}", self.lookback_s))
        except (httpx.HTTPError, PromQLError) as exc:
            log.debug("Prometheus query for %s at %s failed: %s", replica, self.promql.url, exc)
            return None
        return stat_from_query(data, replica)

    async def close(self) -> None:
        await self.promql.close()


# ---------------------------------------------------------------------- the cluster: by function


WINDOW_S = 30.0  # what the rates of a snapshot are measured over
WINDOW = f"{WINDOW_S:g}s"  # the same in PromQL: "30s"
LATENCY = "shoal_gateway_request_duration_seconds_bucket"  # what the SLO alerts read too
POKE_TTL_S = 5.0  # a gateway's poke counts this long (then Prometheus has seen the queue)


def cluster_queries(window: str = WINDOW) -> dict[str, str]:
    """PromQL for every function's snapshot at once: eleven queries a tick, whatever the number of
    functions (one per function would make a tick outlast the Lease on a large cluster)."""
    by = "by (function)"
    return {
        "rps": f"sum {by} (rate(shoal_replica_requests_total[{window}]))",
        "duty": f"sum by (function, pod) (rate(shoal_replica_busy_seconds_total[{window}]))",
        # latency as the user sees it: the gateways' histogram, from arrival, held time included
        "p95_s": f"histogram_quantile(0.95, sum by (function, le) (rate({LATENCY}[{window}])))",
        # time-averaged between the last two scrapes (irate of the integral), as shoal up's
        # gateway reads it between two ticks and Knative's queue-proxy reports it; a pod with
        # one scrape so far has no irate yet and counts from its second
        "inflight": f"sum {by} (irate(shoal_replica_inflight_seconds_total[{window}]))",
        "queued": f"sum {by} (shoal_replica_queued)",
        "held": f"sum {by} (shoal_activator_queue_depth)",
        "busy": f"sum {by} (rate(shoal_replica_busy_seconds_total[{window}]))",
        "buckets": f"sum by (function, le) (rate({LATENCY}[{window}]))",
        "batches": f"sum {by} (rate(shoal_replica_batch_size_count[{window}]))",
        "rows": f"sum {by} (rate(shoal_replica_batch_size_sum[{window}]))",
        # each size's slowest pod's probe at its load (the function's pods on one slice)
        "probe": "max by (function, rows) (shoal_replica_batch_probe_seconds)",
    }


def by_function(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The vectors of `cluster_queries`, split by their `function` label (pure)."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for key, vector in results.items():
        for sample in vector:
            function = (sample.get("metric") or {}).get("function")
            if function:
                out.setdefault(function, {}).setdefault(key, []).append(sample)
    return out


def _scalar(result: list[dict[str, Any]]) -> float | None:
    """The value of a one-sample vector (None: no sample, or NaN such as a quantile of nothing)."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


def latency_buckets(result: list[dict[str, Any]]) -> tuple[tuple[float, float], ...]:
    """The cumulative histogram ((le, requests per second), ...) of a `buckets` vector
    (metrics.cumulative_histogram; pure); a sample without a numeric bound is left out."""
    pairs = []
    for sample in result:
        try:
            pairs.append((float((sample.get("metric") or {})["le"]), float(sample["value"][1])))
        except (KeyError, ValueError):
            continue
    return cumulative_histogram(pairs)


def snapshot_from_results(function: str, now: float, fleet: Fleet | None, results: dict[str, list],
                          slo_s: float | None = None, window_s: float = WINDOW_S) -> MetricsSnapshot:
    """A MetricsSnapshot from the `data.result` vectors of `cluster_queries` (pure): with the
    function's SLO, the share of the window's requests over it. What the loop learns (batch
    latencies, the cold start, the slice) it adds itself (loop.Loop._complete). `fleet`:
    anything with the function's `replicas` and `ready` counts."""
    rps = _scalar(results.get("rps", [])) or 0.0
    buckets = latency_buckets(results.get("buckets", []))
    busy = _scalar(results.get("busy", [])) or 0.0
    # the busiest `ready` pods: a pod still starting, or gone within the window, shows little work and
    # must not stand in for a ready one
    duties = tuple(sorted((min(1.0, max(0.0, float(s["value"][1]))) for s in results.get("duty", [])
                           if math.isfinite(float(s["value"][1]))), reverse=True))
    ready = fleet.ready if fleet else 0
    current = fleet.replicas if fleet else 0
    return MetricsSnapshot(
        function=function, at=now, ready=ready, starting=max(0, current - ready),
        inflight=_scalar(results.get("inflight", [])) or 0.0, queued=_scalar(results.get("queued", [])) or 0.0,
        activator_queue=int(_scalar(results.get("held", [])) or 0), duty=tuple(sorted(duties[:ready])),
        rps=rps, p95_s=_scalar(results.get("p95_s", [])), service_s=busy / rps if rps > 0 else None,
        over_slo=fraction_over(buckets, slo_s) if slo_s is not None else 0.0,
        answered_rps=buckets[-1][1] if buckets else 0.0,  # the +Inf bucket's rate: every request
        window_s=window_s,
    )


def batch_of(results: dict[str, list]) -> tuple[float, float] | None:
    """The window's batches (metrics.batch_window) from rates over it: batches, requests answered
    and busy seconds per second give the requests per batch and the seconds per batch (pure).
    E.g. 8 batches/s, 38 requests/s, 0.04 busy s/s: 4.75 requests in 5 ms."""
    return batch_window(_scalar(results.get("batches", [])) or 0.0, _scalar(results.get("rps", [])) or 0.0,
                        _scalar(results.get("busy", [])) or 0.0)


def probe_of(results: dict[str, list]) -> tuple[None, tuple[tuple[float, float], ...]] | None:
    """The function's probe (loop.Reading.probe, on its slice now) from a `probe` vector, by its
    `rows` label (pure); None without one. E.g. rows 1 at .040 and 8 at .120: (None, ((1.0, .04),
    (8.0, .12)))."""
    points = []
    for sample in results.get("probe", []):
        try:
            rows, seconds = float((sample.get("metric") or {})["rows"]), float(sample["value"][1])
        except (KeyError, ValueError):
            continue
        if rows >= 1 and math.isfinite(seconds) and seconds > 0:
            points.append((rows, seconds))
    return (None, tuple(sorted(points))) if points else None


def rows_of(results: dict[str, list], window_s: float = WINDOW_S) -> tuple[float, float] | None:
    """(batch rows, requests answered) over the window from their rates (pure), as loop.Memory
    sums them; None without a request. Each look's window overlaps the last's, so the sums count
    request-windows, not requests; their ratio is still the rows per request. E.g. 38 rows/s, 38
    requests/s over 30 s: (1140, 1140)."""
    rps = _scalar(results.get("rps", [])) or 0.0
    if rps <= 0:
        return None
    return (_scalar(results.get("rows", [])) or 0.0) * window_s, rps * window_s


Query = Callable[[str], "list[dict[str, Any]] | Awaitable[list[dict[str, Any]]]"]


class FunctionQueries:
    """The cluster's MetricsSource: `cluster_queries` for every function at once, and what the
    gateways poke (requests held, counted at once: Prometheus sees the queue only after its next
    scrape, and a poke counts POKE_TTL_S)."""

    def __init__(self, query: Query):
        """`query(promql)` returns (or awaits to) the `data.result` of an instant query, or raises."""
        self.query = query
        self.pokes: dict[str, tuple[float, int]] = {}  # function -> (when, requests held)
        self._pokes_lock = threading.Lock()  # pokes come from the API's thread, reads from the tick's

    def poke(self, function: str, held: int, now: float) -> None:
        with self._pokes_lock:
            self.pokes[function] = (now, max(0, held))

    async def read(self, wanted: dict[str, tuple[FunctionSpec, Fleet]], now: float,
                   between_ticks: bool = False) -> dict[str, Reading]:
        # Prometheus's range queries end no window of ours: a look between ticks reads as a tick's
        with self._pokes_lock:  # names poked once go
            self.pokes = {f: p for f, p in self.pokes.items() if now - p[0] <= POKE_TTL_S}
        try:
            per_function = by_function({key: await self._vector(q) for key, q in cluster_queries().items()})
        except Exception as exc:  # noqa: BLE001 - Prometheus down is not zero load
            log.warning("metrics unavailable (%s); every function keeps its replica count", exc)
            return {}
        return {name: self._reading(name, spec, fleet, per_function.get(name, {}), now)
                for name, (spec, fleet) in wanted.items()}

    def _reading(self, name: str, spec: FunctionSpec, fleet: Fleet, results: dict[str, list], now: float) -> Reading:
        snapshot = snapshot_from_results(name, now, fleet, results, slo_s=spec.scaling.slo_p95_ms / 1000.0)
        poked_at, held = self.pokes.get(name, (0.0, 0))
        if now - poked_at <= POKE_TTL_S and held > snapshot.activator_queue:
            snapshot = snapshot._replace(activator_queue=held)
        return Reading(snapshot, batch_of(results), probe_of(results), rows_of(results))

    async def _vector(self, promql: str) -> list[dict[str, Any]]:
        result = self.query(promql)
        return await result if inspect.isawaitable(result) else result
