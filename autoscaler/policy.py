"""Shoal's scaling policy: `decide(snapshot, spec, state, now) -> (ScaleDecision, state)`, pure.
It sizes each function on the work its replicas' slices do (duty cycle and executor time, at
full batches for a model that batches), on concurrency, on p95 against the SLO with an error
budget, and, for a model that does not batch, on the bursts one SLO window can hold; replicas
still starting count as capacity; it goes to zero when the function's own idle gaps say so and
warms it again before a forecast onset, each start from zero on the least slice that serves it;
every decision carries its reason and the numbers. Every default is in `PolicyConfig`. Nothing
here reads a clock. The design, with the numbers worked out: docs/design/policy.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import Final

from autoscaler.record import Record, set_once
from autoscaler.snapshot import MetricsSnapshot
from functions.spec import ScalingSpec

REASONS = ("STABLE", "BURST", "SLO", "COLD_START", "FORECAST", "TO_ZERO", "HOLD", "NO_DATA", "SLICE", "RESERVE")
EPS: Final = 1e-9
MISSED_RISE: Final = 0.5  # a burst that missed rose by at least half a replica (_missed_sample) ...
MISSED_SHORT: Final = 3.0  # ... and missed for at most 3 cold starts and looks


class ScaleDecision(Record):
    """What decide() answers; immutable."""

    def __init__(self, desired: int, reason: str, detail: str = "",
                 slice_fraction: float | None = None) -> None:  # new replicas should use this share of a device
        self.desired: Final = desired
        self.reason: Final = reason
        self.detail: Final = detail
        self.slice_fraction: Final = slice_fraction

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Every knob of the policy, with its default; validated on construction."""

    burst_window_s: float = 6.0  # the max need over this window scales up at once
    scale_down_delay_s: float = 30.0  # scale down only after a whole window of lower need
    max_scale_up_rate: float = 10.0  # at most current x 10 per decision (from zero: unbounded)
    max_scale_down_rate: float = 2.0  # at most halve per decision
    slo_target_pct: float = 80.0  # aim p95 at 80 % of the SLO
    slo_max_boost: float = 3.0  # p95 over target raises the need by at most 3x (2 to 2026-12-02)
    max_duty: float = 0.9  # how hot replicas may run while p95 has headroom
    batch_latency_share: float = 0.5  # a batch may take this share of the p95 target (the rest: waiting for one)
    rate_window_s: float = 5.0  # the work view reads the request rate averaged (EWMA) over this
    concurrency_window_s: float = 5.0  # the concurrency view reads in-flight averaged over this (0: as it is)
    miss_budget: float = 0.001  # error budget: at most 0.1 % of requests slower than the SLO
    dispersion_window_s: float = 60.0  # the burst view reads the rate's variance averaged over this (0: off)
    budget_window_s: float = 30.0  # misses are judged over windows this long
    budget_clean_windows: int = 40  # a spare replica goes after this many windows in a row (20 min) ...
    budget_clean_share: float = 0.25  # ... under this share of the budget
    max_spare: int = 4  # spare replicas the error budget may add
    # the budget counts the gateway's answers and leaves out those of a start from zero, at any
    # tick phase (_budget_sample); off: the replicas' rps, which counts them at some phases
    # only. Off by the bench's rule (docs/policy-changes.md, "The error budget and a start from zero")
    budget_skips_starts: bool = False
    # the keep-alive keeps an idle replica this long at most, unless the function's spec sets its own
    # (ScalingSpec.keep_alive_max_s); 0: off for every function, each going at its idle_to_zero_s
    keep_alive_max_s: float = 1800.0
    miss_price_slice_s: float = 240.0  # a request that misses its SLO in a cold start is worth this many
    # slice-seconds of an idle replica: keep-alive and the reserve weigh the one against the other (0: off)
    reserve_memory_s: float = 600.0  # the reserve remembers the need's rises within a cold start this long
    # a rise is read over a cold start and a look plus this many rate windows: the need reads the
    # rate's EWMA, which shows a step only as 1 - e^(-t / rate_window_s) of it t seconds on (0: off)
    rise_lag_windows: float = 0.5
    gaps_kept: int = 16  # idle gaps remembered per function
    gaps_min: int = 4  # gaps needed before the keep-alive follows them
    few_gaps_keep_x: float = 30.0  # with fewer, a priced cold start's break-even, at most this x idle_to_zero_s
    gap_min_s: float = 2.0  # silences shorter than this are not gaps
    headroom_pct: float = 50.0  # p95 at or below this share of its target is headroom
    trend_window_s: float = 30.0  # forecast: slope of the need over this window
    trend_max_boost: float = 1.5  # the trend may raise the need by at most 1.5x
    default_cold_start_s: float = 2.0  # until one is measured
    onset_gap_s: float = 20.0  # traffic after this much silence is an onset
    onsets_kept: int = 4  # periodic detection looks at the last 3 gaps
    periodic_max_cv: float = 0.1  # gaps this regular make a timer
    prewarm_margin_s: float = 3.0  # warm this long before the expected onset (plus the cold start)
    periodic_keep_s: float = 10.0  # a timer's replica goes this long after its traffic stops
    slice_hints: bool = True  # ask for a larger or smaller slice (off: replicas keep the slice they start on)
    # a lone replica kept idle past the spec's idle_to_zero_s asks for the least slice that serves
    # a start (as a start from zero does: _start_slice), since it idles on it (off: only duty shrinks it)
    idle_shrink: bool = True
    slice_hot_duty: float = 0.85
    slice_cold_duty: float = 0.15
    slice_window_s: float = 300.0  # duty averaged (EWMA time constant) and changes spaced by this
    min_slice: float = 0.125
    max_slice: float = 1.0

    kept_s: float = field(init=False, repr=False, compare=False, default=0.0)  # the longest window, derived
    burst_z: float = field(init=False, repr=False, compare=False, default=0.0)  # normal quantile of 1 - miss_budget

    def __post_init__(self) -> None:
        object.__setattr__(self, "kept_s", max(self.burst_window_s, self.scale_down_delay_s, self.trend_window_s))
        if 0 < self.miss_budget < 1:
            object.__setattr__(self, "burst_z", NormalDist().inv_cdf(1.0 - self.miss_budget))
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{f.name} ({value!r}) must be a finite number >= 0")
        if self.max_scale_up_rate <= 1 or self.max_scale_down_rate <= 1:
            raise ValueError(f"max_scale_up_rate ({self.max_scale_up_rate}) and max_scale_down_rate "
                             f"({self.max_scale_down_rate}) must be > 1")
        if not 0 < self.max_duty <= 1 or not 0 <= self.headroom_pct < 100:
            raise ValueError(f"max_duty ({self.max_duty}) must be within (0, 1] and headroom_pct "
                             f"({self.headroom_pct}) within [0, 100)")
        if not 0 < self.batch_latency_share <= 1:
            raise ValueError(f"batch_latency_share ({self.batch_latency_share}) must be within (0, 1]")
        if not 0 < self.slo_target_pct <= 100:
            raise ValueError(f"slo_target_pct ({self.slo_target_pct}) must be within (0, 100]")
        if self.slo_max_boost < 1 or self.trend_max_boost < 1:
            raise ValueError(f"slo_max_boost ({self.slo_max_boost}) and trend_max_boost ({self.trend_max_boost}) must be >= 1")
        if not self.slice_cold_duty < self.slice_hot_duty <= 1:
            raise ValueError(f"slice_cold_duty ({self.slice_cold_duty}) must be < slice_hot_duty ({self.slice_hot_duty}) <= 1")
        if not 0 < self.min_slice <= self.max_slice <= 1:
            raise ValueError(f"min_slice ({self.min_slice}) must be > 0 and <= max_slice ({self.max_slice}) <= 1")
        if self.slice_window_s <= 0:
            raise ValueError(f"slice_window_s ({self.slice_window_s}) must be > 0")
        if self.rate_window_s <= 0:
            raise ValueError(f"rate_window_s ({self.rate_window_s}) must be > 0")
        if not 0 < self.miss_budget < 1 or self.budget_window_s <= 0:
            raise ValueError(f"miss_budget ({self.miss_budget}) must be within (0, 1) and budget_window_s "
                             f"({self.budget_window_s}) > 0")
        for name in ("max_spare", "budget_clean_windows", "gaps_kept", "gaps_min", "onsets_kept"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} ({getattr(self, name)!r}) must be a whole number")
        if not 1 <= self.gaps_min <= self.gaps_kept:
            raise ValueError(f"gaps_min ({self.gaps_min}) must be within [1, gaps_kept ({self.gaps_kept})]")
        if self.onsets_kept < 3:
            raise ValueError(f"onsets_kept ({self.onsets_kept}) must be >= 3 (two gaps to compare)")


DEFAULT_CONFIG = PolicyConfig()


class NeedAt(Record):
    """The replicas a function needed at one look (`at`), as PolicyState keeps them. A record
    rather than an (at, replicas) pair: compiled, its two numbers sit in the object itself,
    where a pair points to two more objects, and a look scans dozens of them."""

    def __init__(self, at: float, replicas: float) -> None:
        self.at: Final = at
        self.replicas: Final = replicas

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record


class PolicyState(Record):
    """What decide() remembers of a function between looks; immutable: each look builds a new
    one (a Record, as the snapshot: native where compiled)."""

    def __init__(
        self, *,
        last_active_at: float | None = None,  # last time anything was in flight, held or answered
        needs: tuple[NeedAt, ...] = (),  # the needs of the last max(window) seconds, oldest first
        onsets: tuple[float, ...] = (),  # when traffic resumed after onset_gap_s of silence
        duty_avg: float | None = None,  # EWMA of the mean replica duty (slice awareness)
        duty_since: float | None = None,  # first sample of that average
        duty_last: float | None = None,  # latest sample
        slice_fraction: float | None = None,  # the slice this policy last asked for
        slice_at: float | None = None,
        rate_avg: float | None = None,  # EWMA of the request rate (time constant rate_window_s)
        inflight_avg: float | None = None,  # and of the requests in flight inside replicas
        rate_at: float | None = None,  # its last sample
        budget: Budget | None = None,  # the error budget's window and spare replicas
        served: float = 0.0,  # requests answered in the budget's window so far
        served_over: float = 0.0,  # those slower than the SLO
        forecast: NeedAt | None = None,  # the count of the last FORECAST or RESERVE scale-up, and when
        gaps: tuple[float, ...] = (),  # the last idle gaps: seconds from one activity to the next
        gap_quantiles: tuple[float, float] | None = None,  # their (p10, p90), once gaps_min are known
        rate_var: float = 0.0,  # EWMA of the rate's variance x its window: requests^2 per second (the burst view)
        rps_last: float | None = None,  # the last rate measured over a window, for the next difference
        # the largest need of the delay window (config.scale_down_delay_s) as of the last
        # look, the latest of equals, carried so that a look need not scan the window (_window_peak).
        # None: scan. Whatever replaces `needs` must set it to None; a state is meant for one config
        peak: NeedAt | None = None,
        rps_last_at: float | None = None,  # when rps_last was measured: the next difference waits for a disjoint window
        rise: float = 0.0,  # the largest rise of the need within one cold start lately, decaying ...
        rise_at: float | None = None,  # ... from this time, time constant reserve_memory_s
        rise2: float = 0.0,  # the second largest, of another burst: the reserve (a rise that recurs)
        rise2_at: float | None = None,
        cold_cost_s: float | None = None,  # what a cold start costs, in seconds of one idle replica (keep_alive_s)
        held_max: float = 0.0,  # the most requests held at once through the cold start under way
        cold_misses: float = 0.0,  # requests held through a cold start, as measured (cold starts past)
        # looks still to come whose windows may hold the answers to the requests held through the
        # last start from zero, and the time before which every look's may (a window longer than
        # a look, PromQL's): the error budget leaves them out (_budget_sample)
        released: int = 0,
        released_until: float = -math.inf,
        missed_at: tuple[float, ...] = (),  # (start, last) of the last two bursts that missed the SLO (_missed_sample)
        service_max: float | None = None,  # the longest service a look measured per request (_service_sample) ...
        service_on: float | None = None,  # ... on this slice
    ) -> None:
        self.last_active_at: Final = last_active_at
        self.needs: Final = needs
        self.onsets: Final = onsets
        self.duty_avg: Final = duty_avg
        self.duty_since: Final = duty_since
        self.duty_last: Final = duty_last
        self.slice_fraction: Final = slice_fraction
        self.slice_at: Final = slice_at
        self.rate_avg: Final = rate_avg
        self.inflight_avg: Final = inflight_avg
        self.rate_at: Final = rate_at
        self.budget: Final = budget
        self.served: Final = served
        self.served_over: Final = served_over
        self.forecast: Final = forecast
        self.gaps: Final = gaps
        self.gap_quantiles: Final = gap_quantiles
        self.rate_var: Final = rate_var
        self.rps_last: Final = rps_last
        self.peak: Final = peak
        self.rps_last_at: Final = rps_last_at
        self.rise: Final = rise
        self.rise_at: Final = rise_at
        self.rise2: Final = rise2
        self.rise2_at: Final = rise2_at
        self.cold_cost_s: Final = cold_cost_s
        self.held_max: Final = held_max
        self.cold_misses: Final = cold_misses
        self.released: Final = released
        self.released_until: Final = released_until
        self.missed_at: Final = missed_at
        self.service_max: Final = service_max
        self.service_on: Final = service_on

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record


def decide(
    snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, now: float,
    config: PolicyConfig = DEFAULT_CONFIG,
) -> tuple[ScaleDecision, PolicyState]:
    current = snapshot.ready + snapshot.starting
    active = snapshot.demand > 0 or snapshot.rps > 0
    state = _unlooked(_slice_kept(state, snapshot, now), snapshot, spec, now, config)
    gaps, gap_quantiles = state.gaps, state.gap_quantiles
    if active and state.last_active_at is not None and now - state.last_active_at >= config.gap_min_s:
        gaps = (gaps + (now - state.last_active_at,))[-config.gaps_kept:]
        gap_quantiles = _gap_quantiles(gaps, config)
    last_active_at, onsets = _activity(state, active, now, config)
    budget, served, served_over = _budget_sample(state, snapshot, now, config)
    rate_var, rps_last, rps_last_at = _variance_sample(state, snapshot, now, config)
    rate_avg, inflight_avg, rate_at = _rate_sample(state, snapshot, now, config)
    batched = full_batch(snapshot.batch_latency_s, batch_budget_s(spec, config))  # rows and seconds, or None
    need = _estimate_need(snapshot, spec, config, batched, rate_avg, inflight_avg, rate_var)
    if budget.spare and need.replicas > 0 and snapshot.ready:
        need = Need(need.replicas + budget.spare, "budget", (need.replicas, budget.spare, budget.last_over))
    # a backlog held through a cold start is not a need to remember: the burst window
    # would carry it past the first measured work
    held_through_start = snapshot.ready == 0 and current > 0 and need.by == "concurrency"
    needs = _kept_needs(state.needs, now, float(current) if held_through_start else need.replicas, config)
    peak = _window_peak(state.peak, needs, now, config.scale_down_delay_s)
    duty_avg, duty_since, duty_last = _duty_sample(state, snapshot, batched, now, config)  # for the slice hint
    rise, rise_at, rise2, rise2_at = _rise_sample(state, needs, now, rise_horizon_s(snapshot, config), config)
    missed_at = _missed_sample(state, snapshot, needs, now, follow_s(snapshot, config), config)
    held_max, cold_misses = _held_sample(state, snapshot)
    cold_cost_s = _cold_cost_s(state, snapshot, spec, rate_avg, active, cold_misses, config)
    first_ready = state.held_max > 0 and snapshot.ready > 0  # the first look at a start from zero's replica
    service_max, service_on = _service_sample(state, snapshot)
    state = PolicyState(
        last_active_at=last_active_at, needs=needs, onsets=onsets, duty_avg=duty_avg, duty_since=duty_since,
        duty_last=duty_last, slice_fraction=state.slice_fraction, slice_at=state.slice_at, rate_avg=rate_avg,
        inflight_avg=inflight_avg, rate_at=rate_at, budget=budget, served=served, served_over=served_over,
        forecast=state.forecast, gaps=gaps, gap_quantiles=gap_quantiles, rate_var=rate_var, rps_last=rps_last,
        peak=peak, rps_last_at=rps_last_at, rise=rise, rise_at=rise_at, rise2=rise2, rise2_at=rise2_at, cold_cost_s=cold_cost_s,
        held_max=held_max, cold_misses=cold_misses, missed_at=missed_at, service_max=service_max, service_on=service_on,
        released=1 if first_ready else max(0, state.released - 1),
        released_until=now + snapshot.window_s if first_ready else state.released_until)
    if current == 0:
        decision, state = _from_zero(snapshot, spec, state, now, need, config)
        return _start_slice(decision, snapshot, spec, state, now, config)
    decision, state = _scale(snapshot, spec, state, now, need, current, config)
    return _with_slice_hint(decision, snapshot, spec, state, now, config)


def _unlooked(state: PolicyState, snapshot: MetricsSnapshot, spec: ScalingSpec, now: float,
              config: PolicyConfig) -> PolicyState:
    """The state as the looks a caller skipped after an idle one would have left it (quiet_until
    lets a caller with many idle functions skip them; the live controller looks every tick): a
    look measured over `snapshot.window_s` more than that after an idle look (one that saw no
    traffic) finds the skipped looks idle too. Their averages (rate, in flight, variance, duty)
    decay toward 0 up to the last skipped look, at now - window_s; the error budget's windows
    that ended meanwhile close as an idle look closes them (quiet_until wakes the caller for one
    whose close could change the count); and the skipped looks' needs inside the longest window,
    each what an idle look reads from the rate decayed to its time (and the spare), join the
    needs, so a window of the last few seconds holds idle needs as it would live. E.g. a rate
    average of 4/s at an idle look at 100, the next look at 120 measured over 1 s: 4 x e^(-19/5)
    = 0.09/s at 119, then this look's sample; needs at 101 .. 119 (kept_s 30: all of them).
    Unchanged where nothing was skipped (a look within window_s of the last, a look between
    ticks: window_s 0, one after an active look)."""
    window = snapshot.window_s
    if (window <= 0 or state.rate_at is None or state.rate_avg is None or state.inflight_avg is None
            or state.last_active_at is None or state.last_active_at >= state.rate_at - EPS):
        return state
    last = now - window
    idle = last - state.rate_at
    if idle <= EPS:
        return state
    rate_avg = _decay(state.rate_avg, idle, config.rate_window_s)
    inflight_avg = _decay(state.inflight_avg, idle, config.concurrency_window_s)
    rate_var, rps_last_at = state.rate_var, state.rps_last_at
    if rps_last_at is not None and config.dispersion_window_s > 0 and last - rps_last_at > EPS:
        # idle looks 0 after 0: a difference of 0 each
        rate_var = rate_var * math.exp(-(last - rps_last_at) / config.dispersion_window_s)
        rps_last_at = last
    duty_avg, duty_last = state.duty_avg, state.duty_last
    if duty_avg is not None and duty_last is not None and last - duty_last > EPS:
        duty_avg, duty_last = duty_avg * math.exp(-(last - duty_last) / config.slice_window_s), last
    budget, served, served_over = state.budget, state.served, state.served_over
    if budget is not None:
        ended = math.floor((last - budget.since) / config.budget_window_s + EPS) if config.budget_window_s > 0 else 0
        if ended > 0:  # the first closes what it holds, the rest are empty (clean)
            fraction = served_over / served if served > 0 else 0.0
            spare, clean = _close_window(budget.spare, budget.clean, fraction, config)
            for _ in range(ended - 1):
                spare, clean = _close_window(spare, clean, 0.0, config)
            budget = Budget(budget.since + ended * config.budget_window_s, spare, clean,
                            fraction if ended == 1 else 0.0)
            served = served_over = 0.0
    # the needs of the skipped looks inside the longest window (and the one before it), as each
    # read the averages decayed to its time
    idle_look = snapshot._replace(rps=0.0, inflight=0.0, queued=0.0, activator_queue=0, service_s=None,
                                  duty=tuple(0.0 for _ in snapshot.duty), p95_s=None, over_slo=0.0,
                                  answered_rps=0.0)
    batched = full_batch(snapshot.batch_latency_s, batch_budget_s(spec, config))
    spare = budget.spare if budget is not None and snapshot.ready else 0
    # the skipped looks at last, last - window, ... after the last look (not at it)
    skipped = min(math.ceil(idle / window - EPS) - 1, math.ceil(config.kept_s / window) + 1)
    needs = state.needs
    for k in range(skipped, -1, -1):
        at = last - k * window
        back = last - at
        need = _estimate_need(idle_look, spec, config, batched, _decay(rate_avg, -back, config.rate_window_s),
                              _decay(inflight_avg, -back, config.concurrency_window_s), rate_var).replicas
        needs = _kept_needs(needs, at, need + spare if need > 0 else need, config)
    return state._replace(rate_avg=rate_avg, inflight_avg=inflight_avg, rate_at=last, rate_var=rate_var,
                          rps_last=0.0 if state.rps_last is not None else None, rps_last_at=rps_last_at,
                          duty_avg=duty_avg, duty_last=duty_last, budget=budget, served=served,
                          served_over=served_over, needs=needs,
                          peak=_window_peak(state.peak, needs, last, config.scale_down_delay_s))


def _decay(value: float, seconds: float, tau: float) -> float:
    """An EWMA of time constant `tau` after `seconds` of samples of 0 (negative: undone); with
    no averaging (tau 0) the last sample, 0. E.g. 4.0 after 19 s at tau 5: 4 x e^(-3.8) = 0.09."""
    return value * math.exp(-seconds / tau) if tau > 0 else 0.0


# ---------------------------------------------------------------------- the need


class Need(Record):
    """The replicas a load needs now, what set it, and the numbers it was computed from."""

    def __init__(self, replicas: float,  # fractional replicas this load needs now
                 by: str,  # what set it: work | concurrency | slo | burst | budget
                 numbers: tuple[float, ...]) -> None:  # formatted only when a detail is shown
        self.replicas: Final = replicas
        self.by: Final = by
        self.numbers: Final = numbers

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record

    @property
    def detail(self) -> str:
        a = self.numbers
        if self.by == "work":
            return f"work {a[0]:.2f} / duty {a[1]:.2f}"
        if self.by == "concurrency":
            return f"{a[0]:g} in flight / {a[1]:g}"
        if self.by == "budget":
            return f"{a[0]:.2f} + {a[1]:g} spare: {a[2]:.2%} of requests over the SLO in the last window"
        if self.by == "burst":
            return (f"burst: {a[0]:.1f} requests per {a[1] * 1000:.0f} ms on average, {a[2]:.0f} at the "
                    f"{a[3]:.4g} % quantile, x {a[4] * 1000:.3g} ms each")
        return f"p95 {a[0] * 1000:.0f} ms over {a[1] * 1000:.0f} ms: x{a[2]:.2f}"


def estimate_need(snapshot: MetricsSnapshot, spec: ScalingSpec, config: PolicyConfig,
                  rate: float | None = None, inflight: float | None = None, rate_var: float = 0.0) -> Need:
    """Replicas the load needs now: the largest of the work view (measured work over a duty
    target that depends on latency headroom; at full batches for a model that batches), the
    concurrency view (Little's law) and, for a model that does not batch, the burst view (the
    requests of one SLO window at the (1 - miss budget) quantile); the work view raised when p95
    is over its target. Each view with its numbers worked out: docs/design/policy.md."""
    batched = full_batch(snapshot.batch_latency_s, batch_budget_s(spec, config))
    return _estimate_need(snapshot, spec, config, batched, rate, inflight, rate_var)


def _estimate_need(snapshot: MetricsSnapshot, spec: ScalingSpec, config: PolicyConfig,
                   batched: tuple[float, float] | None, rate: float | None = None, inflight: float | None = None,
                   rate_var: float = 0.0) -> Need:
    """estimate_need, given the model's full batch (full_batch within the batch budget), which
    decide() also gives the slice hint's duty sample."""
    rps = snapshot.rps if rate is None else rate
    slo_target_s = p95_target_s(spec, config)
    target_concurrency = spec.target_concurrency
    if batched is not None:
        # requests one replica finishes within the target, at full batches: also at zero, where a
        # backlog held through a cold start is served in batches too
        rows, seconds = batched
        target_concurrency = max(target_concurrency, rows * slo_target_s / seconds)
    if batched is not None and rps > 0:
        # a batching replica's work is its load at full batches: its duty reads high at any load
        # (it takes what is queued), and the fewer replicas, the fuller and cheaper each batch
        measured = rps * seconds / rows
    else:
        measured = max(rps * snapshot.service_s if snapshot.service_s else 0.0, _total(snapshot.duty))
    ratio = snapshot.p95_s / slo_target_s if snapshot.p95_s is not None and snapshot.ready else None
    duty_target = _duty_target(ratio, spec, config)
    by_work = measured / duty_target
    demand = (snapshot.inflight if inflight is None else inflight) + snapshot.activator_queue
    by_concurrency = demand / target_concurrency
    if by_concurrency > by_work:
        best = Need(by_concurrency, "concurrency", (demand, target_concurrency))
    else:
        best = Need(by_work, "work", (measured, duty_target))
    if ratio is not None and snapshot.p95_s is not None and ratio > 1 and measured > 0:
        boost = min(ratio, config.slo_max_boost)
        if by_work * boost > best.replicas:
            best = Need(by_work * boost, "slo", (snapshot.p95_s, slo_target_s, boost))
    if rate_var > 0.0 and batched is None and snapshot.service_s and rps > 0:
        service = snapshot.service_s
        window = spec.slo_p95_ms / 1000.0 - service
        if window > service:
            mean = rps * window
            tail = mean + config.burst_z * math.sqrt(rate_var * window)
            by_burst = tail * service / window
            if by_burst > best.replicas:
                best = Need(by_burst, "burst", (mean, window, tail, 100.0 * (1.0 - config.miss_budget), service))
    return best


def p95_target_s(spec: ScalingSpec, config: PolicyConfig) -> float:
    """Where the policy aims p95: slo_target_pct (80 %) of the SLO. E.g. 100 ms -> 0.08 s."""
    return spec.slo_p95_ms / 1000.0 * config.slo_target_pct / 100.0


def batch_budget_s(spec: ScalingSpec, config: PolicyConfig) -> float:
    """What one batch may take: batch_latency_share (half) of the p95 target, the budget
    full_batch() is asked for. E.g. 100 ms -> 0.04 s."""
    return p95_target_s(spec, config) * config.batch_latency_share


def full_batch(latency: tuple[tuple[float, float], ...], budget_s: float) -> tuple[float, float] | None:
    """The largest batch whose latency fits `budget_s`, as (rows, seconds), interpolated
    between the measured sizes and whole; None for a model that does not batch (fewer than
    two sizes known). Batch 1 always fits: a model slower than its budget still runs.
    E.g. ((1, .004), (8, .006), (32, .014)) within 10 ms: 8 + (10 - 6) / (14 - 6) x 24 = 20
    rows in 10 ms; within 40 ms: 32 rows in 14 ms."""
    if len(latency) < 2:
        return None
    rows, seconds = latency[0]
    for (r0, s0), (r1, s1) in zip(latency, latency[1:]):
        if s1 <= budget_s:
            rows, seconds = r1, s1
            continue
        if s0 <= budget_s and s1 > s0:
            whole = float(math.floor(r0 + (budget_s - s0) / (s1 - s0) * (r1 - r0)))
            if whole > rows:
                rows, seconds = whole, s0 + (whole - r0) / (r1 - r0) * (s1 - s0)
        break
    return float(rows), float(seconds)


def _duty_target(ratio: float | None, spec: ScalingSpec, config: PolicyConfig) -> float:
    """spec.target_duty, raised toward max_duty as p95 falls below its target.
    E.g. ratio 0.75 (halfway between 0.5 and 1) -> 0.7 + (0.9 - 0.7) x 0.5 = 0.8."""
    if ratio is None or ratio >= 1:
        return spec.target_duty
    high = max(spec.target_duty, config.max_duty)
    low = config.headroom_pct / 100.0
    if ratio <= low:
        return high
    return spec.target_duty + (high - spec.target_duty) * (1 - ratio) / (1 - low)


def _kept_needs(needs: tuple[NeedAt, ...], now: float, need: float,
                config: PolicyConfig) -> tuple[NeedAt, ...]:
    """Keep the needs of the longest window, plus the newest one older than it, so that
    "seen for a whole window" can be true whatever the tick."""
    first_inside = _first_inside(needs, now, config.kept_s)
    return needs[max(0, first_inside - 1):] + (NeedAt(now, need),)


def window_start(now: float, window_s: float) -> float:
    """The time at or before which a need is out of the window of `window_s` ending at `now`:
    now - window_s - EPS, but always before `now`, so a need at `now` is inside even where a
    wall-clock `now` (1.7e9 s) swallows EPS and the window is 0 s."""
    cutoff = now - window_s - EPS
    return cutoff if cutoff < now else math.nextafter(now, -math.inf)


def _first_inside(needs: tuple[NeedAt, ...], now: float, window_s: float) -> int:
    """The index of the first need inside the window of `window_s` ending at `now` (needs are
    in time order): a binary search, written out so that a compiled look runs it natively."""
    cutoff = window_start(now, window_s)
    low, high = 0, len(needs)
    while low < high:
        middle = (low + high) // 2
        if needs[middle].at <= cutoff:
            low = middle + 1
        else:
            high = middle
    return low


def window_max(needs: tuple[NeedAt, ...], now: float, window_s: float) -> float:
    """The largest need within the window (0 if none)."""
    start = _first_inside(needs, now, window_s)
    if start == len(needs):
        return 0.0
    high = needs[start].replicas
    for i in range(start + 1, len(needs)):
        high = max(high, needs[i].replicas)
    return high


def window_min(needs: tuple[NeedAt, ...], now: float, window_s: float) -> float:
    """The smallest need within the window (0 if none)."""
    start = _first_inside(needs, now, window_s)
    if start == len(needs):
        return 0.0
    low = needs[start].replicas
    for i in range(start + 1, len(needs)):
        low = min(low, needs[i].replicas)
    return low


def _window_peak(peak: NeedAt | None, needs: tuple[NeedAt, ...], now: float, window_s: float) -> NeedAt:
    """The largest need within `window_s` of `now` (window_max's), the latest of
    equals, once needs[-1] was added at `now`. From the last look's peak while that is still
    inside the window (the new need either beats it or not): the window only moved forward, so
    every other need in it was in the last one too. Else (it left the window, none is carried,
    or the clock went back: a wall clock stepped by NTP) a scan.
    E.g. a peak of 3.0 at 90, window 30 s: at 100 a need of 2.0 keeps it, one of 3.0 takes over;
    at 121 (90 is out) the window is scanned."""
    latest = needs[-1]
    if (peak is not None and window_start(now, window_s) < peak.at < latest.at
            and len(needs) > 1 and needs[-2].at <= latest.at):
        return peak if peak.replicas > latest.replicas else latest
    start = _first_inside(needs, now, window_s)  # never past the end: needs[-1] is at `now`
    best = needs[start]
    for i in range(start + 1, len(needs)):
        if needs[i].replicas >= best.replicas:  # the latest of equals
            best = needs[i]
    return best


def record_activity(state: PolicyState, active: bool, now: float, config: PolicyConfig) -> PolicyState:
    """Remember when the function was last active, and when traffic resumed after silence."""
    last_active_at, onsets = _activity(state, active, now, config)
    return state._replace(last_active_at=last_active_at, onsets=onsets)


def _activity(state: PolicyState, active: bool, now: float, config: PolicyConfig) -> tuple[float, tuple[float, ...]]:
    if state.last_active_at is None:
        # the first look counts as activity: a replica just warmed up gets its idle time before it goes
        return now, (now,) if active else ()
    if not active:
        return state.last_active_at, state.onsets
    if now - state.last_active_at >= config.onset_gap_s:
        return now, (state.onsets + (now,))[-config.onsets_kept:]
    return now, state.onsets


# ---------------------------------------------------------------------- the forecast


def next_onset(state: PolicyState, config: PolicyConfig) -> float | None:
    """When periodic traffic resumes next, if its onsets keep a regular period.
    E.g. onsets at 0, 300, 601, 900: gaps 300, 301, 299, mean 300, CV 0.003 <= 0.1
    -> next at 900 + 300 = 1200."""
    if len(state.onsets) < 3:
        return None
    gaps = [b - a for a, b in zip(state.onsets, state.onsets[1:])]
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None
    sd = math.sqrt(sum((g - mean) * (g - mean) for g in gaps) / len(gaps))
    if sd / mean > config.periodic_max_cv:
        return None
    return state.onsets[-1] + mean


def trend_need(state: PolicyState, now: float, lead_s: float, config: PolicyConfig) -> float:
    """The need extrapolated `lead_s` ahead from its slope over the trend window
    (least squares), only while the need rose over the last three looks, only upwards and
    by at most trend_max_boost.
    E.g. needs 2, 3, 4 at t = 0, 1, 2 (slope 1/s), lead 2 s -> 4 + 1 x 2 = 6, capped at 4 x 1.5 = 6."""
    needs = state.needs
    if len(needs) < 3 or not needs[-3].replicas < needs[-2].replicas < needs[-1].replicas:
        return 0.0  # a trend rises over the last three looks; one spike is the burst window's
    points = needs[_first_inside(needs, now, config.trend_window_s):]
    if len(points) < 3:
        return 0.0
    mean_t = sum(p.at for p in points) / len(points)
    mean_n = sum(p.replicas for p in points) / len(points)
    var_t = sum((p.at - mean_t) * (p.at - mean_t) for p in points)
    if var_t <= 0:
        return 0.0
    slope = sum((p.at - mean_t) * (p.replicas - mean_n) for p in points) / var_t
    latest = points[-1].replicas
    if slope <= 0 or latest <= 0:
        return 0.0
    return min(latest + slope * lead_s, latest * config.trend_max_boost)


def lead_s(snapshot: MetricsSnapshot, config: PolicyConfig) -> float:
    return snapshot.cold_start_s if snapshot.cold_start_s is not None else config.default_cold_start_s


def follow_s(snapshot: MetricsSnapshot, config: PolicyConfig) -> float:
    """A cold start and a look (1 s): how far ahead no scale-up can follow. E.g. 2.5 s -> 3.5 s."""
    return lead_s(snapshot, config) + 1.0


# ---------------------------------------------------------------------- decisions


def _from_zero(snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, now: float, need: Need,
               config: PolicyConfig) -> tuple[ScaleDecision, PolicyState]:
    if snapshot.demand > 0:
        wanted = _bound(max(1, _ceil(need.replicas)), spec)
        return ScaleDecision(wanted, "COLD_START", f"{snapshot.demand:g} waiting; {need.detail}"), state
    onset = next_onset(state, config)
    if onset is not None and spec.max_replicas > 0 and _prewarm_due(onset, now, lead_s(snapshot, config), config):
        return ScaleDecision(_bound(1, spec), "FORECAST", f"traffic expected at t={onset:.0f} (periodic)"), state
    return ScaleDecision(spec.min_replicas, "TO_ZERO" if spec.min_replicas == 0 else "STABLE", ""), state


def _prewarm_due(onset: float, now: float, lead: float, config: PolicyConfig) -> bool:
    """From lead + margin before the expected onset until a margin after it."""
    return onset - lead - config.prewarm_margin_s <= now <= onset + config.prewarm_margin_s


def _scale(snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, now: float, need: Need,
           current: int, config: PolicyConfig) -> tuple[ScaleDecision, PolicyState]:
    if snapshot.ready == 0 and need.by == "concurrency":
        # requests held through a cold start: the starting replicas will take them; more
        # replicas for a backlog whose work is not known yet would come as late
        return ScaleDecision(current, "COLD_START", f"{snapshot.starting} starting for {snapshot.demand:g} held"), state
    # the delay window's largest need, for _scale_down; when the burst window lies inside it
    # (as by default) and that need fits the current count, the burst window's cannot raise it
    delay_peak = state.peak.replicas if state.peak is not None else 0.0  # window_max(needs, now, scale_down_delay_s)
    burst = 0.0 if config.burst_window_s <= config.scale_down_delay_s and _ceil(delay_peak) <= current \
        else window_max(state.needs, now, config.burst_window_s)
    # the trend is at most the latest need x trend_max_boost: below the current count it cannot matter
    latest = state.needs[-1].replicas if state.needs else 0.0
    follow = follow_s(snapshot, config)
    trend = trend_need(state, now, follow, config) \
        if _ceil(latest * config.trend_max_boost) > current else 0.0
    # the reserve: what the need has lately risen by within one cold start, on top of its low
    # over one (raised only while traffic flows; an idle function's keep-alive is keep_alive_s's)
    low = window_min(state.needs, now, follow)
    held = low + reserve(state, now, config) if snapshot.demand > 0 or snapshot.rps > 0 else 0.0
    up = _ceil(max(max(trend, burst), held))
    if up > current:
        desired = _bound(min(up, math.ceil(current * config.max_scale_up_rate)), spec)
        if desired > current:
            reason = "FORECAST" if _ceil(trend) > _ceil(burst) else ("SLO" if need.by in ("slo", "budget") else "BURST")
            if _ceil(held) > max(_ceil(trend), _ceil(burst)):
                reason = "RESERVE"
            detail = (f"trend {trend:.2f} over the next {follow:.0f} s" if reason == "FORECAST"
                      else f"need {low:.2f} + reserve {held - low:.2f} for a rise within a cold start"
                      if reason == "RESERVE" else f"need {burst:.2f} replicas ({need.detail})")
            if reason == "FORECAST":  # held like a need for the delay window, so the next look does not undo it
                state = state._replace(forecast=NeedAt(now, trend))
            elif reason == "RESERVE":  # so is the reserve's count, or the low it sits on drops it again
                last = state.forecast
                if last is not None and now - last.at < config.scale_down_delay_s - EPS:
                    held = max(held, last.replicas)  # a larger hold still in its window stays
                state = state._replace(forecast=NeedAt(now, held))
            return ScaleDecision(desired, reason, detail), state
    idle_s = now - state.last_active_at if state.last_active_at is not None else 0.0
    if snapshot.demand == 0 and spec.min_replicas == 0:
        zero = _to_zero(snapshot, spec, state, now, idle_s, config)
        if zero is not None:
            return zero, state
    if snapshot.ready and len(snapshot.duty) < snapshot.ready and snapshot.demand == 0 and need.replicas == 0:
        return ScaleDecision(_bound(current, spec), "NO_DATA", "waiting for a second scrape"), state
    held = low + reserve(state, now, config)  # the need's low over one cold start, as above
    return _scale_down(spec, state, now, current, max(delay_peak, held), config), state


def _to_zero(snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, now: float, idle_s: float,
             config: PolicyConfig) -> ScaleDecision | None:
    onset = next_onset(state, config)
    if onset is not None:
        if _prewarm_due(onset, now, lead_s(snapshot, config), config):
            count = _bound(max(1, snapshot.ready + snapshot.starting), spec)
            return ScaleDecision(count, "FORECAST", f"traffic expected at t={onset:.0f} (periodic)")
        # early only while the next onset lies ahead, past a pre-warm (one that passed without
        # its traffic says the period was a chance of the last few gaps), and only for a timer:
        # none of its recent idle gaps shorter than an onset's silence
        if (idle_s >= config.periodic_keep_s and onset - now > lead_s(snapshot, config) + config.prewarm_margin_s
                and all(g >= config.onset_gap_s for g in state.gaps[-config.gaps_min:])):
            return ScaleDecision(0, "TO_ZERO", f"idle {idle_s:.0f} s; periodic, next at t={onset:.0f}")
    if idle_s < min(spec.idle_to_zero_s, config.periodic_keep_s):
        return None  # shorter than any keep-alive keep_alive_s gives (an active look, most often)
    keep = keep_alive_s(state, spec, config)
    if idle_s >= keep:
        return ScaleDecision(0, "TO_ZERO", f"idle {idle_s:.0f} s{_keep_why(state, spec, keep, config)}")
    return None


def keep_alive_s(state: PolicyState, spec: ScalingSpec, config: PolicyConfig) -> float:
    """How long an idle function keeps its replicas. With a price on a miss (the default) and
    a cold start priced (cold_cost_s): ski rental over its own idle gaps (_ski_rental); past
    every gap seen, until the idle time has cost one cold start; at least idle_to_zero_s unless
    no gap is worth covering (then periodic_keep_s), at most keep_alive_max_s; with fewer than
    gaps_min gaps, nothing to weigh, until the idle time has cost one cold start (ski rental's
    break-even), within the same bounds and at most few_gaps_keep_x x idle_to_zero_s (scaled by
    the user's setting: a function set to go at 2 s stays at most a minute before its gaps are
    known; at the default 60 s the bound is keep_alive_max_s's, 1,800 s). Without (miss_price_slice_s 0, or never active), the hybrid
    histogram of Shahrad et al., "Serverless in the Wild", ATC 2020, in short: the gaps' p90 x
    1.1 when within keep_alive_max_s and over idle_to_zero_s; periodic_keep_s when even their
    p10 is over twice idle_to_zero_s; else idle_to_zero_s. E.g. priced at 100 s, gaps 30, 40,
    200, 50 s: K 50 (67.5 against 80 for K 200), so idle_to_zero_s, 60 s; priced at 250 s: K
    200 covers all four, then on to 250 s.
    Unpriced, gaps 40, 55, 70, 80, 95 s: 95 x 1.1 = 104.5 s. A function's own
    keep_alive_max_s (its spec's) stands for the platform's (but for the platform's 0, off for
    all): set to its idle_to_zero_s, the function goes then whatever a cold start costs; set
    higher, it lifts the bound, not few_gaps_keep_x's. docs/design/policy.md."""
    if config.keep_alive_max_s <= 0:
        return spec.idle_to_zero_s
    most = config.keep_alive_max_s if spec.keep_alive_max_s is None else spec.keep_alive_max_s
    cold_cost = state.cold_cost_s if config.miss_price_slice_s > 0 else None
    if state.gap_quantiles is None:  # too few gaps to go by
        if cold_cost is None:
            return spec.idle_to_zero_s  # the spec's own, as its user set it
        cap = min(spec.idle_to_zero_s * config.few_gaps_keep_x, most)
        return min(max(spec.idle_to_zero_s, cold_cost), max(spec.idle_to_zero_s, cap))
    if cold_cost is not None:
        keep = _ski_rental(state.gaps, cold_cost)
        if keep <= 0:
            return min(spec.idle_to_zero_s, config.periodic_keep_s)
        if all(gap <= keep for gap in state.gaps):
            # every gap seen is covered: a longer one is likely as long again as it has lasted,
            # so keep on until the idle time has cost what a cold start would (2-competitive)
            keep = max(keep, cold_cost)
        return min(max(spec.idle_to_zero_s, keep), max(spec.idle_to_zero_s, most))
    low, high = state.gap_quantiles
    high *= 1.1
    if high <= most:
        return max(spec.idle_to_zero_s, high)
    if low >= 2 * spec.idle_to_zero_s:
        return min(spec.idle_to_zero_s, config.periodic_keep_s)
    return spec.idle_to_zero_s


def _keep_why(state: PolicyState, spec: ScalingSpec, keep: float, config: PolicyConfig) -> str:
    """What the decision to zero says of the `keep` s its idle function was kept: nothing where it
    went at its idle_to_zero_s by no bound of its own; else the price of its cold start (naming
    the function's keep_alive_max_s where that bound decided), or its idle gaps."""
    cost = state.cold_cost_s if config.miss_price_slice_s > 0 else None  # as keep_alive_s reads it
    bound = cost is not None and keep == spec.keep_alive_max_s
    if keep == spec.idle_to_zero_s and not bound:
        return ""
    if cost is not None:
        named = ", its keep_alive_max_s" if bound else ""
        return (f" (keep-alive {keep:.0f} s: a cold start priced at {cost:.0f} s idle, "
                f"{len(state.gaps)} idle gap(s) known{named})")
    return f" (keep-alive {keep:.0f} s: from the last {len(state.gaps)} idle gaps)"


def _ski_rental(gaps: tuple[float, ...], cold_cost_s: float) -> float:
    """The keep-alive K that costs least over the function's own idle gaps, a cold start
    counted as `cold_cost_s` seconds of an idle replica: mean(min(gap, K)) idle seconds
    plus cold_cost_s x the share of gaps longer than K. The best K is 0 or one of the gaps
    (between two, the idle time grows and the cold starts stay); of equal costs the longer
    (the SLO first). E.g. gaps 30, 40, 200 s, a cold start worth 100 s: K 0 -> 100; K 30 ->
    30 + 2/3 x 100 = 96.7; K 40 -> (30 + 40 + 40) / 3 + 1/3 x 100 = 70; K 200 -> 90: 40 s.
    Worth 1,000 s: K 200 -> 90, the others more: 200 s."""
    ordered = sorted(gaps)
    n = len(ordered)
    best, best_cost = 0.0, cold_cost_s
    shorter = 0.0  # the sum of the gaps before the i-th: each is idle whole under K = ordered[i]
    longer = n  # gaps past K, counted down past K's equals
    for i, k in enumerate(ordered):
        while longer and ordered[n - longer] <= k:
            longer -= 1
        cost = (shorter + k * (n - i)) / n + cold_cost_s * longer / n
        if cost <= best_cost + EPS:
            best, best_cost = k, cost
        shorter += k
    return best


def _gap_quantiles(gaps: tuple[float, ...], config: PolicyConfig) -> tuple[float, float] | None:
    """(p10, p90) of the idle gaps by rank (ceil(q n)-th smallest), once gaps_min are known;
    kept in the state when a gap is added, since keep_alive_s is asked on every idle look.
    E.g. 40, 55, 70, 80, 95: (40, 95)."""
    if len(gaps) < config.gaps_min:
        return None
    ordered = sorted(gaps)
    return ordered[math.ceil(0.1 * len(ordered)) - 1], ordered[math.ceil(0.9 * len(ordered)) - 1]


def _scale_down(spec: ScalingSpec, state: PolicyState, now: float, current: int, delay_peak: float,
                config: PolicyConfig) -> ScaleDecision:
    """Down only to the largest need of the whole delay window (`delay_peak`), by at most
    half, never below one while the function is active. E.g. 8 replicas, needs over the
    last 30 s at most 2.4 -> ceil(2.4) = 3, but at most halving: max(3, ceil(8/2) = 4) = 4.
    A forecast scale-up counts as a need of its window too (a forecast is not undone by the
    next look, before the traffic it foresaw has come)."""
    seen_for = now - state.needs[0].at if state.needs else 0.0
    wanted = _ceil(delay_peak)
    if state.forecast is not None and now - state.forecast.at < config.scale_down_delay_s - EPS:
        wanted = max(wanted, _ceil(state.forecast.replicas))
    wanted = max(wanted, max(1, spec.min_replicas))
    if wanted >= current:
        return ScaleDecision(_bound(current, spec), "STABLE")
    if seen_for < config.scale_down_delay_s - EPS:
        return ScaleDecision(_bound(current, spec), "HOLD",
                             f"down to {wanted} after {config.scale_down_delay_s:.0f} s of lower need")
    desired = _bound(max(wanted, math.ceil(current / config.max_scale_down_rate)), spec)
    return ScaleDecision(desired, "STABLE", f"need at most {wanted} over {config.scale_down_delay_s:.0f} s")


def quiet_until(state: PolicyState, spec: ScalingSpec, current: int, now: float, lead: float,
                config: PolicyConfig = DEFAULT_CONFIG) -> float:
    """For a function the last decide() saw idle (nothing in flight, held or answered) at
    `current` replicas: the earliest time a decide() without new traffic could change
    the count, so a caller with many idle functions may skip looking until then. The
    first of: idle_to_zero_s after the last activity (a lone replica's idle shrink, or its
    keep-alive's end); for periodic traffic, the early
    zero and the next pre-warm; the end of the delay window of the last need that kept
    `current` replicas; the end of the error budget's window when its close adds a spare (more
    than miss_budget of its requests over the SLO), or the close that would take one (the
    budget_clean_windows-th clean one in a row); decide() closes the windows between
    (_unlooked). E.g. last active at 100, idle_to_zero 60, needs (100, 2.0) on 2 replicas,
    delay 30: min(160, 100 + 30) = 130; with 1 spare, 35 clean windows and the window begun
    at 95: min(130, 95 + 5 x 30) = 130."""
    if state.last_active_at is None:
        return now
    until = state.last_active_at + keep_alive_s(state, spec, config)
    shrink_at = state.last_active_at + spec.idle_to_zero_s  # the idle shrink's look (_idle_shrink)
    if (config.slice_hints and config.idle_shrink and current == 1 and now < shrink_at
            and (state.slice_fraction is None or state.slice_fraction > config.min_slice + EPS)):
        until = min(until, shrink_at)
    budget = state.budget
    if budget is not None and state.served_over > config.miss_budget * state.served:
        until = min(until, budget.since + config.budget_window_s)  # its close adds a spare
    elif budget is not None and budget.spare:  # the close that takes one, if all are clean
        until = min(until, budget.since + max(1, config.budget_clean_windows - budget.clean)
                    * config.budget_window_s)
    onset = next_onset(state, config)
    if onset is not None:
        until = min(until, state.last_active_at + config.periodic_keep_s)
        until = min(until, onset - lead - config.prewarm_margin_s)
    if current > max(1, spec.min_replicas):
        high = [need.at for need in state.needs if _ceil(need.replicas) >= current]
        down = (high[-1] if high else state.needs[0].at if state.needs else now) + config.scale_down_delay_s
        if config.reserve_memory_s > 0:
            # the count goes down only once the reserve, too, is below current - 1 (idle: a need of 0)
            down = max(down, reserve_under(state, current - 1, now, config))
        until = min(until, down)
    return max(now, until)


# ---------------------------------------------------------------------- slice size


def _with_slice_hint(decision: ScaleDecision, snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState,
                     now: float, config: PolicyConfig) -> tuple[ScaleDecision, PolicyState]:
    """Hot replicas the count cannot relieve (the decision at max_replicas) ask for twice the
    slice; with room, more replicas of the same slice carry the load, and a new slice's batch
    latencies would be only the old ones rescaled until learned again. A lone idle replica
    whose p95 would still meet the SLO at twice the service time, which one replica of half
    the slice could still carry (the kept needs' largest and the largest recent rise, decayed,
    at most half a replica), and whose half slice would not cost more per request under load
    (_half_serves_as_much), asks for half. E.g. duty EWMA 0.9 >= 0.85 on a 1/4 slice at
    max_replicas -> 1/2; duty 0.05 <= 0.15, p95 20 ms x 2 = 40 <= 80 ms target, needs at most
    0.1 -> 1/8.
    `state` holds this snapshot's duty sample already (decide() records it). A lone replica
    kept idle past the spec's idle_to_zero_s (the keep-alive's price holds it longer) asks at
    once for the least slice a start from zero would get (_least_slice, _idle_shrink)."""
    current_slice = snapshot.slice_fraction
    if not config.slice_hints or current_slice is None or snapshot.ready == 0:
        return decision, state
    shrunk = _idle_shrink(decision, snapshot, spec, state, now, config)
    if shrunk is not None:
        return shrunk
    if state.duty_avg is None:
        return decision, state
    if state.slice_at is not None and now - state.slice_at < config.slice_window_s:
        return decision, state
    if state.duty_since is None or now - state.duty_since < config.slice_window_s or not snapshot.duty:
        return decision, state
    wanted = None
    if (state.duty_avg >= config.slice_hot_duty and current_slice * 2 <= config.max_slice + EPS
            and decision.desired >= spec.max_replicas):
        wanted = current_slice * 2
    slo_target_s = p95_target_s(spec, config)
    if (state.duty_avg <= config.slice_cold_duty and snapshot.ready == 1 and snapshot.p95_s is not None
            and snapshot.p95_s * 2 <= slo_target_s and current_slice / 2 >= config.min_slice - EPS
            and 2.0 * max(window_max(state.needs, now, config.kept_s), _decayed(state.rise, state.rise_at, now, config))
            <= 1.0 and _half_serves_as_much(snapshot.batch_latency_s, batch_budget_s(spec, config))):
        wanted = current_slice / 2
    if wanted is None:
        return decision, state
    hinted, state = _asking_slice(decision, state, wanted, f"duty {state.duty_avg:.2f} on a {current_slice:g} slice "
                                  f"-> {wanted:g}", now)
    if decision.reason in ("STABLE", "HOLD"):
        hinted = hinted._replace(reason="SLICE")
    return hinted, state


def _idle_shrink(decision: ScaleDecision, snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState,
                 now: float, config: PolicyConfig) -> tuple[ScaleDecision, PolicyState] | None:
    """A lone ready replica with nothing in flight, held or answered since idle_to_zero_s,
    kept (the decision keeps it, STABLE) by the keep-alive's price, not by min_replicas: on the
    least slice a start from zero would get (_least_slice from the slice it runs on), since it
    spends the rest of its life idle there, as a replica started from zero does (_start_slice).
    The move starts a replica on the new slice; the old one serves until it is ready. Only where
    that pays: the new slice held through one cold start beside the old costs less than what the
    smaller slice saves over the rest of the keep-alive. E.g. idle 60 s on 1/2, 30 ms a request
    there, SLO 500 ms (half the p95 target 200 ms): 1/8 (120 ms); with a 2 s cold start it pays
    when over 2 x 0.125 / 0.375 + 2 = 2.7 s of the keep-alive are left. None: not idle so long,
    no smaller slice serves, or the move does not pay."""
    if (not config.idle_shrink or snapshot.ready != 1 or snapshot.starting or decision.desired != 1
            or decision.reason != "STABLE" or spec.min_replicas > 0
            or snapshot.demand > 0 or snapshot.rps > 0 or state.last_active_at is None  # demand counts in flight
            or now - state.last_active_at < spec.idle_to_zero_s - EPS):
        return None
    current_slice = snapshot.slice_fraction
    if current_slice is None:
        return None
    least = _least_slice(snapshot, spec, state, current_slice, config)
    if least is None or least[0] >= current_slice - EPS:
        return None
    wanted, alone_s = least
    left = state.last_active_at + keep_alive_s(state, spec, config) - now
    lead = lead_s(snapshot, config)
    if (current_slice - wanted) * (left - lead) <= wanted * lead:
        return None
    hinted, state = _asking_slice(decision, state, wanted, f"idle {now - state.last_active_at:.0f} s: kept on a "
                                  f"{wanted:g} slice, a request alone {1000 * alone_s:.0f} ms", now)
    return hinted._replace(reason="SLICE"), state


def _slice_kept(state: PolicyState, snapshot: MetricsSnapshot, now: float) -> PolicyState:
    """The state on the slice new replicas get, where that is not the one the policy last asked
    for: a new revision of `shoal up` that replaces its replicas starts on the slice it declares
    (ReplicaScaler._reap). The duty averaged on the old slice says nothing of the new one, and
    the next hint waits a whole slice_window_s of it, as after a hint (_asking_slice). The
    simulator applies every hint, so it never differs there."""
    asked, running = state.slice_fraction, snapshot.slice_fraction
    if asked is None or running is None or abs(asked - running) <= EPS:
        return state
    return _on_slice(state, running, now)


def _on_slice(state: PolicyState, slice_fraction: float, now: float) -> PolicyState:
    """The state on a new slice from `now`: the duty averaged on the old one starts again."""
    return state._replace(slice_fraction=slice_fraction, slice_at=now, duty_avg=None, duty_since=None, duty_last=None)


def _asking_slice(decision: ScaleDecision, state: PolicyState, wanted: float, why: str,
                  now: float) -> tuple[ScaleDecision, PolicyState]:
    """`decision` asking new replicas for `wanted`, `why` added to its detail; the state remembers
    the ask, and the duty average measured on the old slice starts again."""
    hinted = decision._replace(slice_fraction=wanted, detail=f"{decision.detail}; {why}".strip("; "))
    return hinted, _on_slice(state, wanted, now)


def _start_slice(decision: ScaleDecision, snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState,
                 now: float, config: PolicyConfig) -> tuple[ScaleDecision, PolicyState]:
    """A start from zero (held requests, a pre-warm) on the least slice that serves it: a replica
    started from zero spends most of its life idle (its keep-alive), and the slice it idles on
    is what it costs. Halving from the function's deployed slice (or the slice it runs on, if
    larger: a start never asks for more than either) while the half is at least min_slice, the
    requests the start is for run one by one there within half the p95 target, and the half
    serves as much under load (_half_serves_as_much); a start after one that shrank may so grow
    back. Those requests: the ones waiting, at least one, or as many as its past cold starts held
    if more (cold_misses: the backlog a burst gathers while a replica starts); a request alone's
    time: the learned batch table's first size, or else the longest service a look measured per
    request (_service_sample), at the slice's speed. Nothing measured yet: the slice stays. E.g.
    deployed on 1/2, 30 ms a request there, SLO 500 ms (p95 target 400 ms, half 200 ms), one
    request waiting: 1/8 (120 ms); three: 1/4 (3 x 60 = 180 ms), not 1/8 (360 ms), also when
    it runs on 1/8 now. The keep-alive weighs idle seconds at the new slice's price
    (_cold_cost_s), so the function stays warm longer on it. The cluster controller runs with
    slice_hints off: its replicas keep their Deployment's slice (a new slice is a new revision)."""
    current_slice = snapshot.slice_fraction
    if (decision.desired <= 0 or decision.reason not in ("COLD_START", "FORECAST") or not config.slice_hints
            or current_slice is None):
        return decision, state
    least = _least_slice(snapshot, spec, state, max(current_slice, snapshot.deployed_slice or 0.0), config)
    if least is None or abs(least[0] - current_slice) <= EPS:
        return decision, state
    wanted, alone_s = least
    return _asking_slice(decision, state, wanted, f"starts on a {wanted:g} slice: a request alone "
                         f"{1000 * alone_s:.0f} ms", now)


def _least_slice(snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, top: float,
                 config: PolicyConfig) -> tuple[float, float] | None:
    """(slice, a request alone's seconds on it): `top` halved while the half is at least
    min_slice, the requests a start is for run one by one there within half the p95 target, and
    the half serves as much under load (_half_serves_as_much). Those requests: the ones waiting,
    at least one, or as many as its past cold starts held if more (cold_misses); a request
    alone's time: the learned batch table's first size, or else the longest service a look
    measured per request (_service_sample), at the slice's speed. None: nothing measured yet."""
    current_slice = snapshot.slice_fraction
    if current_slice is None:
        return None
    table = snapshot.batch_latency_s
    alone = table[0][1] if table else _service_on(state, current_slice)
    if alone is None:
        return None
    speed = current_slice / top  # how many times slower than on current_slice (below 1: faster)
    half_target = p95_target_s(spec, config) / 2.0
    budget = batch_budget_s(spec, config)
    wanted = top
    waiting = max(1.0, snapshot.demand, state.cold_misses)
    while (wanted / 2 >= config.min_slice - EPS and waiting * alone * speed * 2.0 <= half_target
           and _half_serves_as_much(tuple((rows, seconds * speed) for rows, seconds in table), budget)):
        wanted, speed = wanted / 2, speed * 2.0
    return wanted, alone * speed


def _service_sample(state: PolicyState, snapshot: MetricsSnapshot) -> tuple[float | None, float | None]:
    """(service_max, service_on) after this snapshot: the longest service a look measured per
    request (its replicas' busy seconds over the requests they answered: a batch's time over
    its rows, or a request alone's when it ran alone; more where the window holds work still
    running, or a slow first request), on the slice new replicas got when it was measured (the
    replicas that ran it, but for those still on an older slice after a hint); an earlier one
    carried to a new slice at its speed (a replica on half the slice takes twice as long). It
    errs long more than short, which keeps a start on a larger slice. E.g. 30 ms on 1/2, then
    50 ms on 1/4: 60 ms on 1/4."""
    if snapshot.service_s is None or not snapshot.slice_fraction:
        return state.service_max, state.service_on
    known = _service_on(state, snapshot.slice_fraction)
    return max(known or 0.0, snapshot.service_s), snapshot.slice_fraction


def _service_on(state: PolicyState, slice_fraction: float) -> float | None:
    if state.service_max is None or not state.service_on or slice_fraction <= 0:
        return None
    return state.service_max * state.service_on / slice_fraction


def _half_serves_as_much(latency: tuple[tuple[float, float], ...], budget_s: float) -> bool:
    """Whether half the slice serves at least half the requests per second at its full batch
    within the batch budget, its batches taking twice as long (the speed the slice hint
    assumes): then it costs no more slice-seconds per request under load. Where the budget caps
    the batch at half speed it does not, and a function that bursts again runs its bursts on it
    (the real trace at 1x: 1,436 slice-s with the shrink, 1,163 without; docs/design/policy.md).
    Unknown or unbatched (fewer than two sizes known):
    the rows stay and the time doubles, so it does. E.g. the code profile (40 ms at 1, 120 ms
    at 8; budget 80 ms): 4 rows in 74.3 ms = 53.8/s on 1/4; at half speed 80 ms at 1 = 12.5/s
    on 1/8, under 53.8 / 2 = 26.9: no. ((1, .004), (8, .006)) within 40 ms: 8 in 6 ms and 8 in
    12 ms, 1,333/s and 667/s: yes."""
    whole = full_batch(latency, budget_s)
    half = full_batch(tuple((rows, 2.0 * seconds) for rows, seconds in latency), budget_s)
    if whole is None or half is None:
        return True
    return half[0] / half[1] >= whole[0] / whole[1] / 2.0 * (1.0 - EPS)


class Budget(Record):
    """The error budget's window (begun at `since`), the spare replicas it holds, how many
    windows in a row stayed well inside it, and the fraction over the SLO in the last one.
    It changes only when a window ends; the requests of the running window are counted in
    PolicyState.served and served_over."""

    def __init__(self, since: float, spare: int = 0, clean: int = 0, last_over: float = 0.0) -> None:
        self.since: Final = since
        self.spare: Final = spare
        self.clean: Final = clean
        self.last_over: Final = last_over

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record


def _budget_sample(state: PolicyState, snapshot: MetricsSnapshot, now: float,
                   config: PolicyConfig) -> tuple[Budget, float, float]:
    """(budget, served, served_over) after this snapshot. Its requests are a rate x the time
    since the last look, with the snapshot's fraction of them over the SLO; at the end of
    each budget window, over miss_budget adds a spare replica (at most max_spare), and
    budget_clean_windows in a row under budget_clean_share of it take one away.
    What KPA and Ray Serve never look at: whether requests actually met their SLO, so a
    function whose bursts its replicas absorb on average but not in the tail gets the
    replica its tail needs. E.g. 30,000 requests in a window, 60 over: 0.2 % > 0.1 % -> +1.
    The rate, by default, is the replicas' rps, with a replica ready: a start from zero's
    held requests, all late, count when the look that reads their answers has the first
    replica's rate (12 of 12 over: a spare for 20 minutes), not when its first scrape has
    none yet (rps 0), so by the tick's phase. With budget_skips_starts, the gateway's
    answered rate, leaving out the answers to the requests held through a start from zero,
    whose misses a spare cannot prevent (the next start from zero waits for one replica
    too; the keep-alive prices them: _held_sample, _cold_cost_s): the look that finds a
    replica ready after one (`held_max`: requests were held at the last look) and the next
    (`released`), since the held requests are answered a batch after the replica is ready,
    before or after that look by the phase; and, where a look's rates are read over a longer
    window (PromQL's 30 s), every look within that window of the first (`released_until`).
    A backlog that takes longer than that to answer counts its rest, as do looks whose rates
    hold them only because Prometheus scraped late. A look with no replica ready otherwise
    counts (a warm function's last replica lost: its requests answered 5xx are misses)."""
    budget = state.budget
    if budget is None or state.rate_at is None:
        return Budget(now), 0.0, 0.0
    if config.budget_skips_starts:
        released = state.held_max > 0 or state.released > 0 or now <= state.released_until + EPS
        served = snapshot.answered_rps * (now - state.rate_at) if not released else 0.0
    else:
        served = snapshot.rps * (now - state.rate_at) if snapshot.ready else 0.0
    requests, over = state.served + served, state.served_over + served * snapshot.over_slo
    if now - budget.since < config.budget_window_s - EPS:
        return budget, requests, over
    fraction = over / requests if requests > 0 else 0.0
    spare, clean = _close_window(budget.spare, budget.clean, fraction, config)
    return Budget(now, spare, clean, fraction), 0.0, 0.0


def _close_window(spare: int, clean: int, fraction: float, config: PolicyConfig) -> tuple[int, int]:
    """(spare, clean) once a budget window with `fraction` of its requests over the SLO ends."""
    if fraction > config.miss_budget:
        return min(spare + 1, config.max_spare), 0
    if fraction < config.miss_budget * config.budget_clean_share:
        clean += 1
        if clean >= config.budget_clean_windows and spare:
            return spare - 1, 0
        return spare, clean
    return spare, 0


def _rate_sample(state: PolicyState, snapshot: MetricsSnapshot, now: float,
                 config: PolicyConfig) -> tuple[float, float, float]:
    """(rate_avg, inflight_avg, rate_at) after this snapshot: EWMAs of requests per second
    (time constant rate_window_s) and of requests in flight inside replicas
    (concurrency_window_s; 0 takes each sample as it is), where a sample dt after the last
    weighs 1 - exp(-dt / tau); the first sample is taken as it is. E.g. average 1,000/s,
    1 s later 2,000/s with tau 5 s: 1000 + 1000 x (1 - e^-0.2) = 1,181. Like KPA's
    windowed concurrency, so a burst the replicas absorb within the SLO is not a need for
    30 s; requests held at the gateway are not averaged: a function at zero acts on them
    at once, and a backlog that keeps growing still raises the average within seconds."""
    if state.rate_avg is None or state.rate_at is None or state.inflight_avg is None:
        return snapshot.rps, snapshot.inflight, now
    since = max(0.0, now - state.rate_at)
    weight = 1.0 - math.exp(-since / config.rate_window_s)
    inflight = snapshot.inflight
    if config.concurrency_window_s > 0:
        inflight = state.inflight_avg + (inflight - state.inflight_avg) * (
            1.0 - math.exp(-since / config.concurrency_window_s))
    return state.rate_avg + (snapshot.rps - state.rate_avg) * weight, inflight, now


def _variance_sample(state: PolicyState, snapshot: MetricsSnapshot, now: float,
                     config: PolicyConfig) -> tuple[float, float | None, float | None]:
    """(rate_var, rps_last, rps_last_at) after this snapshot. rate_var is an EWMA (time
    constant dispersion_window_s, from 0) of half the squared difference between this rate
    and the last one, times the window they were measured over: von Neumann's mean square
    successive difference, the variance of the request count in a window over its length,
    requests^2 per second. Differences of successive windows, not deviations from an
    average, so that a ramp or a step (from zero, too) reads as one burst, not as a minute
    of them. Poisson traffic at rate r gives r; renewal traffic with inter-arrival CV c
    about r x c^2 (Cox), so it reads burstiness without assuming a model. E.g. 1,000 then
    1,120 requests in 1 s windows 1 s apart: 120^2 x 1 / 2 = 7,200, weighing 1 - e^(-1/60)
    = 1.65 %. The two windows must not overlap: a rate over 30 s read every second (Prometheus'
    rate()) is compared with the one read 30 s before, not the last, whose window shares 29 s
    with it (their difference would read about a 30th of the variance); a window a little longer
    than the time since (a late scrape) waits a look. Unchanged without a window (a look
    between ticks) or before a disjoint one, and the first rate is only remembered."""
    if not snapshot.window_s or config.dispersion_window_s <= 0:
        return state.rate_var, state.rps_last, state.rps_last_at
    if state.rps_last is None or state.rps_last_at is None:
        return state.rate_var, snapshot.rps, now
    since = now - state.rps_last_at
    if since < snapshot.window_s - EPS or since <= 0.0:
        return state.rate_var, state.rps_last, state.rps_last_at
    diff = snapshot.rps - state.rps_last
    sample = diff * diff * snapshot.window_s * 0.5
    return state.rate_var + (sample - state.rate_var) * (1.0 - math.exp(-since / config.dispersion_window_s)), \
        snapshot.rps, now


def _duty_sample(state: PolicyState, snapshot: MetricsSnapshot, batched: tuple[float, float] | None, now: float,
                 config: PolicyConfig) -> tuple[float | None, float | None, float | None]:
    """(duty_avg, duty_since, duty_last) after this snapshot: an EWMA of the mean replica
    duty, time constant slice_window_s, where a sample dt after the last one weighs
    1 - exp(-dt / tau). Its age counts from the first sample, so a hint needs a whole
    window of evidence. No duty sample: unchanged. For a model that batches (`batched`, its
    full batch's rows and seconds), the duty its load would have at full batches, when less: a batcher with no queue delay is busy
    whenever a request is queued, so its duty reads high at loads that fuller batches carry
    in a fraction of the time (e.g. 700 requests/s, full batches of 8 rows in 6 ms, on 2
    replicas: 700 x 0.006 / 8 / 2 = 0.26, where the replicas read 0.9 running batches of 3)."""
    if not snapshot.duty:
        return state.duty_avg, state.duty_since, state.duty_last
    mean = _total(snapshot.duty) / len(snapshot.duty)
    if batched is not None and snapshot.ready:
        mean = min(mean, snapshot.rps * batched[1] / batched[0] / snapshot.ready)
    if state.duty_avg is None or state.duty_last is None:
        return mean, now, now
    since = now - state.duty_last
    weight = 1.0 - math.exp(-max(0.0, since) / config.slice_window_s)
    return state.duty_avg + (mean - state.duty_avg) * weight, state.duty_since, now


def rise_horizon_s(snapshot: MetricsSnapshot, config: PolicyConfig) -> float:
    """What a rise of the need is read over: a cold start and a look (what no scale-up can
    follow), plus rise_lag_windows rate windows, since the need reads the rate's EWMA: a step
    in the load shows as 1 - e^(-t / rate_window_s) of it t seconds on. E.g. a 2 s cold start:
    over 3 s a step reads as 1 - e^(-3/5) = 45 % of it, over 3 + 0.5 x 5 = 5.5 s (the default)
    as 1 - e^(-5.5/5) = 67 %."""
    return follow_s(snapshot, config) + config.rise_lag_windows * config.rate_window_s


def _rise_sample(state: PolicyState, needs: tuple[NeedAt, ...], now: float, horizon_s: float,
                 config: PolicyConfig) -> tuple[float, float | None, float, float | None]:
    """(rise, rise_at, rise2, rise2_at) after this look. A rise is how far the need went up
    within `horizon_s` (rise_horizon_s: what no scale-up can follow, as the need shows it);
    the two largest of different bursts are kept, decaying with time constant
    reserve_memory_s, and the second is the reserve: a rise seen once (a one-off spike) holds
    nothing, one that came again holds the smaller of the two. A rise read within `horizon_s`
    of the last look that kept one is the same burst, still rising: the largest stays and its
    time moves on to this look, so a need that stays above its low over the horizon is one
    burst however long. E.g. rises 1.2 at t = 12 and 0.9 at t = 300: the reserve is 0.9, and
    at t = 600 0.9 x e^(-300/600) = 0.55. The rise is of the need, which reads the rate's 5 s
    average: a rise at the look's own rate was tried and taken back (docs/simlive.md)."""
    if config.reserve_memory_s <= 0:
        return 0.0, None, 0.0, None
    x = needs[-1].replicas - window_min(needs, now, horizon_s)
    rise, rise_at, rise2, rise2_at = state.rise, state.rise_at, state.rise2, state.rise2_at
    if x <= 0:
        return rise, rise_at, rise2, rise2_at
    top = _decayed(rise, rise_at, now, config)
    if rise_at is not None and now - rise_at <= horizon_s:
        return max(top, x), now, rise2, rise2_at  # the largest burst, still rising
    if x > top:
        return x, now, top, (now if rise_at is not None else None)
    if x > _decayed(rise2, rise2_at, now, config):
        return rise, rise_at, x, now
    return rise, rise_at, rise2, rise2_at


def _decayed(value: float, at: float | None, now: float, config: PolicyConfig) -> float:
    if at is None or value <= 0 or config.reserve_memory_s <= 0:
        return 0.0
    return value * math.exp(-max(0.0, now - at) / config.reserve_memory_s)


def reserve(state: PolicyState, now: float, config: PolicyConfig) -> float:
    """The reserve now: the second largest recent rise (of another burst), decayed; the
    largest once two bursts within reserve_memory_s rose past what was held and missed the SLO
    (_missed_sample): bursts that recur and grow, as the real trace's do, are each larger than
    the second largest before them."""
    second = _decayed(state.rise2, state.rise2_at, now, config)
    if holds_largest(state, now, config):
        return max(second, _decayed(state.rise, state.rise_at, now, config))
    return second


def holds_largest(state: PolicyState, now: float, config: PolicyConfig) -> bool:
    """Whether the reserve holds the largest rise: the last two missed bursts (_missed_sample)
    were both short and the older began within reserve_memory_s of `now`."""
    m = state.missed_at
    return len(m) == 4 and m[0] >= 0 and m[2] >= 0 and now - m[0] <= config.reserve_memory_s


def reserve_under(state: PolicyState, level: float, now: float, config: PolicyConfig) -> float:
    """When the reserve, with no new rise, is at or below `level` (> 0): each rise held decays
    below it at at + memory x ln(rise / level), and the largest stops being held once its older
    burst is reserve_memory_s old. E.g. rises 3.0 at 100 and 1.0 at 40, the older missed burst
    from 50, level 2: the largest decays to 2 at 100 + 600 ln 1.5 = 343.3, before it is let go at
    50 + 600 = 650; the second is under 2 already: 343.3. Level 1: let go at 650 (it would
    decay to 1 only at 759), the second 1.0 is not over 1: 650."""
    def under(rise: float, at: float | None) -> float:
        if at is None or rise <= level:
            return -math.inf
        return at + config.reserve_memory_s * math.log(rise / level)

    second = under(state.rise2, state.rise2_at)
    if not holds_largest(state, now, config):
        return second
    return max(second, min(under(state.rise, state.rise_at), state.missed_at[0] + config.reserve_memory_s))


def _missed_sample(state: PolicyState, snapshot: MetricsSnapshot, needs: tuple[NeedAt, ...], now: float,
                   horizon_s: float, config: PolicyConfig) -> tuple[float, ...]:
    """(start, last) of the last two bursts that missed, flattened: runs of looks, each within
    `horizon_s` (a cold start and a look) of the last, where more than miss_budget of the
    window's requests were over the SLO, begun at one where the need had risen within
    `horizon_s` by at least MISSED_RISE replicas (where each look reads its own share, the
    looks after it miss rising or not: a backlog draining after a spike is the spike's run). A
    run longer than MISSED_SHORT horizons is a step, not a burst the reserve could hold (a spike
    the cluster cannot follow, a backlog): its start becomes -1.
    E.g. misses at 50-51 and 144-147 with a 3.5 s horizon: (50, 51, 144, 147), two short bursts."""
    if config.reserve_memory_s <= 0 or snapshot.over_slo <= config.miss_budget or not needs:
        return state.missed_at
    m = state.missed_at
    rose = needs[-1].replicas - window_min(needs, now, horizon_s) >= MISSED_RISE
    # the same burst, still missing: rising or not where the share over the SLO is the look's
    # own (a backlog drained after a spike misses for as long as it takes), rising where it is
    # read over a window longer than the horizon (a PromQL rate over 30 s shows the last
    # burst's misses for that long: its tail is no new miss)
    if m and now - m[-1] <= max(horizon_s, snapshot.window_s) and (rose or snapshot.window_s <= horizon_s):
        began = m[-2] if m[-2] >= 0 and now - m[-2] <= MISSED_SHORT * horizon_s else -1.0
        return m[:-2] + (began, now)
    if not rose:
        return m  # a new burst is one that rose
    return (m + (now, now))[-4:]


def _held_sample(state: PolicyState, snapshot: MetricsSnapshot) -> tuple[float, float]:
    """(held_max, cold_misses) after this snapshot: while no replica is ready, the most
    requests waiting at once (held, or queued at a replica still starting); when one is, that count is a cold start's measured misses,
    folded in: up at once, down halfway per cold start (the SLO first). E.g. 31 held, then
    a cold start with 5: max(5, (31 + 5) / 2) = 18."""
    if snapshot.ready == 0:
        return max(state.held_max, snapshot.demand), state.cold_misses
    if state.held_max <= 0:
        return 0.0, state.cold_misses
    sample = state.held_max
    return 0.0, max(sample, (state.cold_misses + sample) / 2) if state.cold_misses else sample


def cold_start_misses(rate_rps: float, cold_start_s: float, slo_s: float) -> float:
    """Requests that miss the SLO when a request finds the function cold: the first one, and
    those arriving while less than the SLO of the cold start is left; none when the cold start
    is within the SLO. E.g. 2 rps, 2.0 s cold, 0.5 s SLO: 1 + 2 x 1.5 = 4."""
    if cold_start_s <= slo_s:
        return 0.0
    return 1.0 + max(0.0, rate_rps) * (cold_start_s - slo_s)


def _cold_cost_s(state: PolicyState, snapshot: MetricsSnapshot, spec: ScalingSpec, rate_avg: float, active: bool,
                 cold_misses: float, config: PolicyConfig) -> float | None:
    """What a cold start of this function would cost, in seconds of one idle replica: the
    requests that would miss the SLO through it (as many as were held through its past cold
    starts, or cold_start_misses at the rate while active; none when the cold start is within
    the SLO) x miss_price_slice_s / the replica's slice. Set while traffic flows, kept through
    idle time. E.g. 3/s, a 2.5 s cold start, SLO 200 ms: 1 + 3 x 2.3 = 7.9 misses x 240 / 0.25
    = 7,584 s (keep_alive_s caps it: 1,800 s, or 30 x idle_to_zero_s while few gaps are known)."""
    if not active or config.miss_price_slice_s <= 0:
        return state.cold_cost_s
    lead, slo_s = lead_s(snapshot, config), spec.slo_p95_ms / 1000.0
    if lead <= slo_s:
        return 0.0
    misses = max(cold_misses, cold_start_misses(rate_avg, lead, slo_s))
    return misses * config.miss_price_slice_s / (snapshot.slice_fraction or 1.0)


def _total(values: tuple[float, ...]) -> float:
    """The values added left to right, as sum() adds floats up to Python 3.11 (3.12's sum()
    compensates): a loop, so that a compiled look adds natively (sum() of a tuple is a call
    into the interpreter), and the same digits compiled or not."""
    total = 0.0
    for value in values:
        total += value
    return total


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-6) if x > 0 else 0


def _bound(n: int, spec: ScalingSpec) -> int:
    return max(spec.min_replicas, min(n, spec.max_replicas))
