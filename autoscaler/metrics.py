"""What the controller knows about replicas and functions, and how it is computed (pure).

A `ReplicaStat` is one scrape of a replica's /metrics, parsed with
prometheus_client's own parser. Rates (duty cycle, requests per second) and
windowed latency quantiles come from the difference of two readings, so nothing
here reads a clock: `at` is passed in. `serving` may import this module. The
`MetricsSnapshot` the metrics sources build from these is defined in `autoscaler.snapshot`, a
module of its own that the simulator compiles with the policy, and named here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from autoscaler.snapshot import MetricsSnapshot as MetricsSnapshot  # named here too (a re-export)


@dataclass(frozen=True, slots=True)
class ReplicaStat:
    """One scrape of one replica."""

    replica: str
    at: float
    inflight: float = 0.0
    queued: float = 0.0
    completed: float = 0.0  # requests answered, any status
    errors: float = 0.0  # answered with 5xx
    busy_s: float = 0.0  # executor busy seconds (counter)
    # cumulative request-duration histogram: ((upper bound s, count), ...), +Inf last
    latency_buckets: tuple[tuple[float, float], ...] = ()
    model_load_s: float | None = None
    stalled_s: float = 0.0  # how long the model call running now has run
    batches: float = 0.0  # batches executed (counter: the batch-size histogram's count)
    batch_rows: float = 0.0  # rows in them (its sum)
    # ((rows, seconds), ...): the batches of zeros timed at its load (shoal_replica_batch_probe_seconds)
    probe: tuple[tuple[float, float], ...] = ()


def parse_replica_metrics(text: str, replica: str, at: float) -> ReplicaStat:
    """A ReplicaStat from a replica's Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    completed = errors = 0.0
    buckets: list[tuple[float, float]] = []
    probe: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "shoal_replica_requests_total":
                completed += s.value
                if s.labels.get("code", "").startswith("5"):
                    errors += s.value
            elif s.name == "shoal_replica_request_duration_seconds_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name == "shoal_replica_batch_probe_seconds":
                probe.append((float(s.labels["rows"]), s.value))
            else:
                values[s.name] = s.value
    buckets.sort()
    return ReplicaStat(
        replica=replica, at=at,
        inflight=values.get("shoal_replica_inflight", 0.0),
        queued=values.get("shoal_replica_queued", 0.0),
        completed=completed, errors=errors,
        busy_s=values.get("shoal_replica_busy_seconds_total", 0.0),
        latency_buckets=tuple(buckets),
        model_load_s=values.get("shoal_replica_model_load_seconds"),
        stalled_s=values.get("shoal_replica_stalled_seconds", 0.0),
        batches=values.get("shoal_replica_batch_size_count", 0.0),
        batch_rows=values.get("shoal_replica_batch_size_sum", 0.0),
        probe=tuple(sorted(probe)),
    )


def duty_cycle(prev: ReplicaStat, cur: ReplicaStat) -> float:
    """Busy fraction of the slice between two scrapes: d(busy seconds) / d(time), in [0, 1]."""
    elapsed = cur.at - prev.at
    if elapsed <= 0:
        return 0.0
    return min(1.0, max(0.0, (cur.busy_s - prev.busy_s) / elapsed))


def request_rate(prev: ReplicaStat, cur: ReplicaStat) -> float:
    elapsed = cur.at - prev.at
    return max(0.0, cur.completed - prev.completed) / elapsed if elapsed > 0 else 0.0


def advance_window(window: list[ReplicaStat], stat: ReplicaStat) -> list[ReplicaStat]:
    """The last two scrapes of a replica once `stat` has come in (oldest first).

    A stat no newer than the last one is a metrics store that has not scraped the
    replica since the previous tick (Prometheus scraping every 15 s, the controller
    ticking every second): the window stays as it was, so the rates of the last
    window hold instead of reading zero over zero seconds. E.g. scrapes at 10 and 25,
    ticks at 26 and 27 both see 25: both keep the window (10, 25).
    """
    if window and stat.at <= window[-1].at:
        return list(window)
    return [*window[-1:], stat]


def cumulative_histogram(buckets) -> tuple[tuple[float, float], ...]:
    """((le, count), ...) by bound from (le, count) pairs in any order, as `quantile` and
    `fraction_over` read them: a pair with a NaN bound or count is left out, and a histogram
    without its +Inf bucket is none (those read the total from the last bucket).
    E.g. [(inf, 100), (0.1, 90), (0.25, nan)] -> ((0.1, 90), (inf, 100))."""
    out = sorted((le, count) for le, count in buckets if not (math.isnan(le) or math.isnan(count)))
    return tuple(out) if out and math.isinf(out[-1][0]) else ()


def histogram_delta(prev: tuple[tuple[float, float], ...] | None,
                    cur: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """The observations a cumulative histogram gained from `prev` to `cur` (all of `cur` without a
    `prev`, or where the bounds differ). E.g. ((0.1, 90), (inf, 100)) -> ((0.1, 93), (inf, 104)):
    ((0.1, 3), (inf, 4))."""
    if prev is None or len(prev) != len(cur):
        return cur
    return tuple((le, max(0.0, c - p)) for (le, c), (_, p) in zip(cur, prev))


# the gateway's request-latency histogram (and a replica's): the bounds the controller's p95 and
# share over the SLO are interpolated in, here so that the simulator reads the same. Between 50 ms
# and 1 s, where SLOs lie, about 1.33x apart, with the usual SLOs (50, 100, 200, 500 ms) as bounds,
# so the share over such an SLO is counted, not interpolated; a 2.5x step (100 to 250 ms) read a
# few requests at 110 ms as a p95 of 200 ms against a 200 ms SLO
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 30.0,
)


def quantile(buckets: tuple[tuple[float, float], ...] | list, q: float) -> float | None:
    """Quantile from cumulative buckets, interpolated linearly inside the bucket as
    Prometheus' histogram_quantile does; None with no observations. A quantile that
    falls in the +Inf bucket is reported as the highest finite bound (quantiles, for one)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    bounds, counts = _columns(buckets)
    return float(quantiles(bounds, counts, q)[0])


def fraction_over(buckets: tuple[tuple[float, float], ...] | list, bound: float) -> float:
    """The fraction of observations above `bound` in a cumulative histogram, interpolated
    linearly inside the bucket that holds it (as `quantile`); 0 with no observations.
    E.g. ((0.1, 90), (0.25, 99), (inf, 100)), bound 0.2: 90 + 9 x (0.1 / 0.15) = 96 at or
    under it -> 0.04 (fractions_over, for one)."""
    if not buckets or buckets[-1][1] <= 0:
        return 0.0
    bounds, counts = _columns(buckets)
    return float(fractions_over(bounds, counts, np.array([bound], float))[0])


def _columns(buckets) -> tuple[np.ndarray, np.ndarray]:
    return np.array([b for b, _ in buckets], float), np.array([[c for _, c in buckets]], float)


def quantiles(bounds: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """`quantile` of each row of `counts` (cumulative, at `bounds`, ascending): in the first
    bucket whose count reaches q x total, linearly between its bounds (0 below the first);
    in the +Inf bucket, the bound below it; NaN for a row without observations. E.g. bounds
    (0.1, 0.25, inf), counts (8, 9, 9), q 0.95: rank 8.55 in (0.1, 0.25]:
    0.1 + 0.15 x 0.55 / 1 = 0.1825."""
    rows = np.arange(len(counts))
    total = counts[:, -1]
    rank = q * total
    reached = counts >= rank[:, None]
    j = np.where(reached.any(axis=1), reached.argmax(axis=1), len(bounds) - 1)
    below = j > 0
    lower_b = np.where(below, bounds[np.maximum(j - 1, 0)], 0.0)
    lower_c = np.where(below, counts[rows, np.maximum(j - 1, 0)], 0.0)
    upper, count = bounds[j], counts[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = lower_b + (upper - lower_b) * (rank - lower_c) / (count - lower_c)
    out = np.where(np.isinf(upper), lower_b, np.where(count == lower_c, upper, inside))
    out = np.where(reached.any(axis=1), out, bounds[-1])  # q > 1: past every bucket
    return np.where(total > 0, out, np.nan)


def fractions_over(bounds: np.ndarray, counts: np.ndarray, over: np.ndarray) -> np.ndarray:
    """`fraction_over` of each row of `counts` (cumulative, at `bounds`) above its row's bound
    in `over`: the count at or under it interpolated linearly inside the bucket that holds it
    (all of the +Inf bucket's over it), within [0, 1]; 0 for a row without observations or
    whose bound is above every bucket."""
    rows = np.arange(len(counts))
    total = counts[:, -1]
    holds = bounds[None, :] >= over[:, None]
    j = holds.argmax(axis=1)
    below = j > 0
    lower_b = np.where(below, bounds[np.maximum(j - 1, 0)], 0.0)
    lower_c = np.where(below, counts[rows, np.maximum(j - 1, 0)], 0.0)
    upper, count = bounds[j], counts[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        under = np.where(np.isinf(upper), lower_c, lower_c + (count - lower_c) * (over - lower_b) / (upper - lower_b))
        out = np.clip(1.0 - under / total, 0.0, 1.0)
    return np.where((total > 0) & holds.any(axis=1), out, 0.0)


def batch_window(batches: float, answered: float, busy_s: float) -> tuple[float, float] | None:
    """(requests per batch, seconds per batch) over a window in which a function's replicas
    ran `batches` batches, answered `answered` requests and were busy `busy_s` seconds; None
    without a batch or a request. In requests, not rows: the policy weighs it against requests
    per second and requests in flight, and one request may carry many rows (1,000-row requests
    run one at a time are no batching: size 1). E.g. 40 batches, 190 requests, 0.2 s:
    (4.75, 0.005)."""
    if batches <= 0 or answered <= 0:
        return None
    return answered / batches, busy_s / batches


ONE_ROW_MAX: Final = 1.5  # rows per request up to which requests are read as one row each
ROWS_MIN_ANSWERED: Final = 50.0  # requests counted before rows per request is read at all


def rows_per_request(rows: float, answered: float) -> float | None:
    """Rows per request from batch rows and requests answered counted over the windows so far
    (loop.Memory sums them), None while under ROWS_MIN_ANSWERED requests: a batch's rows count
    when it starts and its requests when answered, so a window ending inside a batch reads one
    batch more (5 rows for 4 requests), which a count of many requests makes small. E.g. 410
    rows, 400 requests: 1.025; 20 rows, 10 requests: None."""
    if answered < ROWS_MIN_ANSWERED:
        return None
    return rows / answered


def seed_batch_latency(table: tuple[tuple[float, float], ...], probe: tuple[tuple[float, float], ...],
                       rows_per_request: float | None = None, max_rows: float | None = None
                       ) -> tuple[tuple[float, float], ...]:
    """The learned table with the replicas' probe (batches of zeros timed at load, by rows:
    serving's DataPlane._probe) where no window taught a size near it: a probed size whose
    power-of-two bucket (as learn_batch_latency keeps them) holds no learned size is added, if
    within the function's largest batch now (`max_rows`: a probe of a revision that batched
    more says nothing of this one). The probe counts rows, the table requests: it is read as
    requests only while requests are measured to carry one row each (`rows_per_request` at most
    ONE_ROW_MAX, or None before it is measured); at 2 rows a request a batch of 8 rows is 4
    requests and the probe is left out. What a window learns always stands over it. E.g.
    ((1, .0446),) with ((1, .040), (8, .120)): ((1, .0446), (8, .120)); with 2 rows a request,
    or a largest batch of 4: ((1, .0446),)."""
    if not probe or (rows_per_request is not None and rows_per_request > ONE_ROW_MAX):
        return table
    if max_rows is not None:
        probe = tuple((r, s) for r, s in probe if r <= max_rows)
    taken = {round(math.log2(r)) for r, _ in table}
    added = [(r, s) for r, s in probe if r >= 1 and s > 0 and math.isfinite(s) and round(math.log2(r)) not in taken]
    return tuple(sorted(table + tuple(added))) if added else table


def learn_batch_latency(table: tuple[tuple[float, float], ...], size: float, seconds: float,
                        weight: float = 0.25) -> tuple[tuple[float, float], ...]:
    """A function's batch latencies, ((size, seconds), ...) by size, after one more window in
    which its batches averaged `size` requests and `seconds` each (see batch_window).
    Windows are kept by the power of two nearest their mean size; a window like a kept one
    moves it by `weight` (an EWMA), so the table follows the model as load varies the
    batches. E.g. ((1, .004),) then 7.6 requests in 5.9 ms: bucket 8 is new ->
    ((1, .004), (7.6, .0059)); then 8.4 in 6.1 ms: (7.6 + .25 x .8, 5.9 + .25 x .2 ms)
    = (7.8, .00595)."""
    if not (size >= 1 and seconds > 0 and math.isfinite(size) and math.isfinite(seconds)):
        return table
    bucket = round(math.log2(size))
    out, merged = [], False
    for r, s in table:
        if round(math.log2(r)) == bucket:
            r, s, merged = r + (size - r) * weight, s + (seconds - s) * weight, True
        out.append((r, s))
    if not merged:
        out.append((size, seconds))
    return tuple(sorted(out))
