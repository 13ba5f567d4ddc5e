"""Knative's KPA, re-implemented from its sources as a pure baseline policy with Shoal's
interface, `decide(snapshot, spec, state, now) -> (ScaleDecision, state)`; it imports no clock.
Written from scratch after reading knative/serving (versions in docs/research/autoscaling-baselines.md
section 1; what it observes and when it decides in docs/design/baselines.md):
- pkg/autoscaler/scaling/autoscaler.go, (*autoscaler).Scale: the decision step;
- pkg/autoscaler/aggregation/bucketing.go, TimedFloat64Buckets: the window averages;
- pkg/autoscaler/config/config.go, defaultConfig: the defaults;
- pkg/reconciler/autoscaling/kpa/scaler.go, handleScaleToZero: the grace period to zero;
- pkg/reconciler/autoscaling/resources/target.go, ResolveMetricTarget: an annotation target T is the
  per-pod total, and the per-pod target is T x the target utilization 0.7 (T = 10 -> 7);
- pkg/reconciler/autoscaling/kpa/kpa.go, ReconcileKind: the activator is in the request path (SKS
  in proxy mode) while the scale is 0 or the excess burst capacity, computed at the end of Scale
  (autoscaler.go) from target-burst-capacity (200, config.go), is negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import ScaleDecision
from functions.spec import ScalingSpec

TARGET_MIN = 0.01  # autoscaling.TargetMin


@dataclass(frozen=True, slots=True)
class KpaConfig:
    """config-autoscaler defaults (K3). `container_concurrency_target` is the per-pod total:
    `container-concurrency-target-default` (100), or an `autoscaling.knative.dev/target`
    annotation, which replaces it (target.go); `target_burst_capacity` -1 keeps the activator
    in the path always, 0 only at zero scale."""

    container_concurrency_target: float = 100.0
    target_utilization: float = 0.70
    target_burst_capacity: float = 200.0
    stable_window_s: float = 60.0
    panic_window_pct: float = 10.0
    panic_threshold_pct: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    tick_s: float = 2.0
    bucket_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_scale_up_rate <= 1 or self.max_scale_down_rate <= 1:
            raise ValueError(f"max scale rates ({self.max_scale_up_rate}, {self.max_scale_down_rate}) must be > 1")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization ({self.target_utilization}) must be within (0, 1]")
        if self.target_burst_capacity < 0 and self.target_burst_capacity != -1:
            raise ValueError(f"target_burst_capacity ({self.target_burst_capacity}) must be >= 0, or -1 (unlimited)")
        if self.stable_window_s < 6 or self.scale_to_zero_grace_s <= 0:
            raise ValueError(f"stable_window_s ({self.stable_window_s}) must be >= 6 and the grace period > 0")

    @property
    def target(self) -> float:
        """Per-pod target: 100 x 70 % = 70 concurrent requests; an annotation 10 -> 7. At least
        TargetMin, 0.01 (newer target.go; older ones floored at 1)."""
        return max(TARGET_MIN, self.container_concurrency_target * self.target_utilization)

    @property
    def panic_window_s(self) -> float:
        """10 % of the 60 s stable window = 6 s, at least one bucket."""
        return max(self.bucket_s, round(self.stable_window_s * self.panic_window_pct / 100.0))

    @property
    def panic_threshold(self) -> float:
        return self.panic_threshold_pct / 100.0


@dataclass(frozen=True, slots=True)
class Buckets:
    """A window of 1 s buckets, as TimedFloat64Buckets: values in the same second add up, and
    the average is over the seconds since the first write when that is less than a window."""

    window_s: float
    bucket_s: float = 1.0
    values: tuple[tuple[int, float], ...] = ()  # (bucket index, sum), oldest first
    first: int | None = None
    last: int | None = None

    @property
    def size(self) -> int:
        return math.ceil(self.window_s / self.bucket_s)

    def record(self, t: float, value: float) -> "Buckets":
        b = math.floor(t / self.bucket_s)
        if self.last is not None and b <= self.last - self.size:
            return self  # older than a window behind the newest write: ignored
        if self.last is None or b - self.last >= self.size:
            return replace(self, values=((b, value),), first=b, last=b)  # a window of silence: start over
        merged = dict(self.values)
        merged[b] = merged.get(b, 0.0) + value
        last = max(self.last, b)
        kept = tuple(sorted((k, v) for k, v in merged.items() if k > last - self.size))
        return replace(self, values=kept, last=last)

    def average(self, now: float) -> float:
        if self.last is None:
            return 0.0
        n = math.floor(now / self.bucket_s)
        valid = self.last - self.first + 1
        if n <= self.last:
            total, count = sum(v for _, v in self.values), min(valid, self.size)
        elif n - self.last < self.size:
            dropped = n - self.last  # buckets between the last write and now are empty
            total = sum(v for k, v in self.values if k > n - self.size)
            count = min(valid, self.size - dropped)
        else:
            return 0.0
        return math.floor(total / count * 1e6) / 1e6  # roundToNDigits(6)

    def is_empty(self, now: float) -> bool:
        return self.last is None or math.floor(now / self.bucket_s) - self.last > self.size


@dataclass(frozen=True, slots=True)
class KpaState:
    stable: Buckets = field(default_factory=lambda: Buckets(60.0))
    panic: Buckets = field(default_factory=lambda: Buckets(6.0))
    panic_time: float | None = None
    max_panic_pods: int = 0
    desired: int = -1  # -1: no decision yet
    last_tick: float | None = None
    zero_since: float | None = None  # when the decision first reached 0 (grace period)
    # SKS in proxy mode: a new revision's SKS starts so (no decision yet, no pods); then
    # want == 0 or EBC < 0 at the last tick (kpa.go)
    activator_in_path: bool = True
    excess_burst_capacity: int = -1


def initial_state(config: KpaConfig = KpaConfig(), ready: int = 0, now: float = 0.0) -> KpaState:
    """newAutoscaler: with more than one pod ready it starts in panic (PR #4795). With `ready`
    pods (running, or a new revision's initial scale) its scale starts there, as decide() would
    take it from what runs, and stays until the grace period after the decision reaches 0."""
    state = KpaState(stable=Buckets(config.stable_window_s, config.bucket_s),
                     panic=Buckets(config.panic_window_s, config.bucket_s))
    if ready > 0:
        state = replace(state, desired=ready)
    return replace(state, panic_time=now, max_panic_pods=ready) if ready > 1 else state


def decide(snapshot: MetricsSnapshot, spec: ScalingSpec, state: KpaState, now: float,
           config: KpaConfig = KpaConfig()) -> tuple[ScaleDecision, KpaState]:
    if state.desired < 0:  # no decision yet: the scale is what runs, kept as such until the grace period
        state = replace(state, desired=snapshot.ready + snapshot.starting)
    state = replace(state, stable=state.stable.record(now, snapshot.demand),
                    panic=state.panic.record(now, snapshot.demand))
    due = state.last_tick is None or now - state.last_tick >= config.tick_s or (
        state.desired == 0 and snapshot.demand > 0)  # Poke: scale from zero at once
    if not due:
        return _hold(state, snapshot), state
    state = replace(state, last_tick=now)
    if state.stable.is_empty(now):
        return _hold(state, snapshot, "NO_DATA"), state  # ErrNoData: keep the previous decision
    panic = state.panic.average(now)
    desired, reason, state = scale_step(snapshot.ready, state.stable.average(now), panic, state, now, config)
    decision, state = apply_bounds(desired, reason, spec, state, now, config)
    return place_activator(decision, state, excess_burst_capacity(snapshot.ready, panic, config))


def excess_burst_capacity(ready_pods: int, panic: float, config: KpaConfig) -> int:
    """The end of (*autoscaler).Scale: the spare requests the ready pods can take beyond a burst of
    target-burst-capacity, from the panic average and the unfloored ready count. TBC 0 -> 0 (never
    negative), -1 -> -1 (always). E.g. annotation 4, 3 pods, 10 in flight: floor(3 x 4 - 200 - 10)
    = -198 < 0; annotation 100, 3 pods: floor(300 - 200 - 10) = 90."""
    if config.target_burst_capacity == 0:
        return 0
    if config.target_burst_capacity < 0:
        return -1
    return math.floor(ready_pods * config.container_concurrency_target - config.target_burst_capacity - panic)


def place_activator(decision: ScaleDecision, state: KpaState, ebc: int) -> tuple[ScaleDecision, KpaState]:
    """kpa.go's ReconcileKind: the activator stays in (or enters) the request path when the
    decider wants 0 (the PA is inactive: through the grace period, and at 0) or the excess burst
    capacity is negative; said in the decision's detail and kept in the state."""
    in_path = decision.reason in ("HOLD", "TO_ZERO") or ebc < 0  # the decider wants 0: grace period or at 0
    where = "activator in path" if in_path else "activator out of path"
    detail = f"{decision.detail}; {where} (ebc {ebc})" if decision.detail else f"{where} (ebc {ebc})"
    return decision._replace(detail=detail), replace(state, activator_in_path=in_path, excess_burst_capacity=ebc)


def scale_step(ready_pods: int, stable: float, panic: float, state: KpaState, now: float,
               config: KpaConfig) -> tuple[int, str, KpaState]:
    """(*autoscaler).Scale. E.g. ready 2, panic average 280, target 70: ceil(280/70) = 4 pods,
    4/2 = 2.0 >= 2.0 -> panic; desired max(ceil(100/70) = 2, 4) = 4."""
    ready = max(1, ready_pods)
    max_up = math.ceil(config.max_scale_up_rate * ready)
    max_down = math.floor(ready / config.max_scale_down_rate)
    dspc = math.ceil(stable / config.target)
    dppc = math.ceil(panic / config.target)
    d_stable = min(max(dspc, max_down), max_up)
    d_panic = min(max(dppc, max_down), max_up)
    over = dppc / ready >= config.panic_threshold  # unclamped, '>='
    if over:
        state = replace(state, panic_time=now)  # enter, or extend
    elif state.panic_time is not None and state.panic_time + config.stable_window_s < now:
        state = replace(state, panic_time=None, max_panic_pods=0)  # strictly after a stable window
    if state.panic_time is None:
        return d_stable, "STABLE", state
    desired = max(d_stable, d_panic, state.max_panic_pods)  # panic never scales down
    return desired, "BURST", replace(state, max_panic_pods=desired)


def apply_bounds(desired: int, reason: str, spec: ScalingSpec, state: KpaState, now: float,
                 config: KpaConfig) -> tuple[ScaleDecision, KpaState]:
    """min/max scale, and zero only after the grace period (handleScaleToZero): the stable
    window has already drained before the decision reaches 0, then 30 s more."""
    bounded = max(spec.min_replicas, min(spec.max_replicas, desired))
    if bounded > 0:
        return ScaleDecision(bounded, reason), replace(state, desired=bounded, zero_since=None)
    zero_since = state.zero_since if state.zero_since is not None else now
    state = replace(state, zero_since=zero_since)
    if now - zero_since >= config.scale_to_zero_grace_s:
        return ScaleDecision(0, "TO_ZERO", "grace period over"), replace(state, desired=0)
    keep = max(0, state.desired)  # the scale stays where it is until the grace period is over
    return ScaleDecision(keep, "HOLD", f"to zero in {config.scale_to_zero_grace_s - (now - zero_since):.0f} s"), state


def _hold(state: KpaState, snapshot: MetricsSnapshot, reason: str = "HOLD") -> ScaleDecision:
    current = state.desired if state.desired >= 0 else snapshot.ready + snapshot.starting
    return ScaleDecision(current, reason)
