"""The scaling policy: `decide(snapshot, spec, state, now) -> (ScaleDecision, state)`, pure.

First version (issue 3); the full latency- and duty-driven policy replaces it
behind the same interface (issue 4). It scales

- from zero at once when a request is held at the gateway (COLD_START);
- out when demand per replica passes the target concurrency, or the summed
  duty cycle passes the target duty (BURST / STABLE);
- in one replica at a time, after `scale_down_delay_s` of lower demand;
- to zero after `idle_to_zero_s` with nothing in flight or held (TO_ZERO).

Replicas still starting count as capacity, so a slow start does not trigger a
second one for the same demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoscaler.metrics import MetricsSnapshot
from functions.spec import ScalingSpec

REASONS = ("STABLE", "BURST", "COLD_START", "TO_ZERO", "HOLD", "NO_DATA", "SLO", "BOUNDS")


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    scale_down_delay_s: float = 10.0
    max_scale_up_step: int = 8

    def __post_init__(self) -> None:
        if self.scale_down_delay_s < 0:
            raise ValueError(f"scale_down_delay_s ({self.scale_down_delay_s}) must be >= 0")
        if self.max_scale_up_step < 1:
            raise ValueError(f"max_scale_up_step ({self.max_scale_up_step}) must be >= 1")


@dataclass(frozen=True, slots=True)
class PolicyState:
    last_active_at: float | None = None  # last time anything was in flight or held
    below_since: float | None = None  # since when demand wanted fewer replicas


def decide(
    snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState, now: float,
    config: PolicyConfig = PolicyConfig(),
) -> tuple[ScaleDecision, PolicyState]:
    current = snapshot.ready + snapshot.starting
    demand = snapshot.demand
    if demand > 0 or state.last_active_at is None:
        # the first look at a function counts as activity: a replica that was just
        # warmed up gets its idle_to_zero_s before it goes
        state = replace(state, last_active_at=now)
    if current == 0:
        return _from_zero(snapshot, spec, state)
    wanted = _demand_replicas(snapshot, spec)
    if wanted > current:
        step = min(wanted, current + config.max_scale_up_step)
        desired = _bound(step, spec)
        return ScaleDecision(desired, "BURST", f"demand {demand:g} needs {wanted} replicas"), replace(state, below_since=None)
    idle_for = now - state.last_active_at if state.last_active_at is not None else math.inf
    if demand == 0 and idle_for >= spec.idle_to_zero_s:
        return ScaleDecision(spec.min_replicas, "TO_ZERO", f"idle {idle_for:.0f} s"), replace(state, below_since=None)
    if wanted < current:
        below_since = state.below_since if state.below_since is not None else now
        state = replace(state, below_since=below_since)
        if now - below_since >= config.scale_down_delay_s:
            desired = _bound(max(wanted, 1, current - 1), spec)
            return ScaleDecision(desired, "STABLE", f"demand {demand:g} needs {wanted}"), replace(state, below_since=now)
        return ScaleDecision(current, "HOLD", "waiting before scale-down"), state
    return ScaleDecision(_bound(current, spec), "STABLE", ""), replace(state, below_since=None)


def _from_zero(snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState) -> tuple[ScaleDecision, PolicyState]:
    if snapshot.demand > 0:
        wanted = max(1, _demand_replicas(snapshot, spec))
        return ScaleDecision(_bound(wanted, spec), "COLD_START", f"{snapshot.demand:g} waiting"), state
    return ScaleDecision(spec.min_replicas, "STABLE" if spec.min_replicas else "TO_ZERO", ""), state


def _demand_replicas(snapshot: MetricsSnapshot, spec: ScalingSpec) -> int:
    """Replicas the load needs: by concurrency (Little's law) and by duty cycle.
    E.g. 9 in flight at target 4 per replica -> ceil(9/4) = 3; duties 0.9+0.8 at
    target 0.7 -> ceil(1.7/0.7) = 3."""
    by_concurrency = math.ceil(snapshot.demand / spec.target_concurrency)
    by_duty = math.ceil(sum(snapshot.duty) / spec.target_duty - 1e-9) if snapshot.duty else 0
    return max(by_concurrency, by_duty)


def _bound(n: int, spec: ScalingSpec) -> int:
    return max(spec.min_replicas, min(spec.max_replicas, n))
