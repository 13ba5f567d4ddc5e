"""Request-arrival traces for the cluster simulator: `make_trace(kind, ...)` merges `functions`
independent request streams over `[0, seconds)` into one time-sorted `Trace`. Pure and
reproducible (stdlib and numpy only, every draw from `default_rng(seed)`, no clock); only
the `csv` kind reads a file. The kinds, their options and the Azure-like population
(Shahrad et al., ATC 2020) are described in docs/design/traces.md.
"""

from __future__ import annotations

import csv as _csv
import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["TRACE_KINDS", "Trace", "make_trace"]

DEFAULT_SECONDS = 600.0
DEFAULT_RATE = 50.0
TOP_SHARE = 0.19  # summary: share of requests carried by the busiest 19% of functions

# azure population (Shahrad et al. 2020, section 3)
HOURLY = 1.0 / 3600.0  # rare class: at most once an hour
MINUTELY = 1.0 / 60.0  # medium class: at most once a minute
RARE_PERCENT, MEDIUM_PERCENT = 45, 36  # the rest (19%) is the busy class
BUSY_SPAN = 1e4  # busiest / least busy function of the busy class
BUSY_EXPONENT = 0.67  # truncated power law of the busy class's rates: P(X > x) ~ x^-0.67
TIMER_PERIODS_S = (60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0)
TIMER_JITTER_S = 1.0

MAX_EXPECTED_ARRIVALS = 2e8  # ~2.4 GB of arrays; a bigger request is most likely a typo
_BLOCK = 4_000_000  # elements per random block in the renewal generators

_REQUIRED = object()


# ---------------------------------------------------------------------- the trace


@dataclass(frozen=True, eq=False)
class Trace:
    """Merged arrivals of `len(functions)` streams over `[0, duration_s)`: `times` (ascending)
    and `fids` (index into `functions`), read-only; `rates`, each function's configured mean
    rate (per kind: docs/design/traces.md)."""

    kind: str
    duration_s: float
    functions: tuple[str, ...]
    times: np.ndarray
    fids: np.ndarray
    params: dict
    rates: np.ndarray | None = None

    def __post_init__(self) -> None:
        duration = float(self.duration_s)
        if not math.isfinite(duration) or duration <= 0:
            raise ValueError(f"duration_s={self.duration_s!r}: must be a finite number > 0")
        functions = tuple(self.functions)
        n = len(functions)
        times = np.ascontiguousarray(self.times, dtype=np.float64)
        fids = np.ascontiguousarray(self.fids, dtype=np.int32)
        if times.ndim != 1 or times.shape != fids.shape:
            raise ValueError(f"times {times.shape} and fids {fids.shape} must be 1-D arrays of the same length")
        if times.size:
            if not np.all(times[1:] >= times[:-1]):
                raise ValueError("times must be sorted ascending (and not NaN)")
            if times[0] < 0 or times[-1] >= duration:
                raise ValueError(f"times must lie in [0, {duration}); got [{times[0]}, {times[-1]}]")
            if fids.min() < 0 or fids.max() >= n:
                raise ValueError(f"fids must lie in [0, {n}); got [{fids.min()}, {fids.max()}]")
        if self.rates is None:
            rates = np.bincount(fids, minlength=n) / duration
        else:
            rates = np.array(self.rates, dtype=np.float64)
        if rates.shape != (n,):
            raise ValueError(f"rates must have one entry per function ({n}); got shape {rates.shape}")
        for name, value in (("times", times), ("fids", fids), ("rates", rates)):
            view = value.view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)
        object.__setattr__(self, "functions", functions)
        object.__setattr__(self, "duration_s", duration)

    def __len__(self) -> int:
        return int(self.times.size)

    def shifted(self, seconds: float) -> Trace:
        """The same arrivals `seconds` (>= 0) later, those that would fall at or past the end
        dropped: the same traffic at another phase of a controller's ticks. E.g. arrivals at 0.2
        and 9.95 s of a 10 s trace, shifted 0.1 s: one arrival, at 0.3 s. The configured rates
        stay; `params["shift_s"]` adds up the shifts. Over-full clusters are chaotic in it
        (docs/policy-changes.md, "The ticks' phase")."""
        seconds = _number("seconds", seconds, lo=0.0)
        times = self.times + seconds
        keep = times < self.duration_s
        return Trace(self.kind, self.duration_s, self.functions, times[keep], self.fids[keep],
                     {**self.params, "shift_s": self.params.get("shift_s", 0.0) + seconds}, self.rates)

    def counts(self) -> np.ndarray:
        """Requests per function (int64, one per function)."""
        return np.bincount(self.fids, minlength=len(self.functions)).astype(np.int64)

    def window_counts(self, bin_s: float) -> np.ndarray:
        """Requests per function per time bin: shape (functions, ceil(duration_s / bin_s)).

        Memory is functions x bins x 8 bytes: 10,000 functions in 1-s bins over an hour is 288 MB."""
        bin_s = _number("bin_s", bin_s, lo=0.0, lo_open=True)
        n_bins = max(1, math.ceil(self.duration_s / bin_s))
        bins = np.minimum((self.times // bin_s).astype(np.int64), n_bins - 1)
        flat = self.fids.astype(np.int64) * n_bins + bins
        return np.bincount(flat, minlength=len(self.functions) * n_bins).reshape(len(self.functions), n_bins)

    def summary(self) -> dict:
        """JSON-serializable figures: sizes, mean rates, the spread across functions and the skew."""
        counts = self.counts()
        n = len(self.functions)
        requests = int(counts.sum())
        per_fn = counts / self.duration_s
        top_k = (19 * n + 99) // 100  # ceil(0.19 n) in integers
        top = np.sort(counts)[::-1][:top_k]
        per_second = np.bincount(self.times.astype(np.int64)) if requests else np.zeros(1, np.int64)
        return {
            "kind": self.kind,
            "params": dict(self.params),
            "duration_s": self.duration_s,
            "functions": n,
            "requests": requests,
            "mean_rate": requests / self.duration_s,
            "configured_rate": float(self.rates.sum()),
            "rate_per_function": {
                "min": float(per_fn.min()),
                "median": float(np.median(per_fn)),
                "max": float(per_fn.max()),
            },
            "idle_functions": int(np.count_nonzero(counts == 0)),
            "top19_functions": top_k,
            "top19_share": float(top.sum() / requests) if requests else 0.0,
            "peak_1s_requests": int(per_second.max()),
        }


# ---------------------------------------------------------------------- entry point


def make_trace(kind: str, *, functions: int = 1, seconds: float | None = None, seed: int = 0, **options: Any) -> Trace:
    """A trace of `kind` (one of TRACE_KINDS; options in docs/design/traces.md); ValueError names
    the bad kind, option, value or csv file and what is allowed."""
    if kind not in _GENERATORS:
        raise ValueError(f"unknown trace kind {kind!r}; allowed: {', '.join(TRACE_KINDS)}")
    defaults, generate = _GENERATORS[kind]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"for kind {kind!r}; allowed: {allowed}")
    missing = [name for name, value in defaults.items() if value is _REQUIRED and name not in options]
    if missing:
        raise ValueError(f"kind {kind!r} needs option {missing[0]!r}")
    if kind == "csv":  # functions come from the file; `functions` and `seed` are not used
        if seconds is not None:
            seconds = _number("seconds", seconds, lo=0.0, lo_open=True)
        return _csv_trace(seconds=seconds, **options)
    if isinstance(functions, bool) or not isinstance(functions, (int, np.integer)) or functions < 1:
        raise ValueError(f"functions={functions!r}: must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    seconds = DEFAULT_SECONDS if seconds is None else _number("seconds", seconds, lo=0.0, lo_open=True)
    merged = {name: options.get(name, value) for name, value in defaults.items()}
    functions, seed = int(functions), int(seed)
    rng = np.random.default_rng(seed)
    times, fids, rates, resolved = generate(rng, functions, seconds, **merged)
    params = {"functions": functions, "seconds": seconds, "seed": seed, **resolved}
    return _build(kind, seconds, functions, times, fids, rates, params)


# ---------------------------------------------------------------------- helpers


def _number(name: str, value: Any, *, lo: float = -math.inf, hi: float = math.inf,
            lo_open: bool = False, hi_open: bool = False) -> float:
    """`value` as a finite float in the given range, or ValueError naming it and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}={value!r}: must be a number")
    x = float(value)
    too_low = x <= lo if lo_open else x < lo
    too_high = x >= hi if hi_open else x > hi
    if not math.isfinite(x) or too_low or too_high:
        parts = []
        if lo > -math.inf:
            parts.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi < math.inf:
            parts.append(f"{'<' if hi_open else '<='} {hi:g}")
        raise ValueError(f"{name}={value!r}: must be a finite number {' and '.join(parts)}".rstrip())
    return x


def _names(n: int) -> tuple[str, ...]:
    width = max(4, len(str(n - 1)))
    return tuple(f"f{i:0{width}d}" for i in range(n))


def _check_size(expected: float) -> None:
    if expected > MAX_EXPECTED_ARRIVALS:
        raise ValueError(f"these options would make about {expected:.3g} arrivals; at most "
                         f"{MAX_EXPECTED_ARRIVALS:.0e} are allowed (lower rate, functions or seconds)")


def _build(kind: str, duration: float, n: int, times: np.ndarray, fids: np.ndarray,
           rates: np.ndarray, params: dict) -> Trace:
    """Merge: stable sort by time (skipped when already sorted), drop anything at or past the end."""
    keep = times < duration
    if not keep.all():
        times, fids = times[keep], fids[keep]
    if times.size > 1 and not np.all(times[1:] >= times[:-1]):
        order = np.argsort(times, kind="stable")
        times, fids = times[order], fids[order]
    return Trace(kind, duration, _names(n), times, fids.astype(np.int32, copy=False), params, rates)


def _poisson_segments(rng: np.random.Generator, fid: np.ndarray, start: np.ndarray, end: np.ndarray,
                      rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals of homogeneous Poisson processes, one per segment [start, end) at `rate`, labelled `fid`."""
    length = np.asarray(end, np.float64) - np.asarray(start, np.float64)
    n = rng.poisson(np.asarray(rate, np.float64) * length)
    times = np.repeat(start, n) + rng.random(int(n.sum())) * np.repeat(length, n)
    return times, np.repeat(np.asarray(fid, np.int32), n)


def _superposed(rng: np.random.Generator, edges: list[float], rates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Time-sorted arrivals of independent Poisson processes, rate rates[j, i] for function i on
    [edges[j], edges[j + 1]), merged without a sort: given each function's count in a segment,
    its times are iid uniform, so the merged times are sorted uniforms and the labels a random
    permutation of the counts."""
    times, fids = [], []
    for j, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        counts = rng.poisson(rates[j] * (hi - lo))
        total = int(counts.sum())
        if total == 0:
            continue
        label = np.repeat(np.arange(counts.size, dtype=np.int32), counts)
        rng.shuffle(label)
        spacing = np.cumsum(rng.standard_exponential(total + 1))
        t = spacing[:total]
        t *= (hi - lo) / spacing[total]
        t += lo
        times.append(t)
        fids.append(label)
    if not times:
        return np.zeros(0), np.zeros(0, np.int32)
    return np.concatenate(times), np.concatenate(fids)


def _merge_sorted(t1: np.ndarray, f1: np.ndarray, t2: np.ndarray, f2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge a (small) sorted stream t2 into a (large) sorted stream t1; ties keep t1 first."""
    at = np.searchsorted(t1, t2, side="right")
    return np.insert(t1, at, t2), np.insert(f1, at, f2)


def _sine_keep(rng: np.random.Generator, times: np.ndarray, a: float, period: float,
               phase: np.ndarray | float) -> np.ndarray:
    """Thinning mask: keep an arrival at t with probability (1 + a sin(2 pi t / period + phase)) / (1 + a)."""
    if a == 0.0:
        return np.ones(times.size, bool)
    level = np.sin(times * (2.0 * np.pi / period) + phase)
    level *= a
    level += 1.0
    return rng.random(times.size) * (1.0 + a) < level


def _renewal(n_rows: int, horizon: float, mean_gap: float, cv: float,
             draw: Callable[[np.ndarray, int, int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Event times in [0, horizon) of `n_rows` sequences whose gaps come from draw(rows, drawn, m):
    a (len(rows), m) array of the next m gaps of those rows, which have all drawn `drawn` gaps so
    far (the first event is at the first gap). Vectorized across rows in blocks. Returns
    (rows, times), each row's times ascending but rows interleaved."""
    out_rows: list[np.ndarray] = []
    out_times: list[np.ndarray] = []
    rows = np.arange(n_rows)
    offset = np.zeros(n_rows)
    drawn = 0
    while rows.size:
        remaining = (horizon - offset.min()) / mean_gap
        m = int(min(_BLOCK, remaining + 6.0 * max(cv, 1.0) * math.sqrt(remaining) + 8))
        chunk = max(1, _BLOCK // m)
        alive_rows, alive_offset = [], []
        for lo in range(0, rows.size, chunk):
            r, off = rows[lo:lo + chunk], offset[lo:lo + chunk]
            t = np.cumsum(draw(r, drawn, m), axis=1)
            t += off[:, None]
            inside = t < horizon
            out_rows.append(np.repeat(r, inside.sum(axis=1)))
            out_times.append(t[inside])
            alive = inside[:, -1]
            alive_rows.append(r[alive])
            alive_offset.append(t[alive, -1])
        rows, offset = np.concatenate(alive_rows), np.concatenate(alive_offset)
        drawn += m
    if not out_rows:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(out_rows), np.concatenate(out_times)


# ---------------------------------------------------------------------- generators
# each: (rng, functions, seconds, **options) -> (times, fids, rates per function, resolved options)


def _poisson(rng, n, T, *, rate):
    rate = _number("rate", rate, lo=0.0)
    _check_size(rate * n * T)
    times, fids = _superposed(rng, [0.0, T], np.full((1, n), rate))
    return times, fids, np.full(n, rate), {"rate": rate}


def _gamma(rng, n, T, *, rate, cv):
    rate = _number("rate", rate, lo=0.0)
    cv = _number("cv", cv, lo=0.0, hi=100.0, lo_open=True)
    _check_size(rate * n * T)
    resolved = {"rate": rate, "cv": cv}
    if rate == 0.0:
        return np.zeros(0), np.zeros(0, np.int32), np.zeros(n), resolved
    shape = 1.0 / cv**2
    scale = 1.0 / (rate * shape)

    def draw(rows, drawn, m):
        gaps = rng.gamma(shape, scale, size=(rows.size, m))
        if drawn == 0:
            # stationary start: the gap covering t=0 is length-biased, Gamma(shape + 1), and t=0
            # falls uniformly inside it, so the first arrival is a uniform share of that gap
            gaps[:, 0] = rng.gamma(shape + 1.0, scale, size=rows.size) * rng.random(rows.size)
        return gaps

    rows, times = _renewal(n, T, 1.0 / rate, cv, draw)
    return times, rows.astype(np.int32), np.full(n, rate), resolved


def _step(rng, n, T, *, rate, step_at_s, step_x):
    rate = _number("rate", rate, lo=0.0)
    at = T / 2 if step_at_s is None else _number("step_at_s", step_at_s, lo=0.0, hi=T)
    x = _number("step_x", step_x, lo=0.0)
    mean = rate * (at + x * (T - at)) / T
    _check_size(mean * n * T)
    times, fids = _superposed(rng, [0.0, at, T], np.repeat([[rate], [rate * x]], n, axis=1))
    return times, fids, np.full(n, mean), {"rate": rate, "step_at_s": at, "step_x": x}


def _spike(rng, n, T, *, rate, spike_x, spike_s, spike_at_s):
    rate = _number("rate", rate, lo=0.0)
    x = _number("spike_x", spike_x, lo=0.0)
    width = _number("spike_s", spike_s, lo=0.0)
    at = T / 3 if spike_at_s is None else _number("spike_at_s", spike_at_s, lo=0.0, hi=T)
    stop = min(T, at + width)
    mean = rate * (T + (x - 1.0) * (stop - at)) / T
    _check_size(mean * n * T)
    times, fids = _superposed(rng, [0.0, at, stop, T], np.repeat([[rate], [rate * x], [rate]], n, axis=1))
    resolved = {"rate": rate, "spike_x": x, "spike_s": width, "spike_at_s": at}
    return times, fids, np.full(n, mean), resolved


def _diurnal(rng, n, T, *, rate, swing, period_s, phase):
    rate = _number("rate", rate, lo=0.0)
    swing = _number("swing", swing, lo=1.0)
    period = T if period_s is None else _number("period_s", period_s, lo=0.0, lo_open=True)
    phase = _number("phase", phase)
    a = (swing - 1.0) / (swing + 1.0)  # peak / trough = (1 + a) / (1 - a) = swing
    _check_size(rate * (1 + a) * n * T)
    times, fids = _superposed(rng, [0.0, T], np.full((1, n), rate * (1 + a)))
    keep = _sine_keep(rng, times, a, period, phase)
    resolved = {"rate": rate, "swing": swing, "period_s": period, "phase": phase}
    return times[keep], fids[keep], np.full(n, rate), resolved


def _mmpp(rng, n, T, *, rate, mmpp_x, low_s, high_s):
    rate = _number("rate", rate, lo=0.0)
    x = _number("mmpp_x", mmpp_x, lo=0.0)
    low_s = _number("low_s", low_s, lo=0.0, lo_open=True)
    high_s = _number("high_s", high_s, lo=0.0, lo_open=True)
    high_share = high_s / (low_s + high_s)  # stationary probability of the high state
    mean = rate * ((1.0 - high_share) + x * high_share)
    _check_size(mean * n * T)
    _check_size(2.0 * n * T / (low_s + high_s))
    state0 = (rng.random(n) < high_share).astype(np.int64)  # stationary start; sojourns are memoryless
    sojourn = np.array([low_s, high_s])

    def draw(rows, drawn, m):
        state = (state0[rows, None] + drawn + np.arange(m)) % 2
        return rng.standard_exponential((rows.size, m)) * sojourn[state]

    sw_rows, sw_times = _renewal(n, T, (low_s + high_s) / 2, 1.5, draw)
    # segments: [0, s1), [s1, s2), ..., [s_last, T) per function, in function then time order
    seg_rows = np.concatenate([np.arange(n), sw_rows])
    seg_start = np.concatenate([np.zeros(n), sw_times])
    order = np.lexsort((seg_start, seg_rows))
    seg_rows, seg_start = seg_rows[order], seg_start[order]
    first = np.searchsorted(seg_rows, np.arange(n))
    index = np.arange(seg_rows.size) - first[seg_rows]
    seg_end = np.append(seg_start[1:], T)
    last = np.append(seg_rows[1:] != seg_rows[:-1], True)
    seg_end[last] = T
    state = (state0[seg_rows] + index) % 2
    times, fids = _poisson_segments(rng, seg_rows, seg_start, seg_end, np.where(state == 1, rate * x, rate))
    resolved = {"rate": rate, "mmpp_x": x, "low_s": low_s, "high_s": high_s}
    return times, fids, np.full(n, mean), resolved


def _stratified(rng: np.random.Generator, k: int) -> np.ndarray:
    """k points in [0, 1), one uniform draw in each [i/k, (i+1)/k), ascending."""
    return (np.arange(k) + rng.random(k)) / k


def _scale_busy(shape: np.ndarray, total: float) -> np.ndarray | None:
    """Rates c * shape, each at least just over once a minute, summing to `total` (None if it cannot).

    `shape` is ascending; the functions that c * shape would put at or below 1/60 are lifted to
    the floor and c is solved again for the rest, until no more are lifted."""
    floor = MINUTELY * (1.0 + 1e-6)
    if shape.size == 0:
        return shape
    if total <= shape.size * floor:
        return None
    lifted = 0
    while True:
        c = (total - lifted * floor) / shape[lifted:].sum()
        now = int(np.searchsorted(shape, floor / c, side="right"))
        if now <= lifted:
            return np.maximum(c * shape, floor)
        lifted = now


def _zipf(rng, n, T, *, total_rate, zipf):
    """Poisson streams whose rates split `total_rate` by Zipf popularity: function i (from 0)
    gets a share (i + 1)^-zipf / sum_k k^-zipf, as `shoal loadtest longtail` splits its rate.
    E.g. 3 functions, zipf 1, 11 req/s: 6, 3 and 2 req/s."""
    total = 0.25 * n if total_rate is None else _number("total_rate", total_rate, lo=0.0)
    zipf = _number("zipf", zipf, lo=0.0)
    _check_size(total * T)
    weights = np.arange(1, n + 1, dtype=np.float64) ** -zipf
    rates = total * weights / weights.sum()
    times, fids = _superposed(rng, [0.0, T], rates[None, :])
    return times, fids, rates, {"total_rate": total, "zipf": zipf}


def _azure(rng, n, T, *, total_rate, min_rate, swing, period_s, timer_share):
    min_rate = _number("min_rate", min_rate, lo=0.0, hi=HOURLY, lo_open=True)
    total = 0.25 * n if total_rate is None else _number("total_rate", total_rate, lo=0.0, lo_open=True)
    swing = _number("swing", swing, lo=1.0)
    period = _number("period_s", period_s, lo=0.0, lo_open=True)
    timer_share = _number("timer_share", timer_share, lo=0.0, hi=1.0)
    a = (swing - 1.0) / (swing + 1.0)

    n_rare = (RARE_PERCENT * n + 50) // 100
    n_medium = (MEDIUM_PERCENT * n + 50) // 100
    if n_rare + n_medium >= n:  # tiny populations: keep one busy function
        n_medium = max(0, n - 1 - n_rare)
        n_rare = n - 1 - n_medium
    n_busy = n - n_rare - n_medium

    q = _stratified(rng, n_rare)
    if n_rare:
        q[0] = 0.0  # the rarest function is at min_rate exactly
    rare = min_rate * (HOURLY / min_rate) ** q  # [min_rate, 1/3600)
    medium = HOURLY * (MINUTELY / HOURLY) ** (1.0 - _stratified(rng, n_medium))  # (1/3600, 1/60]
    x = 1.0 - _stratified(rng, n_busy) * (1.0 - BUSY_SPAN**-BUSY_EXPONENT)
    busy = x ** (-1.0 / BUSY_EXPONENT)  # truncated power law on [1, BUSY_SPAN), ascending
    klass = np.repeat([0, 1, 2], [n_rare, n_medium, n_busy])

    # periodic timers among the infrequent functions whose period would be 1 min .. 1 day
    periods = np.asarray(TIMER_PERIODS_S)
    infrequent = np.concatenate([rare, medium])
    eligible = (infrequent >= 1.0 / periods[-1]) & (infrequent <= 1.0 / periods[0])
    timer = eligible & (rng.random(infrequent.size) < timer_share)
    cls = klass[: infrequent.size]
    allowed = np.where(cls[:, None] == 0, periods[None, :] >= 3600.0, periods[None, :] < 3600.0)
    distance = np.abs(np.log(periods[None, :] * infrequent[:, None]))
    nearest = periods[np.argmin(np.where(allowed, distance, np.inf), axis=1)]
    infrequent = np.where(timer, 1.0 / nearest, infrequent)

    busy = _scale_busy(busy, total - infrequent.sum())
    if busy is None:
        least = infrequent.sum() + n_busy * MINUTELY
        raise ValueError(f"total_rate={total_rate!r}: too small for {n} functions; the busiest {n_busy} must "
                         f"run more than once a minute, so total_rate must be > {least:.6g}")
    sorted_rates = np.concatenate([infrequent, busy])
    sorted_timer = np.concatenate([timer, np.zeros(n_busy, bool)])
    sorted_period = np.concatenate([np.where(timer, nearest, 0.0), np.zeros(n_busy)])

    # functions get their rates in random order, so fid says nothing about class
    perm = rng.permutation(n)  # function perm[i] gets the i-th drawn rate
    rates = np.empty(n)
    rates[perm] = sorted_rates
    is_timer = np.zeros(n, bool)
    is_timer[perm] = sorted_timer
    period_of = np.zeros(n)
    period_of[perm] = sorted_period
    _check_size(float(rates.sum()) * (1 + a) * T)

    # Poisson functions, modulated by a daily sine with a random phase each
    phase = rng.uniform(0.0, 2.0 * np.pi, n)
    times, fids = _superposed(rng, [0.0, T], np.where(is_timer, 0.0, rates * (1.0 + a))[None, :])
    keep = _sine_keep(rng, times, a, period, phase[fids])
    times, fids = times[keep], fids[keep]

    # timers: first firing uniform within a period, then every period, each late by up to the jitter
    tid = np.flatnonzero(is_timer)
    p = period_of[tid]
    first = rng.random(tid.size) * p
    fires = np.maximum(0, np.ceil((T - first) / p)).astype(np.int64)
    k = np.arange(int(fires.sum())) - np.repeat(np.cumsum(fires) - fires, fires)
    t_times = np.repeat(first, fires) + k * np.repeat(p, fires) + rng.random(k.size) * TIMER_JITTER_S
    t_fids = np.repeat(tid.astype(np.int32), fires)
    order = np.argsort(t_times, kind="stable")
    times, fids = _merge_sorted(times, fids, t_times[order], t_fids[order])

    resolved = {"total_rate": total, "min_rate": min_rate, "swing": swing, "period_s": period,
                "timer_share": timer_share}
    return times, fids, rates, resolved


# ---------------------------------------------------------------------- csv replay


def _csv_trace(*, seconds: float | None, path: Any, compress: float = 1.0) -> Trace:
    """Replay `timestamp` or `timestamp,function` rows, rebased to start at 0 and divided by
    `compress` (4: the same arrivals in a quarter of the time). A header is optional; one
    that names a `timestamp` column (any case) may have more columns, the rest ignored, and
    a `function` column names each row's function: the Azure LLM inference traces
    (`TIMESTAMP,ContextTokens,GeneratedTokens`) read as they are. A timestamp is seconds or
    an ISO 8601 date and time (`2023-11-16 18:17:03.9799600`)."""
    compress = _number("compress", compress, lo=0.0, lo_open=True)
    stamps: list[float] = []
    names: list[str] = []
    width = None
    columns: tuple[int, int | None] = (0, None)  # where the timestamp and the function are
    named = False  # a header named the timestamp column: more columns are allowed
    try:
        handle = open(path, newline="")
    except OSError as exc:
        raise ValueError(f"path={str(path)!r}: cannot read it ({exc.strerror or exc})") from exc
    with handle:
        try:
            reader = _csv.reader(handle)
            for row in reader:
                lineno = reader.line_num
                fields = [f.strip() for f in row]
                if not fields or fields == [""]:
                    continue
                if width is None and not stamps and _timestamp(fields[0]) is None:
                    width, columns = len(fields), _header_columns(fields, path, lineno)  # a header
                    named = "timestamp" in (f.lower() for f in fields)
                    continue
                if len(fields) > 2 and not named:
                    raise ValueError(f"{path}, line {lineno}: {len(fields)} columns; allowed: "
                                     f"'timestamp' or 'timestamp,function', or a header naming a 'timestamp' column")
                if width is not None and len(fields) != width:
                    raise ValueError(f"{path}, line {lineno}: {len(fields)} column(s) after rows of {width}")
                t = _timestamp(fields[columns[0]])
                if t is None:
                    raise ValueError(f"{path}, line {lineno}: timestamp {fields[columns[0]]!r} is not a number "
                                     f"or an ISO 8601 date and time")
                if not math.isfinite(t):
                    raise ValueError(f"{path}, line {lineno}: timestamp {fields[columns[0]]!r} is not finite")
                if width is None:
                    width = len(fields)
                    columns = (0, 1 if width == 2 else None)
                name_at = columns[1]
                if name_at is not None and not fields[name_at]:
                    raise ValueError(f"{path}, line {lineno}: empty function name")
                stamps.append(t)
                if name_at is not None:
                    names.append(fields[name_at])
        except _csv.Error as exc:
            raise ValueError(f"{path}, line {reader.line_num}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a text file ({exc.reason})") from exc
    if not stamps:
        raise ValueError(f"{path}: no timestamps")
    times = np.asarray(stamps, np.float64)
    times -= times.min()
    times /= compress
    if names:
        functions, fids = np.unique(np.asarray(names, dtype=object), return_inverse=True)
        # functions in order of first appearance in the file
        first_seen = np.full(functions.size, len(names))
        np.minimum.at(first_seen, fids, np.arange(len(names)))
        order = np.argsort(first_seen, kind="stable")
        remap = np.empty_like(order)
        remap[order] = np.arange(order.size)
        functions, fids = tuple(str(f) for f in functions[order]), remap[fids]
    else:
        functions, fids = ("f0000",), np.zeros(times.size, np.int64)
    if seconds is None:
        last = float(times.max())
        if last <= 0.0:
            raise ValueError(f"{path}: all timestamps are equal; give seconds= for the duration")
        duration = float(np.nextafter(last, math.inf))  # just past the last timestamp, so it is kept
    else:
        duration = seconds
    keep = times < duration
    times, fids = times[keep], fids[keep]
    order = np.argsort(times, kind="stable")
    counts = np.bincount(fids, minlength=len(functions))
    params = {"path": str(path), "seconds": seconds}
    if compress != 1.0:
        params["compress"] = compress
    return Trace("csv", duration, functions, times[order], fids[order], params, counts / duration)


def _timestamp(text: str) -> float | None:
    """Seconds, or an ISO 8601 date and time as seconds since the epoch (UTC when it names no
    zone; more than 6 digits of a second are cut to microseconds); None for neither."""
    try:
        return float(text)
    except ValueError:
        pass
    head, dot, fraction = text.partition(".")
    if dot:
        digits = len(fraction) - len(fraction.lstrip("0123456789"))
        text = f"{head}.{fraction[:min(digits, 6)]}{fraction[digits:]}" if digits else head + fraction
    try:
        stamp = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.timezone.utc)
    return stamp.timestamp()


def _header_columns(fields: list[str], path: Any, lineno: int) -> tuple[int, int | None]:
    """(timestamp column, function column or None) of a header row: the columns named
    `timestamp` and `function` in any case; without such names, a header of one or two
    columns is positional (as before); a wider one must name its timestamp column."""
    lower = [f.lower() for f in fields]
    if "timestamp" in lower:
        return lower.index("timestamp"), lower.index("function") if "function" in lower else None
    if len(fields) <= 2:
        return 0, 1 if len(fields) == 2 else None
    raise ValueError(f"{path}, line {lineno}: a header of {len(fields)} columns must name a 'timestamp' column")


# ---------------------------------------------------------------------- registry

_GENERATORS: dict[str, tuple[dict[str, Any], Callable[..., Any]]] = {
    "poisson": ({"rate": DEFAULT_RATE}, _poisson),
    "gamma": ({"rate": DEFAULT_RATE, "cv": 2.0}, _gamma),
    "step": ({"rate": DEFAULT_RATE, "step_at_s": None, "step_x": 4.0}, _step),
    "spike": ({"rate": DEFAULT_RATE, "spike_x": 10.0, "spike_s": 30.0, "spike_at_s": None}, _spike),
    "diurnal": ({"rate": DEFAULT_RATE, "swing": 2.0, "period_s": None, "phase": 0.0}, _diurnal),
    "mmpp": ({"rate": DEFAULT_RATE, "mmpp_x": 5.0, "low_s": 60.0, "high_s": 15.0}, _mmpp),
    "zipf": ({"total_rate": None, "zipf": 1.1}, _zipf),
    "azure": ({"total_rate": None, "min_rate": 1e-6, "swing": 2.0, "period_s": 86400.0, "timer_share": 0.3}, _azure),
    "csv": ({"path": _REQUIRED, "compress": 1.0}, None),
}

TRACE_KINDS: tuple[str, ...] = tuple(_GENERATORS)
