"""`decide()` for the looks of one tick, in one compiled pass over the functions.

The simulator looks at every function with traffic on every tick: about 700 looks a
simulated second in the 10,000-function Azure-like population. One look in Python is
a dozen calls and a new PolicyState, about 100,000 machine instructions, and most
looks change nothing: the count stays where it is and the state's averages move on.
Here the states of all functions live in arrays (`PolicyArrays`), and `decide_rows`
runs decide()'s arithmetic for all the looks of a tick in one loop compiled by numba.

It is decide(), not an approximation of it: the same floating-point operations in the
same order (Python's sum() is a left-to-right sum from 0, and so is each loop here), and
tests (tests/unit/test_policy_kernel.py) hold it to decide() look by look, state field
by state field. It commits a look only where decide() answers the current count with
STABLE or HOLD and no slice hint. Every other look, and every look it does not cover
(a function at zero or with no replica ready, its first look, a clock that went back,
more needs than its arrays hold), it leaves untouched and marks FALLBACK; the caller
then runs decide() itself on `get(fid)` and stores the result with `put(fid, state)`.
Changes of count are rare, so they keep decide()'s reasons and details.

A look's snapshot comes in as arrays with one duty for all of a function's ready
replicas (`duty_count` copies of `duty_value`), as the simulator measures it; and
`full_batch()` of its batch latencies comes in precomputed (`batch_rows`, NaN: none).

Pure: numpy and numba only; no clock. numba caches the compiled code, as for
placement/kernel.py.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from autoscaler.metrics import MetricsSnapshot
from autoscaler.policy import EPS, Budget, PolicyConfig, PolicyState, batch_budget_s, full_batch
from functions.spec import ScalingSpec

if EPS != 1e-9:  # written into the kernel below: numba's cache is keyed by this file alone
    raise ImportError(f"policy.EPS is {EPS}; policy_kernel assumes 1e-9")

# what decide_rows says of each look: committed at the current count with decide()'s reason
# (STABLE, HOLD, COLD_START: replicas starting for the requests held; FORECAST: a pre-warm due
# that keeps the count), or FALLBACK
STABLE, HOLD, FALLBACK, COLD_START, FORECAST = 0, 1, 2, 3, 4
CODES = {STABLE: "STABLE", HOLD: "HOLD", COLD_START: "COLD_START", FORECAST: "FORECAST"}

# PolicyConfig's numbers, in this order, as one float array (config_vector)
CONFIG = ("burst_window_s", "scale_down_delay_s", "max_scale_up_rate", "max_scale_down_rate", "slo_target_pct",
          "slo_max_boost", "max_duty", "batch_latency_share", "rate_window_s", "concurrency_window_s", "miss_budget",
          "dispersion_window_s", "budget_window_s", "budget_clean_windows", "budget_clean_share", "max_spare",
          "keep_alive_max_s", "gaps_kept", "gaps_min", "gap_min_s", "headroom_pct", "trend_window_s",
          "trend_max_boost", "default_cold_start_s", "onset_gap_s", "onsets_kept", "periodic_max_cv",
          "prewarm_margin_s", "periodic_keep_s", "slice_hot_duty", "slice_cold_duty", "slice_window_s", "min_slice",
          "max_slice", "kept_s", "burst_z")
(C_BURST, C_DELAY, C_UP_RATE, C_DOWN_RATE, C_SLO_PCT, C_SLO_BOOST, C_MAX_DUTY, C_BATCH_SHARE, C_RATE_W, C_CONC_W,
 C_MISS, C_DISP_W, C_BUDGET_W, C_CLEAN_WINDOWS, C_CLEAN_SHARE, C_MAX_SPARE, C_KEEP_MAX, C_GAPS_KEPT, C_GAPS_MIN,
 C_GAP_MIN, C_HEADROOM, C_TREND_W, C_TREND_BOOST, C_DEFAULT_COLD, C_ONSET_GAP, C_ONSETS_KEPT, C_PERIODIC_CV,
 C_PREWARM, C_PERIODIC_KEEP, C_HOT, C_COLD, C_SLICE_W, C_MIN_SLICE, C_MAX_SLICE, C_KEPT, C_Z) = range(len(CONFIG))

# ScalingSpec's numbers per function, in this order (spec_rows)
SPEC = ("slo_p95_ms", "target_concurrency", "target_duty", "min_replicas", "max_replicas", "idle_to_zero_s")
P_SLO, P_CONC, P_DUTY, P_MIN, P_MAX, P_IDLE = range(len(SPEC))

# the columns of PolicyArrays.numbers; NaN is None
(LAST_ACTIVE, DUTY_AVG, DUTY_SINCE, DUTY_LAST, SLICE_FRACTION, SLICE_AT, RATE_AVG, INFLIGHT_AVG, RATE_AT,
 BUDGET_SINCE, SPARE, CLEAN, LAST_OVER, SERVED, SERVED_OVER, FORECAST_AT, FORECAST_N, GAP_LOW, GAP_HIGH, RATE_VAR,
 RPS_LAST, RPS_LAST_AT, PEAK_AT, PEAK_N, N_NEEDS, N_ONSETS, N_GAPS, KIND) = range(28)
COLUMNS = 28
# KIND: no state yet, a state the kernel reads, or one only decide() may read (needs not in time order)
NO_STATE, IN_ARRAYS, SCALAR_ONLY = 0.0, 1.0, 2.0


def config_vector(config: PolicyConfig) -> np.ndarray:
    return np.array([float(getattr(config, name)) for name in CONFIG])


def spec_rows(specs: list[ScalingSpec]) -> np.ndarray:
    """Each function's ScalingSpec numbers, a row per function (SPEC's order)."""
    rows = [[float(getattr(s, name)) for name in SPEC] for s in specs]
    return np.array(rows, dtype=np.float64).reshape(-1, len(SPEC))


def _opt(x: float) -> float | None:
    return None if x != x else x


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


class PolicyArrays:
    """The PolicyState of every function, as arrays: `numbers` (one row per function,
    the columns above), and the needs, onsets and idle gaps, left-aligned per row with
    their counts in `numbers`. `get` and `put` convert one function's state."""

    FALLBACK = FALLBACK  # the code of a look handed back, for callers that need not import the module

    def __init__(self, functions: int, config: PolicyConfig, needs_capacity: int = 64):
        self.config = config
        self.numbers = np.full((functions, COLUMNS), np.nan)
        self.numbers[:, [SPARE, CLEAN, SERVED, SERVED_OVER, RATE_VAR, N_NEEDS, N_ONSETS, N_GAPS, KIND]] = 0.0
        self.needs_t = np.zeros((functions, max(2, needs_capacity)))
        self.needs_n = np.zeros((functions, max(2, needs_capacity)))
        self.onsets = np.zeros((functions, config.onsets_kept))
        self.gaps = np.zeros((functions, config.gaps_kept))
        self.vector = config_vector(config)

    def __len__(self) -> int:
        return len(self.numbers)

    def get(self, fid: int) -> PolicyState | None:
        row = self.numbers[fid].tolist()
        if row[KIND] == NO_STATE:
            return None
        k, o, g = int(row[N_NEEDS]), int(row[N_ONSETS]), int(row[N_GAPS])
        needs = tuple(zip(self.needs_t[fid, :k].tolist(), self.needs_n[fid, :k].tolist()))
        since = _opt(row[BUDGET_SINCE])
        return PolicyState(
            last_active_at=_opt(row[LAST_ACTIVE]), needs=needs, onsets=tuple(self.onsets[fid, :o].tolist()),
            duty_avg=_opt(row[DUTY_AVG]), duty_since=_opt(row[DUTY_SINCE]), duty_last=_opt(row[DUTY_LAST]),
            slice_fraction=_opt(row[SLICE_FRACTION]), slice_at=_opt(row[SLICE_AT]), rate_avg=_opt(row[RATE_AVG]),
            inflight_avg=_opt(row[INFLIGHT_AVG]), rate_at=_opt(row[RATE_AT]),
            budget=None if since is None else Budget(since, int(row[SPARE]), int(row[CLEAN]), row[LAST_OVER]),
            served=row[SERVED], served_over=row[SERVED_OVER],
            forecast=None if row[FORECAST_AT] != row[FORECAST_AT] else (row[FORECAST_AT], row[FORECAST_N]),
            gaps=tuple(self.gaps[fid, :g].tolist()),
            gap_quantiles=None if row[GAP_LOW] != row[GAP_LOW] else (row[GAP_LOW], row[GAP_HIGH]),
            rate_var=row[RATE_VAR], rps_last=_opt(row[RPS_LAST]),
            peak=None if row[PEAK_AT] != row[PEAK_AT] else (row[PEAK_AT], row[PEAK_N]),
            rps_last_at=_opt(row[RPS_LAST_AT]))

    def put(self, fid: int, state: PolicyState) -> None:
        if len(state.onsets) > self.onsets.shape[1] or len(state.gaps) > self.gaps.shape[1]:
            raise ValueError(f"a state with {len(state.onsets)} onsets and {len(state.gaps)} gaps, for a config "
                             f"that keeps {self.onsets.shape[1]} and {self.gaps.shape[1]}")
        if len(state.needs) > self.needs_t.shape[1]:
            self._grow(2 * len(state.needs))
        b = state.budget
        f, p, q = state.forecast, state.peak, state.gap_quantiles
        times = [t for t, _ in state.needs]
        in_order = all(a <= c for a, c in zip(times, times[1:]))
        self.numbers[fid] = (
            _nan(state.last_active_at), _nan(state.duty_avg), _nan(state.duty_since), _nan(state.duty_last),
            _nan(state.slice_fraction), _nan(state.slice_at), _nan(state.rate_avg), _nan(state.inflight_avg),
            _nan(state.rate_at), math.nan if b is None else b.since, 0 if b is None else b.spare,
            0 if b is None else b.clean, math.nan if b is None else b.last_over, state.served, state.served_over,
            math.nan if f is None else f[0], math.nan if f is None else f[1],
            math.nan if q is None else q[0], math.nan if q is None else q[1], state.rate_var,
            _nan(state.rps_last), _nan(state.rps_last_at),
            math.nan if p is None else p[0], math.nan if p is None else p[1],
            len(state.needs), len(state.onsets), len(state.gaps), IN_ARRAYS if in_order else SCALAR_ONLY)
        k = len(state.needs)
        self.needs_t[fid, :k] = times
        self.needs_n[fid, :k] = [n for _, n in state.needs]
        self.onsets[fid, :len(state.onsets)] = state.onsets
        self.gaps[fid, :len(state.gaps)] = state.gaps

    def _grow(self, capacity: int) -> None:
        for name in ("needs_t", "needs_n"):
            old = getattr(self, name)
            grown = np.zeros((old.shape[0], capacity))
            grown[:, :old.shape[1]] = old
            setattr(self, name, grown)

    def decide(self, fids: np.ndarray, now: float, ready: np.ndarray, starting: np.ndarray, inflight: np.ndarray,
               activator_queue: np.ndarray, duty_value: np.ndarray, duty_count: np.ndarray, rps: np.ndarray,
               p95_s: np.ndarray, cold_start_s: np.ndarray, slice_fraction: np.ndarray, service_s: np.ndarray,
               batch_rows: np.ndarray, batch_seconds: np.ndarray, over_slo: np.ndarray, window_s: np.ndarray,
               specs: np.ndarray, lead_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """decide() for the looks of `fids` at `now` (each snapshot a row of the arrays; NaN is
        None), with each function's spec_rows(); (desired, code, quiet) per look: code STABLE,
        HOLD, COLD_START or FORECAST (CODES) where the look was committed at the current count
        (its state is stored), FALLBACK where decide() must run. quiet: for a committed look of
        an idle function, quiet_until() with `lead_s`; else 0."""
        n = len(fids)
        desired = np.zeros(n, np.int64)
        code = np.zeros(n, np.int64)
        quiet = np.zeros(n)
        decide_rows(np.ascontiguousarray(fids, np.int64), float(now), _i64(ready), _i64(starting), _f64(inflight),
                    _f64(activator_queue), _f64(duty_value), _i64(duty_count), _f64(rps), _f64(p95_s),
                    _f64(cold_start_s), _f64(slice_fraction), _f64(service_s), _f64(batch_rows),
                    _f64(batch_seconds), _f64(over_slo), _f64(window_s), specs, self.vector, self.numbers,
                    self.needs_t, self.needs_n, self.onsets, self.gaps, _f64(lead_s), desired, code, quiet)
        return desired, code, quiet


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float64)


# ---------------------------------------------------------------------- the compiled pass


@njit(cache=True)
def _ceil(x):
    return math.ceil(x - 1e-6) if x > 0 else 0


@njit(cache=True)
def _bound(n, spec):
    hi = int(spec[P_MAX])
    if n > hi:
        n = hi
    lo = int(spec[P_MIN])
    return lo if n < lo else n


@njit(cache=True)
def _window_start(now, window_s):
    """policy.window_start: now - window_s - EPS, always before now."""
    cutoff = now - window_s - 1e-9
    return cutoff if cutoff < now else np.nextafter(now, -np.inf)


@njit(cache=True)
def _left_sum(value, count):
    """sum((value,) * count) as Python computes it: from 0, left to right."""
    total = 0.0
    for _ in range(count):
        total += value
    return total


@njit(cache=True)
def _next_onset(onsets, count, c):
    """next_onset(); NaN for None."""
    if count < 3:
        return math.nan
    total = 0.0
    for j in range(1, count):
        total += onsets[j] - onsets[j - 1]
    mean = total / (count - 1)
    if mean <= 0:
        return math.nan
    square = 0.0
    for j in range(1, count):
        d = (onsets[j] - onsets[j - 1]) - mean
        square += d * d
    sd = math.sqrt(square / (count - 1))
    if sd / mean > c[C_PERIODIC_CV]:
        return math.nan
    return onsets[count - 1] + mean


@njit(cache=True)
def _first_after(times, count, cutoff):
    """bisect_right(times[:count], cutoff) for times in order: how many are <= cutoff."""
    j = 0
    while j < count and times[j] <= cutoff:
        j += 1
    return j


@njit(cache=True)
def decide_rows(fids, now, ready, starting, inflight, aq, duty_value, duty_count, rps, p95, cold, slice_fraction,
                service, batch_rows, batch_seconds, over_slo, window_s, specs, c, numbers, needs_t, needs_n, onsets,
                gaps, lead_s, desired, code, quiet):
    gap_buf = np.zeros(gaps.shape[1])
    onset_buf = np.zeros(onsets.shape[1])
    for i in range(len(fids)):
        code[i] = _look(i, fids[i], now, ready, starting, inflight, aq, duty_value, duty_count, rps, p95, cold,
                        slice_fraction, service, batch_rows, batch_seconds, over_slo, window_s, specs, c, numbers,
                        needs_t, needs_n, onsets, gaps, lead_s, desired, quiet, gap_buf, onset_buf)


@njit(cache=True)
def _look(i, f, now, ready_a, starting_a, inflight_a, aq_a, duty_value_a, duty_count_a, rps_a, p95_a, cold_a,
          slice_a, service_a, brows_a, bsec_a, over_a, window_a, specs, c, numbers, needs_t, needs_n, onsets, gaps,
          lead_a, desired_out, quiet_out, gap_buf, onset_buf):
    row = numbers[f]
    spec = specs[f]
    ready = ready_a[i]
    current = ready + starting_a[i]
    if row[KIND] != IN_ARRAYS or current == 0:
        return FALLBACK
    last = row[LAST_ACTIVE]
    k = int(row[N_NEEDS])
    nt = needs_t[f]
    nn = needs_n[f]
    if last != last or row[RATE_AVG] != row[RATE_AVG] or row[RATE_AT] != row[RATE_AT] \
            or row[INFLIGHT_AVG] != row[INFLIGHT_AVG] or row[BUDGET_SINCE] != row[BUDGET_SINCE] \
            or (k > 0 and now < nt[k - 1]) or now < last:
        return FALLBACK
    inflight = inflight_a[i]
    aq = aq_a[i]
    rps = rps_a[i]
    demand = inflight + aq
    active = demand > 0 or rps > 0
    duty_n = duty_count_a[i]
    duty_sum = _left_sum(duty_value_a[i], duty_n)

    # the idle gaps and onsets (decide(), _activity)
    n_gaps = int(row[N_GAPS])
    gap_low, gap_high = row[GAP_LOW], row[GAP_HIGH]
    gaps_changed = False
    if active and now - last >= c[C_GAP_MIN]:
        kept = int(c[C_GAPS_KEPT])
        m = 0
        for j in range(max(0, n_gaps + 1 - kept), n_gaps):
            gap_buf[m] = gaps[f, j]
            m += 1
        gap_buf[m] = now - last
        n_gaps = m + 1
        gaps_changed = True
        if n_gaps < int(c[C_GAPS_MIN]):
            gap_low, gap_high = math.nan, math.nan
        else:
            ordered = np.sort(gap_buf[:n_gaps])  # a sorted copy
            gap_low = ordered[math.ceil(0.1 * n_gaps) - 1]
            gap_high = ordered[math.ceil(0.9 * n_gaps) - 1]
    n_onsets = int(row[N_ONSETS])
    onsets_changed = False
    last_active = last
    if active:
        if now - last >= c[C_ONSET_GAP]:
            kept = int(c[C_ONSETS_KEPT])
            m = 0
            for j in range(max(0, n_onsets + 1 - kept), n_onsets):
                onset_buf[m] = onsets[f, j]
                m += 1
            onset_buf[m] = now
            n_onsets = m + 1
            onsets_changed = True
        last_active = now

    # the error budget (_budget_sample); rate_at and the budget are known past the first look
    since_b = row[BUDGET_SINCE]
    spare = int(row[SPARE])
    clean = int(row[CLEAN])
    last_over = row[LAST_OVER]
    served = rps * (now - row[RATE_AT]) if ready else 0.0
    requests = row[SERVED] + served
    over = row[SERVED_OVER] + served * over_a[i]
    if now - since_b < c[C_BUDGET_W] - 1e-9:
        served_total, served_over = requests, over
    else:
        fraction = over / requests if requests > 0 else 0.0
        if fraction > c[C_MISS]:
            spare = min(spare + 1, int(c[C_MAX_SPARE]))
            clean = 0
        elif fraction < c[C_MISS] * c[C_CLEAN_SHARE]:
            clean += 1
            if clean >= int(c[C_CLEAN_WINDOWS]) and spare:
                spare, clean = spare - 1, 0
        else:
            clean = 0
        since_b, last_over, served_total, served_over = now, fraction, 0.0, 0.0

    # the rate's variance (_variance_sample)
    rate_var, rps_last, rps_last_at = row[RATE_VAR], row[RPS_LAST], row[RPS_LAST_AT]
    window = window_a[i]
    if window != 0 and c[C_DISP_W] > 0:
        if rps_last != rps_last or rps_last_at != rps_last_at:
            rps_last, rps_last_at = rps, now
        else:
            since_v = now - rps_last_at
            if not (since_v < window - 1e-9 or since_v <= 0.0):
                diff = rps - rps_last
                sample = diff * diff * window * 0.5
                rate_var = rate_var + (sample - rate_var) * (1.0 - math.exp(-since_v / c[C_DISP_W]))
                rps_last, rps_last_at = rps, now

    # the averaged rate and in-flight (_rate_sample)
    since_r = now - row[RATE_AT]
    since_r = since_r if since_r > 0.0 else 0.0
    weight = 1.0 - math.exp(-since_r / c[C_RATE_W])
    inflight_avg = inflight
    if c[C_CONC_W] > 0:
        inflight_avg = row[INFLIGHT_AVG] + (inflight - row[INFLIGHT_AVG]) * (
            weight if c[C_CONC_W] == c[C_RATE_W] else 1.0 - math.exp(-since_r / c[C_CONC_W]))
    rate_avg = row[RATE_AVG] + (rps - row[RATE_AVG]) * weight

    # estimate_need
    p95 = p95_a[i]
    svc = service_a[i]
    has_service = svc == svc and svc != 0.0
    slo_target_s = spec[P_SLO] / 1000.0 * c[C_SLO_PCT] / 100.0
    target_concurrency = spec[P_CONC]
    rows_b = brows_a[i]
    batched = rows_b == rows_b
    seconds_b = bsec_a[i]
    if batched:
        per_replica = rows_b * slo_target_s / seconds_b
        if per_replica > target_concurrency:
            target_concurrency = per_replica
    if batched and rate_avg > 0:
        measured = rate_avg * seconds_b / rows_b
    else:
        measured = rate_avg * svc if has_service else 0.0
        if duty_sum > measured:
            measured = duty_sum
    has_ratio = p95 == p95 and ready > 0
    ratio = p95 / slo_target_s if has_ratio else 0.0
    if not has_ratio or ratio >= 1:
        duty_target = spec[P_DUTY]
    else:
        high = c[C_MAX_DUTY] if c[C_MAX_DUTY] > spec[P_DUTY] else spec[P_DUTY]
        low = c[C_HEADROOM] / 100.0
        if ratio <= low:
            duty_target = high
        else:
            duty_target = spec[P_DUTY] + (high - spec[P_DUTY]) * (1 - ratio) / (1 - low)
    by_work = measured / duty_target
    by_concurrency = (inflight_avg + aq) / target_concurrency
    by_conc = by_concurrency > by_work  # need.by == "concurrency"
    need = by_concurrency if by_conc else by_work
    if has_ratio and ratio > 1 and measured > 0:
        boost = c[C_SLO_BOOST] if c[C_SLO_BOOST] < ratio else ratio
        if by_work * boost > need:
            need = by_work * boost
            by_conc = False
    if rate_var > 0.0 and not batched and has_service and rate_avg > 0:
        w = spec[P_SLO] / 1000.0 - svc
        if w > svc:
            mean = rate_avg * w
            tail = mean + c[C_Z] * math.sqrt(rate_var * w)
            by_burst = tail * svc / w
            if by_burst > need:
                need = by_burst
                by_conc = False
    if spare and need > 0 and ready:
        need = need + spare
        by_conc = False
    # a backlog held through a cold start is not a need to remember
    kept_need = float(current) if ready == 0 and by_conc else need

    # the kept needs (_kept_needs): from the newest one older than the longest window
    first_inside = _first_after(nt, k, _window_start(now, c[C_KEPT]))
    drop = first_inside - 1 if first_inside > 0 else 0
    new_k = k - drop + 1
    if new_k > nt.shape[0]:
        return FALLBACK

    # the delay window's peak (_window_peak), over the kept needs and (now, need)
    delay = c[C_DELAY]
    peak_at, peak_n = row[PEAK_AT], row[PEAK_N]
    second_t = nt[k - 1] if k - drop >= 1 else math.nan  # needs[-2] once (now, kept_need) is added
    if peak_at == peak_at and _window_start(now, delay) < peak_at < now and new_k > 1 and second_t <= now:
        if not peak_n > kept_need:
            peak_at, peak_n = now, kept_need
    else:
        peak_at, peak_n = now, kept_need
        start = _first_after(nt[drop:k], k - drop, _window_start(now, delay))
        for j in range(k - 1, drop + start - 1, -1):  # the newest first: the latest of equals
            if nn[j] > peak_n:
                peak_at, peak_n = nt[j], nn[j]

    # the duty average (_duty_sample)
    duty_avg, duty_since, duty_last = row[DUTY_AVG], row[DUTY_SINCE], row[DUTY_LAST]
    if duty_n > 0:
        mean_d = duty_sum / duty_n
        if duty_avg != duty_avg or duty_last != duty_last:
            duty_avg, duty_since, duty_last = mean_d, now, now
        else:
            since_d = now - duty_last
            weight_d = 1.0 - math.exp(-(since_d if since_d > 0.0 else 0.0) / c[C_SLICE_W])
            duty_avg, duty_last = duty_avg + (mean_d - duty_avg) * weight_d, now

    # _scale, on the needs as they will be: nt/nn[drop:k] then (now, kept_need)
    delay_peak = peak_n
    lead = cold_a[i] if cold_a[i] == cold_a[i] else c[C_DEFAULT_COLD]
    result = -1
    if ready == 0 and by_conc:
        result = COLD_START  # the starting replicas will take the requests held
    if result < 0:
        burst = 0.0
        if not (c[C_BURST] <= delay and _ceil(delay_peak) <= current):
            burst = kept_need
            for j in range(drop + _first_after(nt[drop:k], k - drop, _window_start(now, c[C_BURST])), k):
                if nn[j] > burst:
                    burst = nn[j]
        trend = 0.0
        if _ceil(kept_need * c[C_TREND_BOOST]) > current:  # the latest need x the boost: else it cannot matter
            trend = _trend_over(nt, nn, drop, k, now, kept_need, lead + 1.0, c)
        up = _ceil(burst if burst > trend else trend)
        if up > current:
            d = _bound(min(up, math.ceil(current * c[C_UP_RATE])), spec)
            if d > current:
                return FALLBACK
        idle_s = now - last_active
        if demand == 0 and int(spec[P_MIN]) == 0:  # _to_zero
            onset = _next_onset(onset_buf if onsets_changed else onsets[f], n_onsets, c)
            if onset == onset:
                if onset - lead - c[C_PREWARM] <= now <= onset + c[C_PREWARM]:
                    if _bound(current, spec) != current:
                        return FALLBACK
                    result = FORECAST  # a pre-warm due, at the count there is
                elif idle_s >= c[C_PERIODIC_KEEP] and onset - now > lead + c[C_PREWARM]:
                    gm = int(c[C_GAPS_MIN])
                    all_long = True
                    for j in range(max(0, n_gaps - gm), n_gaps):
                        g = gap_buf[j] if gaps_changed else gaps[f, j]
                        if not g >= c[C_ONSET_GAP]:
                            all_long = False
                    if all_long:
                        return FALLBACK  # early TO_ZERO
            if result < 0 and idle_s >= _keep_alive_row(gap_low, gap_high, spec, c):
                return FALLBACK  # TO_ZERO
    if result < 0:
        if duty_n < ready and demand == 0 and need == 0:
            return FALLBACK  # NO_DATA
        # _scale_down
        seen_for = now - (nt[drop] if k - drop > 0 else now)
        wanted = _ceil(delay_peak)
        fat = row[FORECAST_AT]
        if fat == fat and now - fat < delay - 1e-9:
            held = _ceil(row[FORECAST_N])
            if held > wanted:
                wanted = held
        floor = int(spec[P_MIN]) if spec[P_MIN] > 1 else 1
        if wanted < floor:
            wanted = floor
        if _bound(current, spec) != current:
            return FALLBACK
        result = STABLE
        if wanted < current:
            if seen_for < delay - 1e-9:
                result = HOLD
            else:
                d = _bound(max(wanted, math.ceil(current / c[C_DOWN_RATE])), spec)
                if d != current:
                    return FALLBACK
    # _with_slice_hint: a hint falls back
    cs = slice_a[i]
    if ready > 0 and cs == cs and duty_avg == duty_avg \
            and not (row[SLICE_AT] == row[SLICE_AT] and now - row[SLICE_AT] < c[C_SLICE_W]) \
            and duty_since == duty_since and not now - duty_since < c[C_SLICE_W] and duty_n > 0:
        if duty_avg >= c[C_HOT] and cs * 2 <= c[C_MAX_SLICE] + 1e-9:
            return FALLBACK
        if duty_avg <= c[C_COLD] and ready == 1 and p95 == p95 and p95 * 2 <= slo_target_s \
                and cs / 2 >= c[C_MIN_SLICE] - 1e-9:
            return FALLBACK

    # commit: the state decide() returns, and the count it keeps
    for j in range(drop, k):
        nt[j - drop] = nt[j]
        nn[j - drop] = nn[j]
    nt[new_k - 1] = now
    nn[new_k - 1] = kept_need
    if gaps_changed:
        for j in range(n_gaps):
            gaps[f, j] = gap_buf[j]
    if onsets_changed:
        for j in range(n_onsets):
            onsets[f, j] = onset_buf[j]
    row[LAST_ACTIVE] = last_active
    row[DUTY_AVG], row[DUTY_SINCE], row[DUTY_LAST] = duty_avg, duty_since, duty_last
    row[RATE_AVG], row[INFLIGHT_AVG], row[RATE_AT] = rate_avg, inflight_avg, now
    row[BUDGET_SINCE], row[SPARE], row[CLEAN], row[LAST_OVER] = since_b, spare, clean, last_over
    row[SERVED], row[SERVED_OVER] = served_total, served_over
    row[GAP_LOW], row[GAP_HIGH] = gap_low, gap_high
    row[RATE_VAR], row[RPS_LAST], row[RPS_LAST_AT] = rate_var, rps_last, rps_last_at
    row[PEAK_AT], row[PEAK_N] = peak_at, peak_n
    row[N_NEEDS], row[N_ONSETS], row[N_GAPS] = new_k, n_onsets, n_gaps
    desired_out[i] = current
    quiet_out[i] = 0.0
    if demand == 0 and rps == 0 and starting_a[i] == 0:
        quiet_out[i] = _quiet_until(row, spec, onsets[f], gaps, f, nt, nn, new_k, current, now, lead_a[i], c)
    return result


@njit(cache=True)
def _keep_alive_row(low, high, spec, c):
    idle = spec[P_IDLE]
    if c[C_KEEP_MAX] <= 0 or low != low:
        return idle
    high = high * 1.1
    if high <= c[C_KEEP_MAX]:
        return high if high > idle else idle
    if low >= 2 * idle:
        return c[C_PERIODIC_KEEP] if c[C_PERIODIC_KEEP] < idle else idle
    return idle


@njit(cache=True)
def _trend_over(nt, nn, drop, k, now, need, lead, c):
    """trend_need() over nt/nn[drop:k] followed by (now, need), without writing them."""
    m_all = k - drop + 1
    if m_all < 3:
        return 0.0
    a = nn[k - 2] if k - drop >= 2 else 0.0
    b = nn[k - 1]
    if not (a < b < need):
        return 0.0
    cutoff = _window_start(now, c[C_TREND_W])
    start = drop + _first_after(nt[drop:k], k - drop, cutoff)
    m = k - start + 1
    if m < 3:
        return 0.0
    st = 0.0
    for j in range(start, k):
        st += nt[j]
    st += now
    sn = 0.0
    for j in range(start, k):
        sn += nn[j]
    sn += need
    mean_t = st / m
    mean_n = sn / m
    var_t = 0.0
    for j in range(start, k):
        d = nt[j] - mean_t
        var_t += d * d
    d = now - mean_t
    var_t += d * d
    if var_t <= 0:
        return 0.0
    cov = 0.0
    for j in range(start, k):
        cov += (nt[j] - mean_t) * (nn[j] - mean_n)
    cov += (now - mean_t) * (need - mean_n)
    slope = cov / var_t
    if slope <= 0 or need <= 0:
        return 0.0
    return min(need + slope * lead, need * c[C_TREND_BOOST])


@njit(cache=True)
def _quiet_until(row, spec, onsets_f, gaps, f, nt, nn, k, current, now, lead, c):
    """quiet_until() of the state just stored."""
    last = row[LAST_ACTIVE]
    best = last + _keep_alive_row(row[GAP_LOW], row[GAP_HIGH], spec, c)
    onset = _next_onset(onsets_f, int(row[N_ONSETS]), c)
    if onset == onset:
        x = last + c[C_PERIODIC_KEEP]
        if x < best:
            best = x
        x = onset - lead - c[C_PREWARM]
        if x < best:
            best = x
    floor = int(spec[P_MIN]) if spec[P_MIN] > 1 else 1
    if current > floor:
        at = nt[0] if k > 0 else now
        for j in range(k - 1, -1, -1):
            if _ceil(nn[j]) >= current:
                at = nt[j]
                break
        x = at + c[C_DELAY]
        if x < best:
            best = x
    return now if now > best else best


def snapshot_rows(snapshots: list[MetricsSnapshot], specs: list[ScalingSpec], config: PolicyConfig) -> dict:
    """The arrays PolicyArrays.decide reads, from snapshots (each one's replicas sharing one
    duty), as keywords; for tests and callers that have snapshots rather than arrays."""
    def batch(s: MetricsSnapshot, spec: ScalingSpec) -> tuple[float, float]:
        found = full_batch(s.batch_latency_s, batch_budget_s(spec, config))
        return (math.nan, math.nan) if found is None else found

    for s in snapshots:
        if any(d != s.duty[0] for d in s.duty):
            raise ValueError(f"{s.function}: replicas with different duties ({s.duty}) do not fit one row")
    batches = [batch(s, spec) for s, spec in zip(snapshots, specs)]
    return dict(
        ready=np.array([s.ready for s in snapshots], np.int64),
        starting=np.array([s.starting for s in snapshots], np.int64),
        inflight=np.array([s.inflight for s in snapshots], float),
        activator_queue=np.array([s.activator_queue for s in snapshots], float),
        duty_value=np.array([s.duty[0] if s.duty else 0.0 for s in snapshots], float),
        duty_count=np.array([len(s.duty) for s in snapshots], np.int64),
        rps=np.array([s.rps for s in snapshots], float),
        p95_s=np.array([_nan(s.p95_s) for s in snapshots], float),
        cold_start_s=np.array([_nan(s.cold_start_s) for s in snapshots], float),
        slice_fraction=np.array([_nan(s.slice_fraction) for s in snapshots], float),
        service_s=np.array([_nan(s.service_s) for s in snapshots], float),
        batch_rows=np.array([b[0] for b in batches], float), batch_seconds=np.array([b[1] for b in batches], float),
        over_slo=np.array([s.over_slo for s in snapshots], float),
        window_s=np.array([s.window_s for s in snapshots], float))
