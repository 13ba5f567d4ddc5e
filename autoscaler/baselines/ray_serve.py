"""Ray Serve's default policy, `replica_queue_length_autoscaling_policy`, re-implemented from
scratch as a pure Shoal policy, `decide(snapshot, spec, state, now, config) -> (ScaleDecision,
RayState)`. It follows docs/research/autoscaling-baselines.md section 2, written from these
ray-project/ray files (described there, not copied here); docs/design/baselines.md maps Shoal's
snapshot onto Ray's context and lists what is not modelled. `now` is an argument: it must not
import asyncio, httpx or time, nor read a clock.
- python/ray/serve/autoscaling_policy.py: `replica_queue_length_autoscaling_policy`,
  `_apply_scaling_factors`, `_apply_delay_logic`, the wall-clock delays with
  `_DELAY_ELAPSED_EPS_S` (R1, after PRs #62144/#62331) and the counter-based delays with
  `_apply_autoscaling_config` before them (R2);
- python/ray/serve/config.py: `AutoscalingConfig` defaults, `get_upscaling_factor` (R5);
- python/ray/serve/_private/constants.py: `DEFAULT_TARGET_ONGOING_REQUESTS` (R6);
- python/ray/serve/_private/autoscaling_state.py: `AutoscalingState.apply_bounds`,
  `get_total_num_requests` (R7);
- python/ray/serve/_private/metrics_utils.py: `InMemoryMetricsStore.window_average` (R8);
- python/ray/serve/_private/router.py: `RouterMetricsManager` (R9): a handle sends a replica at
  most `max_ongoing_requests` (5 since Ray 2.32, constants.py) and queues the rest; it pushes its
  queued count as it is, and at once when it sees 0 replicas with requests queued
  (`should_send_scaled_to_zero_optimized_push`); replicas push the look-back average of their
  ongoing requests every `metrics_interval_s` (10 s, config.py `DEFAULT_METRICS_INTERVAL_S`).
  The controller sums the last pushes (simple mode, autoscaling_state.py R7 id 629402420), so
  between pushes it decides on the same, up to 10 s old, total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import ScaleDecision
from functions.spec import ScalingSpec

# R1 compares elapsed wall time with a small tolerance, so that a delay of 30 s
# measured as 29.9999999 s after float sums still fires.
DELAY_ELAPSED_EPS_S = 1e-6


@dataclass(frozen=True, slots=True)
class RayConfig:
    """Ray Serve's `AutoscalingConfig` defaults (doc section 2.1). `None` for
    `downscale_to_zero_delay_s` means the 1 -> 0 step waits `downscale_delay_s`."""

    target_ongoing_requests: float = 2.0  # was 1.0 before Ray 2.32.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    look_back_period_s: float = 30.0
    upscaling_factor: float = 1.0  # None -> smoothing_factor = 1.0 in Ray
    downscaling_factor: float = 1.0
    max_ongoing_requests: int = 5  # a deployment option, not the policy's; was 100 before Ray 2.32.0
    metrics_interval_s: float = 10.0  # how often replicas and handles push their metrics

    def __post_init__(self) -> None:
        if not (isinstance(self.max_ongoing_requests, int) and self.max_ongoing_requests >= 1):
            raise ValueError(f"max_ongoing_requests ({self.max_ongoing_requests}) must be a whole number >= 1")
        for name in ("target_ongoing_requests", "look_back_period_s", "upscaling_factor", "downscaling_factor",
                     "metrics_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be > 0")
        for name in ("upscale_delay_s", "downscale_delay_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.downscale_to_zero_delay_s is not None and not self.downscale_to_zero_delay_s >= 0:
            raise ValueError(
                f"downscale_to_zero_delay_s ({self.downscale_to_zero_delay_s}) must be >= 0, "
                "or None to use downscale_delay_s"
            )

    def delay_for(self, target: int, scaled: int) -> float:
        """Seconds a streak must last before `scaled` replaces `target`."""
        if scaled > target:
            return self.upscale_delay_s
        if target == 1 and self.downscale_to_zero_delay_s is not None:
            return self.downscale_to_zero_delay_s
        return self.downscale_delay_s


@dataclass(frozen=True, slots=True)
class RayState:
    """What Ray keeps between calls: the metric samples of the look-back window,
    and the `_policy_state` dict (`decision_counter`, `decision_timestamp`).
    The counter's sign is the streak's direction (+ up, - down); its size counts calls."""

    samples: tuple[tuple[float, float], ...] = ()  # (at, ongoing requests in the replicas)
    decision_counter: int = 0
    decision_timestamp: float | None = None
    pushed_total: float = 0.0  # what the controller last received: replicas' average + handle's queue
    pushed_at: float | None = None


def decide(
    snapshot: MetricsSnapshot, spec: ScalingSpec, state: RayState, now: float,
    config: RayConfig = RayConfig(),
) -> tuple[ScaleDecision, RayState]:
    """One call of Ray's control loop (doc section 2.3): average the metric, take
    the cold-start fast path at 0 running, else ratio -> factors -> bounds -> delays
    -> bounds. E.g. 12 ongoing on 3 running: 12 / (2 * 3) = 2 -> 6 replicas, decided
    once 6 has been wanted for 30 s; until then the target 3 stays (HOLD). The total is the
    one last pushed (`push_metrics`)."""
    state = push_metrics(snapshot, state, now, config)
    total = state.pushed_total
    running, target = snapshot.ready, snapshot.ready + snapshot.starting
    if running == 0:
        return _decide_from_zero(total, target, spec, config), state
    raw = calculate_raw_replicas(total, running, config.target_ongoing_requests)
    scaled = apply_bounds(apply_scaling_factors(raw, running, config), spec)
    decision, state = apply_delay_logic(scaled, target, state, now, config)
    bounded = apply_bounds(decision, spec)
    reason = _reason(target, scaled, decision, bounded)
    return ScaleDecision(bounded, reason, _explain(total, running, raw, scaled, target, state, now, config)), state


def split_ongoing(snapshot: MetricsSnapshot, max_ongoing_requests: int) -> tuple[float, float]:
    """(ongoing in the replicas, queued at the handle): a running replica holds at most
    `max_ongoing_requests`; the rest, and every request while none runs, wait at the router.
    E.g. 14 in the system on 2 running, max 5: (10, 4)."""
    ongoing = min(snapshot.inflight, max_ongoing_requests * snapshot.ready)
    return ongoing, snapshot.demand - ongoing


def push_metrics(snapshot: MetricsSnapshot, state: RayState, now: float, config: RayConfig) -> RayState:
    """The replicas record their ongoing requests at each call; every `metrics_interval_s` the
    controller receives their look-back average plus the handle's queue as it is then, and at
    once when nothing runs and requests wait (the scale-from-zero push). E.g. pushed at 0 s:
    the total stays the 0 s one through 9 s, and is pushed again at 10 s."""
    ongoing, queued = split_ongoing(snapshot, config.max_ongoing_requests)
    samples = record_sample(state.samples, now, ongoing, config.look_back_period_s)
    due = (state.pushed_at is None or now - state.pushed_at + DELAY_ELAPSED_EPS_S >= config.metrics_interval_s
           or (snapshot.ready == 0 and queued > 0))
    if not due:
        return replace(state, samples=samples)
    return replace(state, samples=samples, pushed_total=window_average(samples) + queued, pushed_at=now)


def record_sample(
    samples: tuple[tuple[float, float], ...], now: float, value: float, look_back_s: float,
) -> tuple[tuple[float, float], ...]:
    """Add (now, value) and keep the samples in (now - look_back_s, now], as
    `window_average` does: with 30 s, a sample taken at 0 s is gone at 30 s."""
    start = now - look_back_s
    return tuple(s for s in samples if start < s[0] <= now) + ((now, value),)


def window_average(samples: tuple[tuple[float, float], ...]) -> float:
    """Arithmetic mean of the samples' values; 0.0 with none."""
    return sum(v for _, v in samples) / len(samples) if samples else 0.0


def calculate_raw_replicas(total: float, running: int, target_ongoing_requests: float) -> float:
    """Ray's ratio, in Ray's order of operations: running * (total / (target * running)).
    E.g. 12 ongoing, target 2, 3 running -> 3 * (12 / 6) = 6.0."""
    return running * (total / (target_ongoing_requests * running))


def apply_scaling_factors(raw: float, running: int, config: RayConfig) -> int:
    """Move `factor` of the way from running to raw, rounding up (`_apply_scaling_factors`).
    A downscale the rounding would cancel still takes one replica off: 3 running,
    raw 1.95, factor 0.5 -> ceil(3 - 0.525) = 3, but ceil(1.95) = 2 < 3 -> 2."""
    delta = raw - running
    factor = config.upscaling_factor if delta > 0 else config.downscaling_factor
    scaled = math.ceil(running + factor * delta)
    if math.ceil(raw) < running and scaled == running:
        scaled -= 1
    return scaled


def apply_bounds(n: int, spec: ScalingSpec) -> int:
    """Clamp to [min_replicas, max_replicas] (`AutoscalingState.apply_bounds`)."""
    return max(spec.min_replicas, min(spec.max_replicas, n))


def apply_delay_logic(
    scaled: int, target: int, state: RayState, now: float, config: RayConfig,
) -> tuple[int, RayState]:
    """R1's `_apply_delay_logic`: `scaled` replaces `target` only after an unbroken
    streak in one direction has lasted the delay in wall time; otherwise the
    target stays. A call with scaled == target, or a change of direction, restarts it.
    Above one replica a downscale stops at 1: 1 -> 0 is a streak of its own."""
    if scaled == target:
        return target, replace(state, decision_counter=0, decision_timestamp=None)
    if target > 1:
        scaled = max(1, scaled)
    state = _extend_streak(state, now, up=scaled > target)
    elapsed = now - state.decision_timestamp
    if elapsed + DELAY_ELAPSED_EPS_S >= config.delay_for(target, scaled):
        return scaled, replace(state, decision_counter=0, decision_timestamp=None)
    return target, state


def _extend_streak(state: RayState, now: float, up: bool) -> RayState:
    """Count one more call in the streak's direction, starting a new streak on a flip.
    Ray writes `timestamp or now`; `is None` here, since a fake clock may start at 0.0."""
    counter = state.decision_counter
    timestamp = state.decision_timestamp
    if (up and counter < 0) or (not up and counter > 0):
        counter, timestamp = 0, None
    counter += 1 if up else -1
    return replace(state, decision_counter=counter, decision_timestamp=now if timestamp is None else timestamp)


def _decide_from_zero(total: float, target: int, spec: ScalingSpec, config: RayConfig) -> ScaleDecision:
    """Cold-start fast path: no running replica. Requests waiting -> at least
    ceil(1 * upscaling_factor) at once, no delay, no averaging of the ratio; replicas
    already starting are kept (max with target). Nothing waiting -> keep the target."""
    if total > 0:
        wanted = max(math.ceil(1 * config.upscaling_factor), target)
        detail = f"0 running, {total:g} ongoing -> max(ceil(1 * {config.upscaling_factor:g}), target {target}) = {wanted}"
        return ScaleDecision(apply_bounds(wanted, spec), "COLD_START", detail)
    desired = apply_bounds(target, spec)
    return ScaleDecision(desired, "TO_ZERO" if desired == 0 else "STABLE", f"0 running, 0 ongoing: keep target {target}")


def _reason(target: int, scaled: int, decision: int, bounded: int) -> str:
    if bounded != decision:
        return "BOUNDS"  # the target itself was outside [min, max], e.g. after a spec change
    if bounded == 0:
        return "TO_ZERO"
    if decision > target:
        return "BURST"
    if decision == target and scaled != target:
        return "HOLD"
    return "STABLE"


def _explain(
    total: float, running: int, raw: float, scaled: int, target: int, state: RayState, now: float, config: RayConfig,
) -> str:
    """Ray's arithmetic, e.g. '12 ongoing / (2 per replica * 3 running) = 2 -> raw 6
    -> scaled 6 vs target 3; up for 12.3 s of 30 s'."""
    text = (f"{total:g} ongoing / ({config.target_ongoing_requests:g} per replica * {running} running) = "
            f"{total / (config.target_ongoing_requests * running):g} -> raw {raw:g} -> scaled {scaled} vs target {target}")
    if state.decision_timestamp is None:
        return text
    direction = "up" if state.decision_counter > 0 else "down"
    return f"{text}; {direction} for {now - state.decision_timestamp:g} s of {config.delay_for(target, scaled):g} s"
