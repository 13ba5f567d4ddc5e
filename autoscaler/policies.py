"""The policies a control loop can run, by name (`shoal up --policy shoal|kpa|ray`): Shoal's own
(`autoscaler.policy`) and the two baselines (`autoscaler.baselines`), each behind the loop's
`Policy` interface, `initial(spec, ready, now)` and `decide(snapshot, spec, state, now)`. A
baseline is fed as its user would configure it for the function: the spec's `target_concurrency`
is Knative's `autoscaling.knative.dev/target` annotation (the KPA then aims at 70 % of it, its
target utilization) and Ray Serve's `target_ongoing_requests`; every other knob is upstream's
default. Pure: nothing here reads a clock. docs/design/policy.md says how they run live.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.baselines import kpa, ray_serve
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import DEFAULT_CONFIG, PolicyConfig, PolicyState, ScaleDecision, decide, keep_alive_s, reserve
from functions.spec import ScalingSpec


@dataclass(frozen=True)
class Shoal:
    """Shoal's policy, the loop's default."""

    config: PolicyConfig = DEFAULT_CONFIG
    name: str = "shoal"

    def initial(self, spec: ScalingSpec, ready: int, now: float) -> PolicyState:
        return PolicyState()

    def decide(self, snapshot: MetricsSnapshot, spec: ScalingSpec, state: PolicyState,
               now: float) -> tuple[ScaleDecision, PolicyState]:
        return decide(snapshot, spec, state, now, self.config)

    def keep_alive_s(self, state: PolicyState, spec: ScalingSpec) -> float:
        """How long an idle replica is kept now (policy.keep_alive_s): what lending prices it by."""
        return keep_alive_s(state, spec, self.config)

    def explain(self, state: PolicyState, now: float) -> dict[str, float]:
        """What the count was held by at the look at `now`: the need it measured (replicas, the
        error budget's spares included) and the reserve for a rise within a cold start
        (policy.reserve), which `shoal status` shows beside the decision."""
        need = state.needs[-1].replicas if state.needs else 0.0
        return {"need": round(need, 3), "reserve": round(reserve(state, now, self.config), 3)}


@functools.lru_cache(maxsize=None)  # one per target: a config is built once, not on every look
def _kpa_config(target: float) -> kpa.KpaConfig:
    return replace(kpa.KpaConfig(), container_concurrency_target=target)


@functools.lru_cache(maxsize=None)
def _ray_config(target: float) -> ray_serve.RayConfig:
    return replace(ray_serve.RayConfig(), target_ongoing_requests=target)


@dataclass(frozen=True)
class Kpa:
    """Knative's KPA (autoscaler/baselines/kpa.py): the function's target as its annotation
    target, KpaConfig's defaults for the rest (70 % utilization, 60 s stable window, 30 s to zero)."""

    name: str = "kpa"

    def config(self, spec: ScalingSpec) -> kpa.KpaConfig:
        """E.g. target_concurrency 4: container_concurrency_target 4, so 4 x 0.7 = 2.8 per pod."""
        return _kpa_config(spec.target_concurrency)

    def initial(self, spec: ScalingSpec, ready: int, now: float) -> Any:
        return kpa.initial_state(self.config(spec), ready, now)

    def decide(self, snapshot: MetricsSnapshot, spec: ScalingSpec, state: Any,
               now: float) -> tuple[ScaleDecision, Any]:
        return kpa.decide(snapshot, spec, state, now, self.config(spec))

    def keep_alive_s(self, state: Any, spec: ScalingSpec) -> float:
        """The stable window's drain then the grace period: KPA reaches zero 60 + 30 s after the last request."""
        config = self.config(spec)
        return config.stable_window_s + config.scale_to_zero_grace_s

    def explain(self, state: Any, now: float) -> dict[str, float]:
        """Nothing beyond the decision's own reason: the KPA's windows are in its state."""
        return {}


@dataclass(frozen=True)
class RayServe:
    """Ray Serve's default policy (autoscaler/baselines/ray_serve.py): the function's target as
    `target_ongoing_requests`, RayConfig's defaults for the rest (30 s up, 600 s down)."""

    name: str = "ray"

    def config(self, spec: ScalingSpec) -> ray_serve.RayConfig:
        return _ray_config(spec.target_concurrency)

    def initial(self, spec: ScalingSpec, ready: int, now: float) -> ray_serve.RayState:
        return ray_serve.RayState()

    def decide(self, snapshot: MetricsSnapshot, spec: ScalingSpec, state: ray_serve.RayState,
               now: float) -> tuple[ScaleDecision, ray_serve.RayState]:
        return ray_serve.decide(snapshot, spec, state, now, self.config(spec))

    def keep_alive_s(self, state: ray_serve.RayState, spec: ScalingSpec) -> float:
        """The 1 -> 0 delay (downscale_to_zero_delay_s, else downscale_delay_s: 600 s by default)."""
        config = self.config(spec)
        return config.downscale_delay_s if config.downscale_to_zero_delay_s is None else config.downscale_to_zero_delay_s

    def explain(self, state: ray_serve.RayState, now: float) -> dict[str, float]:
        """Nothing beyond the decision's own reason."""
        return {}


POLICIES = {"shoal": Shoal, "kpa": Kpa, "ray": RayServe}


def policy_named(name: str, slice_window_s: float | None = None) -> Shoal | Kpa | RayServe:
    """The policy `shoal up --policy NAME` runs; ValueError naming the choices for any other.
    `slice_window_s` (`--slice-window-s`): how long Shoal's policy averages a replica's duty
    before it asks another slice, and spaces its slice changes by (PolicyConfig, default 300 s);
    a baseline asks no slice, so it is refused there, as is a window of 0 or less."""
    if name not in POLICIES:
        raise ValueError(f"policy {name!r} is not one of {', '.join(POLICIES)}")
    if slice_window_s is None:
        return POLICIES[name]()
    if name != "shoal":
        raise ValueError(f"--slice-window-s applies to the shoal policy, not {name!r}: a baseline asks no slice")
    return Shoal(replace(DEFAULT_CONFIG, slice_window_s=slice_window_s))
