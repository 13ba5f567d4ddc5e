"""Metrics from each replica's own /metrics: shoal up's MetricsSource (`ReplicaScrapes`).

Every ready replica is scraped (`HttpScraper`, or `PrometheusSource` through a Prometheus that
scrapes them); a function's rates come from the last two scrapes of each replica, its in-flight
(time-averaged since its last tick's reading) and held counts from the gateway, and its p95 and
share over the SLO from the gateway's latency histogram (from arrival, held time included: a
request held through a cold start is a miss); a look between ticks ends none of these windows. A replica stuck in its model past its function's timeout,
or silent past `unresponsive_s`, is failed here (a liveness probe) and not counted. Imports
neither deploy nor serving; the I/O is httpx only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from autoscaler.loop import Fleet, Reading
from autoscaler.metrics import (
    ReplicaStat,
    advance_window,
    batch_window,
    duty_cycle,
    fraction_over,
    histogram_delta,
    parse_replica_metrics,
    quantile,
    request_rate,
)
from autoscaler.replicas import Replica, ReplicaScaler
from autoscaler.snapshot import MetricsSnapshot
from functions.spec import LIMITS, FunctionSpec

log = logging.getLogger("shoal.controller")

Histogram = tuple[tuple[float, float], ...]  # cumulative ((le, requests), ..., (inf, all))


class Scraper(Protocol):
    # True when a failed scrape means the replica did not answer (a direct scrape), not
    # that a metrics store has no sample yet: liveness is then judged by it
    probes: bool

    async def scrape(self, replica: str, host: str, port: int, at: float) -> ReplicaStat | None: ...


class Latencies(Protocol):
    def latencies(self) -> dict[str, Histogram]:
        """Each function's cumulative histogram of request latency from arrival at the gateway,
        held time included (the gateway's shoal_gateway_request_duration_seconds)."""


class HttpScraper:
    """Reads a replica's /metrics over HTTP, parsed with prometheus_client's parser."""

    probes = True  # a failed scrape: the replica did not answer

    def __init__(self):
        import httpx

        self._client = httpx.AsyncClient(timeout=1.0)

    async def scrape(self, replica: str, host: str, port: int, at: float):
        response = await self._client.get(f"http://{host}:{port}/metrics")
        response.raise_for_status()
        return parse_replica_metrics(response.text, replica, at)

    async def close(self) -> None:
        await self._client.aclose()


class ReplicaScrapes:
    """The loop's MetricsSource on shoal up: the replicas are the scaler's, the counts and the
    latencies the gateway's."""

    def __init__(self, scaler: ReplicaScaler, scraper: Scraper, latencies: Latencies):
        self.scaler, self.scraper, self.latencies = scaler, scraper, latencies
        # function -> the gateway's histogram at its last tick's reading, and when
        self.seen: dict[str, tuple[Histogram, float]] = {}
        self.last_inflight: dict[str, tuple[float, float]] = {}  # function -> the gateway's integral, and when

    async def read(self, wanted: dict[str, tuple[FunctionSpec, Fleet]], now: float,
                   between_ticks: bool = False) -> dict[str, Reading]:
        histograms = self.latencies.latencies()  # once a tick, for every function
        readings = await asyncio.gather(*(self.reading(name, now, spec, histograms, between_ticks)
                                          for name, (spec, _) in wanted.items()))
        return dict(zip(wanted, readings))

    async def snapshot(self, name: str, now: float, spec: FunctionSpec | None = None) -> MetricsSnapshot:
        return (await self.reading(name, now, spec)).snapshot

    async def reading(self, name: str, now: float, spec: FunctionSpec | None = None,
                      histograms: dict[str, Histogram] | None = None, between_ticks: bool = False) -> Reading:
        """The function's reading at `now`; `between_ticks`, over the windows since the last tick's
        reading without ending them (MetricsSource.read)."""
        keep = not between_ticks
        served, answered_rps = self._served(name, self.latencies.latencies() if histograms is None else histograms,
                                            now, keep)
        mine = self.scaler.live(name)
        ready = [r for r in mine if r.state == "ready"]
        stats = await asyncio.gather(*(self._scrape(r, now) for r in ready))
        live = [(r, s) for r, s in zip(ready, stats) if not self._dead(r, s, now) and s is not None]
        w = _Window(live, keep)
        failed = sum(1 for r in ready if r.state == "failed")
        router = self.scaler.router
        snapshot = MetricsSnapshot(
            function=name, at=now, ready=len(ready) - failed, starting=len(mine) - len(ready),
            inflight=self._inflight(name, keep), queued=w.queued, activator_queue=router.held(name),
            # the window's length, only when it is a new window: the same rates read again (Prometheus
            # has not scraped since, or a look between ticks that the tick reads again) are no second
            # measurement of the rate's variance
            duty=tuple(w.duties), rps=w.rps,
            window_s=w.windows / len(w.duties) if w.duties and w.moved and keep else 0.0,
            p95_s=quantile(served, 0.95), service_s=w.busy / w.answered if w.answered else None,
            over_slo=fraction_over(served, spec.scaling.slo_p95_ms / 1000.0) if spec is not None else 0.0,
            answered_rps=answered_rps,
        )
        # in requests, the unit of rps and in-flight
        return Reading(snapshot, batch_window(w.batches, w.answered, w.busy), w.probe,
                       # a window counted once: not at a look between ticks, nor read again unmoved
                       (w.rows, w.answered) if w.answered > 0 and w.moved and keep else None)

    def _inflight(self, name: str, keep: bool = True) -> float:
        """The function's requests in its replicas, time-averaged since its last tick's reading
        (the gateway's integral, InFlight), as the simulator's look reads it (each request's
        overlap with the tick, over its length) and Knative's KPA reads concurrency; at a first
        reading, or after the gateway forgot the function, the count now. `keep`: this reading
        ends the window (a tick's); a look between ticks reads the window so far and leaves it
        open. E.g. requests held through a cold start poke looks every few ms until a replica is
        ready at 2.05 s; had each ended the window, the tick at 2.2 s would read 0.15 s of the
        released backlog as its average, nearly the count of it: 45 where the tick's average is
        45 x 0.15 / 1 = 6.75."""
        router = self.scaler.router
        area, at = router.inflight_seconds(name)
        last = self.last_inflight.get(name)
        if keep or last is None:
            self.last_inflight[name] = (area, at)
        if last is None or at <= last[1] or area < last[0]:
            return float(router.outstanding(name))
        return (area - last[0]) / (at - last[1])

    def _served(self, name: str, histograms: dict[str, Histogram], now: float,
                keep: bool = True) -> tuple[Histogram, float]:
        """The requests the gateway answered for `name` since its last tick's reading, by latency,
        and their rate over that time (0 at a first reading: no window yet); `keep`: this reading
        ends the window. The gateway counts a request held through a cold start when it is
        answered, before any replica's scrape has a rate: 12 answered in the 1.5 s since the last
        tick are 8 requests/s while the replica's rps is still 0."""
        histogram = histograms.get(name, ())
        last = self.seen.get(name)
        window = histogram_delta(last[0] if last else None, histogram)
        if keep or last is None:  # a first reading starts the window either way, as _inflight's
            self.seen[name] = (histogram, now)
        if last is None or now <= last[1] or not window:
            return window, 0.0
        return window, window[-1][1] / (now - last[1])

    def _dead(self, replica: Replica, stat: ReplicaStat | None, now: float) -> bool:
        """Liveness: a replica whose model has been inside one call past its function's
        timeout, or that has answered no scrape for `unresponsive_s`, is failed; the policy
        then starts another. Its requests were answered 504 by its own timer."""
        why = None
        timeout_s = replica.spec.timeout_s if replica.spec is not None else LIMITS.request_timeout_s
        if stat is not None:
            replica.seen_at = now
            if stat.stalled_s > timeout_s:
                why = f"its model has been inside one call for {stat.stalled_s:.1f} s (timeout {timeout_s:g} s)"
        elif getattr(self.scraper, "probes", False) and now - replica.seen_at > max(
                self.scaler.config.unresponsive_s, timeout_s):
            # silent: a frozen process, or a model call that holds the GIL; a busy replica gets
            # at least its function's timeout before it is judged
            why = f"it answered no scrape for {now - replica.seen_at:.1f} s"
        if why is None:
            return False
        self.scaler.fail(replica, f"{replica.id} is not live: {why}; replacing it")
        return True

    async def _scrape(self, replica: Replica, now: float) -> ReplicaStat | None:
        try:
            return await self.scraper.scrape(replica.id, replica.handle.host, replica.handle.port, now)
        except Exception as exc:  # a replica that cannot be scraped is judged by its process state
            log.debug("scrape of %s failed: %s", replica.id, exc)
            return None


class _Window:
    """The function's window summed over its replicas' last two scrapes; each replica's window
    moves on with this scrape (metrics.advance_window), unless `keep` is False (a look between
    ticks: read as if it moved on, left where it was)."""

    def __init__(self, scraped: list[tuple[Replica, ReplicaStat]], keep: bool = True):
        self.duties: list[float] = []
        self.rps = self.queued = self.busy = self.answered = self.batches = self.rows = self.windows = 0.0
        self.probe: tuple[float | None, tuple[tuple[float, float], ...]] | None = None  # a replica's (the last read that had one), on its slice
        self.moved = False  # some replica's window moved on: a scrape newer than the last tick's
        for replica, stat in scraped:
            self.moved = self.moved or not replica.stats or stat.at > replica.stats[-1].at
            stats = advance_window(replica.stats, stat)
            if keep:
                replica.stats = stats
            self._add(stats[0] if len(stats) == 2 else None, stats[-1])
            if stat.probe:
                on = replica.placement.fraction if replica.placement is not None else None
                self.probe = (None if on is None else float(on), stat.probe)

    def _add(self, prev: ReplicaStat | None, stat: ReplicaStat) -> None:
        self.queued += stat.queued
        if prev is not None:
            self.duties.append(duty_cycle(prev, stat))
            self.rps += request_rate(prev, stat)
            self.windows += stat.at - prev.at
            self.busy += max(0.0, stat.busy_s - prev.busy_s)
            self.answered += max(0.0, stat.completed - prev.completed)
            self.batches += max(0.0, stat.batches - prev.batches)
            self.rows += max(0.0, stat.batch_rows - prev.batch_rows)
