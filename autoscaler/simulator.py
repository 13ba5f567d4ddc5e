"""A discrete-event cluster simulator that runs the real policy and placement code on every
request of a trace, in decision ticks (1 s by default, the controller's): requests for a function
with no replica ready are held (the policy asked at once for one at zero), as the gateway holds and pokes; each tick's requests are
served exactly per request for a deterministic service time (one segmented cummax over all
servers, in numpy); every function is looked at at its deploy (t=0), then each tick while it has
replicas or held requests: a `MetricsSnapshot` with only what the controller would know (batch
latencies learned from the batches run, the cold start once measured, p95 and the share over the SLO
interpolated in the gateway's latency histogram, in flight inside replicas only) and a look of its policy (a
tick's looks in one call, `autoscaler.looks`); replicas are placed and removed by the placement
package. `replica_slice_seconds` is the sum over replicas of (share of a GPU) x (seconds held,
starting included). Every GPU here is simulated: no figure from this module is a GPU measurement. The tick, the queue arithmetic and the approximations, worked out:
docs/design/simulator.md.
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
import math
import time as _time
import warnings
from collections import deque
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Callable, Protocol, Sequence

import numpy as np

from autoscaler import looks, native, policy
from autoscaler.baselines import kpa, ray_serve, tuned
from autoscaler.lending import (
    FLOOR, IDLE, RANKS, Ask, Hold, Idle, decay_rate, held_need, idle_rank, need_of, replica_rank, share, takeback_cost,
    to_move, trim_to_window,
)
from autoscaler.loop import Memory, policy_table
from autoscaler.metrics import LATENCY_BUCKETS_S, fractions_over, quantiles
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.placement import Demand, Device, Placement, SliceCluster, Status, Unplaceable
from autoscaler.policy import DEFAULT_CONFIG, PolicyConfig, PolicyState, ScaleDecision
from autoscaler.replicas import ControllerConfig
from autoscaler.traces import Trace
from functions.spec import ScalingSpec

# the live controller's defaults: a function's request rate (for the cost of taking its idle slice)
# is over this window; a first replica time-shares a device busy at most this much
RATE_WINDOW_S = ControllerConfig().rate_window_s
TIME_SHARE_BUSY = ControllerConfig().time_share_busy
MOVE_TO_SLICE = ControllerConfig().move_to_slice
BATCH_FILL = 0.8  # a batching replica takes what is queued: see batch_size
BATCHERS = ("rule", "exact")  # SimConfig.batcher
ROUTINGS = ("queue", "fewest")  # SimConfig.routing
# no request answered or running yet (Simulation._answering): answered at, function, latency, occupancy,
# rows, read (a timed-out one is read at its timeout, before its replica is done with it), sent (when it
# left the gateway for a replica, or for the activator's hop: in flight from then)
NOTHING_ANSWERING = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, bool),
                     np.zeros(0))
BIG = 1e5  # segment offset for the segmented cummax; > the spread of values inside one tick
LAT_EDGES = np.logspace(-4, 3, 7 * 50 + 1)  # 100 us .. 1000 s, 50 bins a decade (4.7 % wide)
GATEWAY_BOUNDS = np.array(LATENCY_BUCKETS_S + (math.inf,))  # the histogram the controller reads p95 from


# ---------------------------------------------------------------------- functions


@dataclass(frozen=True, slots=True)
class Profile:
    """A kind of model: latency per batch size on `ref_slice` of a GPU, its SLO, its cold start."""

    name: str
    latency_ms: tuple[tuple[int, float], ...]  # (batch size, ms) on ref_slice, batch 1 first
    slice_fraction: float = 0.25
    ref_slice: float = 0.25
    cold_start_s: float = 3.0
    slo_ms: float = 100.0
    target_concurrency: float = 2.0
    memory_mib: int | None = None  # a replica's GPU memory (None: its slice's share of the device's)
    # cold_start_s already holds the probe's batches (one measured live): probe_s is not added
    probe_in_cold_start: bool = False

    def __post_init__(self) -> None:
        if not self.latency_ms or self.latency_ms[0][0] != 1:
            raise ValueError(f"profile {self.name}: latency_ms must start at batch size 1, got {self.latency_ms}")
        if not 0 < self.slice_fraction <= 1:
            raise ValueError(f"profile {self.name}: slice_fraction ({self.slice_fraction}) must be within (0, 1]")
        if self.memory_mib is not None and self.memory_mib < 1:
            raise ValueError(f"profile {self.name}: memory_mib ({self.memory_mib}) must be >= 1 MiB")

    @property
    def max_batch(self) -> int:
        return self.latency_ms[-1][0]

    def probe(self, slice_fraction: float) -> tuple[tuple[float, float], ...]:
        """The batches a replica on `slice_fraction` times at its load (serving's
        DataPlane._probe): one of 1 row and one of the largest, as ((rows, seconds), ...) at
        the slice's speed; none for a model that does not batch. E.g. ((1, 40), (8, 120)) ms on
        its own slice: ((1, .04), (8, .12))."""
        if self.max_batch <= 1:
            return ()
        speed = self.ref_slice / slice_fraction
        return tuple((float(b), ms * speed / 1000.0) for b, ms in (self.latency_ms[0], self.latency_ms[-1]))

    @property
    def probe_s(self) -> float:
        """What the probe adds to a cold start on the profile's slice (none where cold_start_s
        holds it). E.g. ((1, 40), (8, 120)) ms: 0.16 s."""
        return 0.0 if self.probe_in_cold_start else sum(s for _, s in self.probe(self.slice_fraction))

    def spec(self) -> ScalingSpec:
        return ScalingSpec(min_replicas=0, max_replicas=1000, slo_p95_ms=self.slo_ms,
                           target_concurrency=self.target_concurrency)


# Latency figures in the style of functions/examples/emulated_resnet.yaml: simulated, not measured on a GPU.
PROFILES = (
    Profile("resnet50", ((1, 4.0), (8, 6.0), (32, 14.0)), 0.25, 0.25, cold_start_s=4.0, slo_ms=100.0, target_concurrency=4.0),
    Profile("bert-base", ((1, 8.0), (8, 20.0)), 0.25, 0.25, cold_start_s=6.0, slo_ms=200.0, target_concurrency=4.0),
    Profile("mlp-small", ((1, 1.0),), 0.125, 0.125, cold_start_s=2.0, slo_ms=50.0, target_concurrency=2.0),
    Profile("whisper-tiny", ((1, 30.0), (4, 45.0)), 0.5, 0.5, cold_start_s=8.0, slo_ms=500.0, target_concurrency=2.0),
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    gpus: int = 8
    gpu_memory_mib: int = 81920
    gpus_per_node: int = 8
    tick_s: float = 1.0
    timeout_s: float = 60.0
    warmup_s: float = 0.0  # requests and costs before this are simulated but not counted
    # a function's first replica that no slice can take time-shares a device busy at most this
    # much (ControllerConfig.time_share_busy, for a policy that lends; 0: never)
    time_share_busy: float = TIME_SHARE_BUSY
    # a ready replica on a larger slice than its policy asks is moved to it (ControllerConfig's)
    move_to_slice: bool = MOVE_TO_SLICE
    # how a batching replica forms its batches: "rule", batch_size's occupancy rule (the tick's
    # batch, the size that keeps the replica at most BATCH_FILL busy, grown for requests queued
    # behind others: an idealized batcher); "exact", shoal up's own batcher with no queue delay
    # (serving/batch_loop.py: when a replica frees it runs what is queued, up to its largest batch),
    # behind a gateway that sends requests held for a cold start on one by one
    # (released_one_by_one): shoal up's does, as do Knative's activator and Ray Serve's router,
    # each forwarding a held request by itself once a replica can take it
    batcher: str = "rule"
    # how the exact batcher's requests reach a function's replicas: "queue", one queue per
    # function served by whichever replica frees first (serve_batched); "fewest", as shoal up's
    # gateway routes them, each at its arrival to the ready replica with the fewest outstanding,
    # where it waits for that replica's next batch (serve_routed; the default, as the exact
    # batcher is shoal up's: docs/simlive.md, "Built: the gateway's routing in the simulator")
    routing: str = "fewest"
    # how long after the request that pokes it the look at a function at zero comes, reading every
    # request of it held by then: 0, at the request's instant (the bench); shoal up's, as a live
    # run timed it (simlive.live_poke_lag_s: a few ms, so a clump of requests within it is seen by
    # that look; docs/simlive.md, "The poke's lag, timed per run")
    poke_lag_s: float = 0.0

    def __post_init__(self) -> None:
        if self.batcher not in BATCHERS:
            raise ValueError(f"batcher {self.batcher!r} must be one of {', '.join(BATCHERS)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing {self.routing!r} must be one of {', '.join(ROUTINGS)}")
        if not 0 <= self.time_share_busy <= 1:
            raise ValueError(f"time_share_busy ({self.time_share_busy}) must be within [0, 1]")
        if self.gpu_memory_mib < 1:
            raise ValueError(f"gpu_memory_mib ({self.gpu_memory_mib}) must be >= 1")
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise ValueError(f"gpus ({self.gpus}) and gpus_per_node ({self.gpus_per_node}) must be >= 1")
        if not 0 < self.tick_s <= 60:
            raise ValueError(f"tick_s ({self.tick_s}) must be within (0, 60]")
        if not 0 <= self.poke_lag_s < self.tick_s:
            raise ValueError(f"poke_lag_s ({self.poke_lag_s}) must be >= 0 and under tick_s ({self.tick_s})")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s ({self.timeout_s}) must be > 0")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s ({self.warmup_s}) must be >= 0")

    def devices(self) -> list[Device]:
        return [Device(f"sim:{i}", "gpu", self.gpu_memory_mib, node=f"node{i // self.gpus_per_node}",
                       name="simulated GPU") for i in range(self.gpus)]


# ---------------------------------------------------------------------- policies


class SimPolicy(Protocol):
    name: str
    reactive: bool  # decides from metrics; False: a schedule known in advance
    lends: bool  # runs on Shoal's controller: idle slices lent, a full cluster shared (Simulation._share_out)
    default_cold_start_s: float  # the cold start its decide() assumes until one is measured
    snapshot_type: type  # the class of the snapshots its decide() takes
    spec_type: type  # and of the specs

    def cold_start_s(self, profile: Profile) -> float: ...
    def decide(self, fid: int, snapshot: MetricsSnapshot, spec: ScalingSpec, now: float) -> ScaleDecision: ...
    def look_each(self, tick: looks.Tick, functions: looks.Functions) -> tuple[list[looks.Looked], list[float] | None]: ...
    def wake_at(self, fid: int, lead_s: float) -> float | None: ...
    def quiet_until(self, fid: int, current: int, now: float, lead_s: float) -> float: ...
    def scheduled(self, tick: int) -> list[tuple[int, int]]: ...


class _Reactive:
    reactive = True
    snapshot_type: type = MetricsSnapshot  # the class of the snapshots decide() takes
    spec_type: type = ScalingSpec  # and of the specs
    lends = False  # the peers' autoscalers as published: a replica that does not fit is not placed
    # what decide() reads for a snapshot without a measured cold start (Shoal's lead_s; the
    # baselines read none)
    default_cold_start_s = DEFAULT_CONFIG.default_cold_start_s

    def __init__(self, name: str, step: Callable, initial: Callable[[], object]):
        self.name, self._step, self._initial = name, step, initial
        self.states: dict[int, object] = {}

    def cold_start_s(self, profile: Profile) -> float:
        return profile.cold_start_s

    def decide(self, fid: int, snapshot: MetricsSnapshot, spec: ScalingSpec, now: float) -> ScaleDecision:
        state = self.states.get(fid)
        decision, self.states[fid] = self._step(snapshot, spec, self._initial() if state is None else state, now)
        return decision

    def look_each(self, tick: looks.Tick, functions: looks.Functions) -> tuple[list[looks.Looked], list[float] | None]:
        """decide() for each function of the tick in turn, every look to act on (no quiet times)."""
        acted = []
        for i, fid in enumerate(tick.fids):
            snapshot = looks.snapshot_of(tick, i, functions)
            acted.append(looks.Looked(fid, snapshot, self.decide(fid, snapshot, functions.specs[fid], tick.now)))
        return acted, None

    def wake_at(self, fid: int, lead_s: float) -> float | None:
        return None

    def quiet_until(self, fid: int, current: int, now: float, lead_s: float) -> float:
        return now  # no promise: looked at every tick

    def keep_alive_s(self, fid: int, spec: ScalingSpec) -> float:
        """How long the policy keeps an idle replica (what a lent slice is priced by): the spec's."""
        return spec.idle_to_zero_s

    def scheduled(self, tick: int) -> list[tuple[int, int]]:
        return []


class ShoalPolicy(_Reactive):
    """Shoal's decide() per function, a tick's looks in one call (autoscaler.looks). `compiled`
    (the default): policy.py and looks.py compiled by mypyc in one group with the records a look
    builds and reads, ScalingSpec among them (native.POLICY_GROUP), the same sources, several
    times faster (its decide() takes the group's own classes: snapshot_type, spec_type); where they cannot be
    built the interpreted modules run instead, with a warning, and `engine` says which runs. False: policy.py and looks.py as the
    interpreter runs them, the reference a compiled run is checked against. `name`: the
    policy's line in a comparison (shoal-fixed: slice hints off)."""

    lends = True

    def __init__(self, config: PolicyConfig = DEFAULT_CONFIG, compiled: bool = True, name: str = "shoal"):
        super().__init__(name, self._step, PolicyState)
        self.config = config
        self.default_cold_start_s = config.default_cold_start_s
        self.module, self.looks, self.engine = policy, looks, "interpreted"
        if compiled:
            try:
                (_, specs, snapshots, self.module, self.looks), self.engine = \
                    native.load_group(native.POLICY_GROUP), "compiled (mypyc)"
                self.snapshot_type = snapshots.MetricsSnapshot  # what the compiled decide() takes
                self.spec_type = specs.ScalingSpec
            except native.CompileError as error:
                warnings.warn(f"policy.py and looks.py run interpreted, several times slower: {error}", RuntimeWarning,
                              stacklevel=2)
                self.engine = f"interpreted (not compiled: {str(error).splitlines()[0]})"
        # the module's own PolicyConfig: a compiled decide() takes no other class
        self._config = _as_class(self.module.PolicyConfig, config)
        self.specs: dict[int, ScalingSpec] = {}

    def state_of(self, fid: int) -> PolicyState | None:
        return self.states.get(fid)

    def _step(self, snapshot, spec, state, now):
        return self.module.decide(snapshot, spec, state, now, self._config)

    def decide(self, fid: int, snapshot: MetricsSnapshot, spec: ScalingSpec, now: float) -> ScaleDecision:
        self.specs[fid] = spec
        state = self.states.get(fid)
        decision, self.states[fid] = self.module.decide(snapshot, spec, self.module.PolicyState() if state is None
                                                        else state, now, self._config)
        return decision

    def look_each(self, tick: looks.Tick, functions: looks.Functions) -> tuple[list[looks.Looked], list[float] | None]:
        acted, quiet = self.looks.look_each(tick, functions, self.states, self._config)
        for look in acted:  # for quiet_until, asked once the caller has acted
            self.specs[look.fid] = functions.specs[look.fid]
        return acted, quiet

    def wake_at(self, fid: int, lead_s: float) -> float | None:
        """Periodic traffic expected: be asked again when its pre-warm is due."""
        state = self.states.get(fid)
        onset = self.module.next_onset(state, self._config) if state is not None else None
        return None if onset is None else onset - lead_s - self.config.prewarm_margin_s

    def quiet_until(self, fid: int, current: int, now: float, lead_s: float) -> float:
        state = self.states.get(fid)
        return now if state is None else self.module.quiet_until(state, self.specs[fid], current, now, lead_s,
                                                                 self._config)

    def keep_alive_s(self, fid: int, spec: ScalingSpec) -> float:
        """The policy's own keep-alive (policy.keep_alive_s), as the live loop hands the scaler."""
        state = self.states.get(fid)
        return spec.idle_to_zero_s if state is None else self.module.keep_alive_s(state, spec, self._config)


# The activator's hop: KServe measured 2-3 ms for queue-proxy and activator together
# (kserve/kserve test/benchmark/README.md, sklearn iris, 4.1-6.2 ms against 1.4-2.7 ms without
# both); the activator's own share is not measured apart: taken as 1 ms, an assumption.
ACTIVATOR_HOP_S = 0.001


class _Baseline(_Reactive):
    """A peer's autoscaler (kpa*, ray*): its pure `decide(snapshot, spec, state, now, config)` with
    a config per function, made once from `config_of(fid, spec)`."""

    def __init__(self, name: str, decide: Callable, initial: Callable[[], object],
                 config_of: Callable[[int, ScalingSpec], object]):
        super().__init__(name, decide, initial)
        self._config_of = config_of
        self.configs: dict[int, object] = {}

    def config(self, fid: int, spec: ScalingSpec) -> object:
        config = self.configs.get(fid)
        if config is None:
            config = self.configs[fid] = self._config_of(fid, spec)
        return config

    def decide(self, fid: int, snapshot: MetricsSnapshot, spec: ScalingSpec, now: float) -> ScaleDecision:
        state = self.states.get(fid)
        decision, self.states[fid] = self._step(snapshot, spec, self._initial() if state is None else state, now,
                                                self.config(fid, spec))
        return decision


class KpaPolicy(_Baseline):
    """The KPA; its request path: through the activator (ACTIVATOR_HOP_S more) while the function's
    KPA keeps it in the path (kpa.place_activator; from the start, as a new revision's SKS)."""

    def hops(self, n: int) -> np.ndarray:
        """Seconds each function's requests spend in the activator's hop now."""
        hop = np.full(n, ACTIVATOR_HOP_S)
        for fid, state in self.states.items():
            if not state.activator_in_path:
                hop[fid] = 0.0
        return hop


class RayPolicy(_Baseline):
    """Ray Serve's policy; its request path: the router (the handle) sends a replica at most
    `max_ongoing_requests`, the rest wait at the router (Simulation._cap_batches_at_max_ongoing)."""

    def max_ongoing(self, fid: int, spec: ScalingSpec) -> int:
        return self.config(fid, spec).max_ongoing_requests


def _profiled_ms(profile: Profile) -> tuple[tuple[int, float], ...]:
    """The batch latencies a user profiled on the slice the function gets."""
    speed = profile.ref_slice / profile.slice_fraction
    return tuple((b, ms * speed) for b, ms in profile.latency_ms)


def kpa_policy(spec_target: bool = True) -> KpaPolicy:
    """Knative's KPA as published: the function's concurrency target is its
    `autoscaling.knative.dev/target` annotation (as a KServe user sets it for a GPU model), so
    the per-pod target is 0.7 x it (4 -> 2.8); without spec_target KPA's default 100 -> 70.
    Target burst capacity 200: the activator stays in the path until ready x target - 200 -
    panic concurrency >= 0 (with a target of 4, past 50 pods)."""
    def config_of(fid: int, spec: ScalingSpec) -> kpa.KpaConfig:
        return kpa.KpaConfig(container_concurrency_target=spec.target_concurrency) if spec_target else kpa.KpaConfig()

    return KpaPolicy("kpa", kpa.decide, kpa.initial_state, config_of)


def kpa_tuned_policy(profiles: list[Profile], headroom: float = tuned.KPA_HEADROOM) -> KpaPolicy:
    """The KPA with each function's target annotation from the one rule (baselines.tuned)."""
    return KpaPolicy("kpa-tuned", kpa.decide, kpa.initial_state,
                     lambda fid, spec: tuned.kpa_config(_profiled_ms(profiles[fid]), profiles[fid].slo_ms, headroom))


def ray_policy() -> RayPolicy:
    """Ray Serve's default policy as published: target 2 ongoing requests per replica, at most
    5 in a replica (the rest at the router), metrics pushed every 10 s, 30 s up, 600 s down."""
    return RayPolicy("ray", ray_serve.decide, ray_serve.RayState, lambda fid, spec: ray_serve.RayConfig())


def ray_tuned_policy(profiles: list[Profile], headroom: float = tuned.RAY_HEADROOM,
                     downscale_cold_starts: float = tuned.RAY_DOWNSCALE_COLD_STARTS) -> RayPolicy:
    """Ray Serve with each function's targets and delays from the one rule (baselines.tuned)."""
    def config_of(fid: int, spec: ScalingSpec) -> ray_serve.RayConfig:
        p = profiles[fid]
        return tuned.ray_config(_profiled_ms(p), p.slo_ms, p.cold_start_s, headroom, downscale_cold_starts)

    return RayPolicy("ray-tuned", ray_serve.decide, ray_serve.RayState, config_of)


class Scheduled:
    """A baseline whose replica counts per tick are known before the run."""

    reactive = False
    lends = False
    default_cold_start_s = 0.0
    snapshot_type: type = MetricsSnapshot  # (no decide() runs)
    spec_type: type = ScalingSpec

    def __init__(self, name: str, changes: dict[int, list[tuple[int, int]]]):
        self.name, self.changes = name, changes

    def cold_start_s(self, profile: Profile) -> float:
        return 0.0

    def decide(self, fid, snapshot, spec, now) -> ScaleDecision:  # pragma: no cover - never reactive
        raise NotImplementedError

    def wake_at(self, fid: int, lead_s: float) -> float | None:
        return None

    def quiet_until(self, fid: int, current: int, now: float, lead_s: float) -> float:
        return now

    def scheduled(self, tick: int) -> list[tuple[int, int]]:
        return self.changes.get(tick, [])


# ---------------------------------------------------------------------- the engine


@dataclass
class _Servers:
    """Every replica of every function, in numpy arrays indexed by slot."""

    capacity: int = 1024
    fid: np.ndarray = field(init=False)
    free: np.ndarray = field(init=False)  # when the server can take its next request
    ready_at: np.ndarray = field(init=False)
    speed: np.ndarray = field(init=False)  # service-time multiplier: ref_slice / slice
    slice: np.ndarray = field(init=False)
    alive: np.ndarray = field(init=False)
    device: np.ndarray = field(init=False)  # the index of its device in SimConfig.devices()

    def __post_init__(self) -> None:
        self.fid = np.zeros(self.capacity, np.int64)
        self.free = np.zeros(self.capacity)
        self.ready_at = np.zeros(self.capacity)
        self.speed = np.ones(self.capacity)
        self.slice = np.zeros(self.capacity)
        self.alive = np.zeros(self.capacity, bool)
        self.device = np.zeros(self.capacity, np.int64)
        self.unused = list(range(self.capacity - 1, -1, -1))

    def add(self, fid: int, ready_at: float, speed: float, slice_fraction: float, device: int) -> int:
        if not self.unused:
            self._grow()
        slot = self.unused.pop()
        self.fid[slot], self.free[slot], self.ready_at[slot] = fid, ready_at, ready_at
        self.speed[slot], self.slice[slot], self.alive[slot] = speed, slice_fraction, True
        self.device[slot] = device
        return slot

    def remove(self, slot: int) -> None:
        self.alive[slot] = False
        self.unused.append(slot)

    def _grow(self) -> None:
        old = self.capacity
        self.capacity *= 2
        for name in ("fid", "free", "ready_at", "speed", "slice", "alive", "device"):
            array = getattr(self, name)
            grown = np.zeros(self.capacity, array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self.speed[old:] = 1.0
        self.unused.extend(range(self.capacity - 1, old - 1, -1))


class Simulation:
    def __init__(self, trace: Trace, profiles: list[Profile], policy: SimPolicy, config: SimConfig = SimConfig(),
                 initial: dict[int, int] | None = None, deployed_at: float = 0.0):
        """`deployed_at`: when the functions at zero were deployed, on the trace's clock (t = 0 by
        default; before the trace's start too): their first look is then, as a deploy pokes the
        live loop (_deploy_looks); none of their requests may come before it."""
        if len(profiles) != len(trace.functions):
            raise ValueError(f"{len(profiles)} profiles for {len(trace.functions)} functions")
        if not math.isfinite(deployed_at):
            raise ValueError(f"deployed_at ({deployed_at}) must be a finite time")
        if trace.times.size and trace.times[0] < deployed_at:
            raise ValueError(f"a request at {trace.times[0]:g} s comes before its function's deploy ({deployed_at:g} s)")
        self.trace, self.profiles, self.policy, self.config = trace, profiles, policy, config
        self.deployed_at = deployed_at
        # functions a look was acted on for (every look at one at zero is), and those warm-started:
        # running before the trace, deployed before it (_deploy_looks)
        self._settled_once: set[int] = {fid for fid, n in (initial or {}).items() if n}
        n = len(profiles)
        self.specs = [_as_class(policy.spec_type, p.spec()) for p in profiles]  # of the class decide() takes
        # how long a start takes: the policy's model load, then the probe's batches (a policy that
        # starts none, cold start 0, has none)
        load = [policy.cold_start_s(p) for p in profiles]
        self.cold = np.array([c + p.probe_s if c > 0 else 0.0 for p, c in zip(profiles, load)])
        # the cold start the policy reads, per function: as shoal up measures it (create to ready
        # of the newest replica, kept once measured); until then the policy's own default, which
        # decide() also reads for the None the live loop passes (policy.lead_s)
        self._cold = [float(policy.default_cold_start_s)] * n
        self._measured = np.zeros(n, bool)
        self.slo_s = np.array([p.slo_ms / 1000.0 for p in profiles])
        self.max_batch = np.array([p.max_batch for p in profiles])
        if isinstance(policy, RayPolicy):  # the baselines' request paths: _cap_batches_at_max_ongoing, _hops
            self._cap_batches_at_max_ongoing(policy)
        self._slice_of = [float(p.slice_fraction) for p in profiles]  # per function, the slice new replicas get
        self._names = trace.functions
        groups: dict[tuple, list[int]] = {}  # functions sharing a latency profile share one table
        for i, p in enumerate(profiles):
            groups.setdefault(p.latency_ms, []).append(i)
        self._lat_tables = [(np.array(ix), np.array([b for b, _ in key], float), np.array([m for _, m in key]) / 1000.0)
                            for key, ix in groups.items()]
        self._lat_group = np.empty(n, np.int64)  # each function's index in _lat_tables
        for g, (ix, _, _) in enumerate(self._lat_tables):
            self._lat_group[ix] = g
        self.cluster = SliceCluster(config.devices())
        self._device_index = {d.id: i for i, d in enumerate(self.cluster.devices)}
        self.servers = _Servers()
        self.slots: list[list[int]] = [[] for _ in range(n)]
        self.replica_slot: dict[str, int] = {}
        self.slot_replica: dict[int, str] = {}
        self.n_srv = np.zeros(n, np.int64)
        self.held: dict[int, list[float]] = {}
        # per function, requests at its replicas whose batch did not start by the end of their tick
        # (the exact batcher): (arrival as the replicas see it, the hop in it, sent), run next tick
        self._queued: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._queued_at: dict[int, np.ndarray] = {}  # routing "fewest": the slot each queued request waits at
        self._batch_rows: dict[int, int] = {}  # routing "fewest": each slot's last batch's rows
        # per function, its last replica, removed with requests queued: (free at, speed, slice); it
        # finishes them (_serve_batches), as a removed replica finishes what it has
        self._draining: dict[int, tuple[float, float, float]] = {}
        # per function, a replica moving to the slice its policy asks (_move): (the new replica,
        # the old one, when the new is ready, its slice, its device's index); charged from its start
        self._moves: dict[int, tuple[str, str, float, float, int]] = {}
        self._move_asks: dict[int, bool] = {}  # per function: whether its last look that acted let it move
        self.wakes: list[tuple[float, int]] = []
        self.quiet = np.zeros(n)  # an idle function need not be looked at before this
        # batch latencies as the controller learns them (loop.Memory): none until its replicas ran
        # batches, carried at the new slice's speed when its slice changes (loop.on_slice)
        self.memory = Memory()
        self._tables: list[tuple[tuple[float, float], ...]] = [()] * n
        self._batching = self.max_batch > 1  # a model that never batches learns only size 1: no table
        # per function, a window whose learning changed nothing (NaN: none): the same window again
        # changes nothing either, so it is not learned again (most of a large population's are)
        self._settled = np.full((n, 2), np.nan)
        # a start from zero is a cold start once a request waits for it (arrives before its
        # first replica is ready), as the gateway counts one: per function, until when
        self._wait_until = np.full(n, -np.inf)
        # what a tick's looks read of every function: these very lists and dict, as they change
        self._functions = looks.Functions(self._names, self.specs, self._cold, self._slice_of,
                                          [p.slice_fraction for p in self.profiles], self._tables, self.held)
        self._occupancy = self._latency_s(np.ones(n))  # per function, the last tick's; batch 1 to begin
        self._batch = np.ones(n)  # per function, the tick's batch size (batch_size's rule)
        self.batch_backlog = True  # requests queued behind others ride in larger batches (see _serve_interleaved)
        self._ids = 0
        # per tick, per function
        self.tick_n = np.zeros(n)
        self.tick_busy = np.zeros(n)
        # what the look at the tick's end reads (_observe): requests answered by then, busy time run
        self.seen_n = np.zeros(n)
        self.seen_busy = np.zeros(n)
        self.seen_p95 = np.full(n, np.nan)
        self.seen_over = np.zeros(n)  # requests over their SLO
        self.seen_inflight = np.zeros(n)  # request-seconds in flight in the tick (the gateway's integral's growth)
        self._answering = list(NOTHING_ANSWERING)  # (answered at, function, latency, occupancy, rows, read, sent)
        self.tick_refused = np.zeros(n)  # held requests that timed out (the gateway's 504: a miss it counts)
        self.tick_scraped = np.ones(n, bool)  # its replicas' scrapes saw the tick's work (see _first_ready)
        # totals
        self.hist = np.zeros(len(LAT_EDGES) + 1, np.int64)
        self.requests = self.served = self.within_slo = self.timed_out = 0
        self.cold_requests = self.starts = self.cold_starts = self.unplaceable = 0
        self.slice_seconds = self.gpu_seconds = self.replica_seconds = 0.0
        self.reasons: dict[str, int] = {}
        # a full cluster shared (Shoal's controller, policy.lends): the replicas the tick's decisions
        # could not place, per function, granted by autoscaler.lending.share at the tick's end (at
        # once for a look between ticks); what each function's request rate and last activity were
        self._lends = bool(getattr(policy, "lends", False))
        self._short: dict[int, int] = {}
        # each tick's need (_traffic_and_need) over the policy's delay window: what placed replicas
        # are ranked by (lending.held_need)
        self._needs: deque[tuple[float, np.ndarray]] = deque()
        self._need_window_s = float(getattr(getattr(policy, "config", None), "scale_down_delay_s",
                                            DEFAULT_CONFIG.scale_down_delay_s))
        self._in_tick = False
        self._asking = (-1, 0, 0.0)  # a look between ticks: its function, the requests held for it, when
        self._arriving: tuple[np.ndarray, np.ndarray] | None = None  # the tick's arrivals while _hold_cold looks
        self._fid_of = {name: i for i, name in enumerate(self._names)}
        self._rate_count, self._rate_seconds = np.zeros(n), np.zeros(n)
        self._active_at = np.full(n, -np.inf)
        self.takebacks: dict[str, int] = {}  # replicas taken for another's, by what they served (lending.RANKS)
        self.time_shared = 0  # first replicas placed beyond a device's compute (_time_share)
        self.time_shared_all = 0  # the same, the warm-up included
        self._shared_on: np.ndarray | None = None  # per device, its replicas' stretch while one is time-shared
        self.held_short: dict[str, int] = {}  # per function, replicas wanted that the full cluster could not hold
        self.held_short_by_rank: dict[str, int] = {}
        # "warm": started before the trace as if running (not counted as starts); "cold": all at zero
        self.start = "scheduled" if not policy.reactive else "cold" if initial is None else "warm"
        for fid, count in (initial or {}).items():
            self._start(fid, count, -float(self.cold[fid]))
        self.starts = 0

    # ------------------------------------------------------------------ run

    def run(self) -> dict:
        # a run makes millions of short-lived tuples (snapshots, states) and no reference cycles:
        # the cycle collector's passes over the live states took about a tenth of the scale run
        # and freed nothing, so they wait for its end (reference counting frees all as before)
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if paused:
                gc.enable()

    def _run(self) -> dict:
        started = _time.perf_counter()
        dt = self.config.tick_s
        ticks = math.ceil(self.trace.duration_s / dt - 1e-9)
        times, fids = self.trace.times, self.trace.fids.astype(np.int64, copy=False)
        if times.size and times[-1] >= ticks * dt:
            # a last arrival on a tick's bound (a csv trace ends just past its last timestamp, so
            # one at 79.0 s ends it at 79.0 + 1 ulp): one tick more, or no tick would take it
            ticks += 1
        bounds = np.searchsorted(times, np.arange(1, ticks + 1) * dt)
        if self.config.warmup_s and abs(self.config.warmup_s / dt - round(self.config.warmup_s / dt)) > 1e-9:
            raise ValueError(f"warmup_s ({self.config.warmup_s}) must be a whole number of ticks ({dt} s)")
        warm_ticks = round(self.config.warmup_s / dt)
        start = 0
        deploy_pending = self.policy.reactive  # the deploy looks: at the deploy, before its tick's arrivals
        for k in range(ticks):
            t0, t1 = k * dt, (k + 1) * dt
            if k == warm_ticks and k > 0:
                self._reset_counts()
            if deploy_pending and self.deployed_at < t1:
                self._deploy_looks(self.deployed_at)
                deploy_pending = False
            for fid, desired in self.policy.scheduled(k):
                self._apply(fid, ScaleDecision(desired, "SCHEDULED"), t0)
            a, f = times[start:bounds[k]], fids[start:bounds[k]]
            start = bounds[k]
            self.requests += len(a)
            self._wake(t1)
            if self._moves:
                self._finish_moves(t0)
            a, f = self._hold_cold(a, f, t0)
            self._count_cold_starts(a, f)
            self._serve(a, f, t0, t1, t1 if k < ticks - 1 else math.inf)  # the last tick runs all it has
            self._expire_held(t1)
            if self.policy.reactive:
                self._decide_all(t1)
            self.slice_seconds += float(self.servers.slice[self.servers.alive].sum()) * dt
            self.replica_seconds += float(self.n_srv.sum()) * dt
            if self._moves:  # the replicas starting on a new slice hold it already
                self.slice_seconds += sum(m[3] for m in self._moves.values()) * dt
                self.replica_seconds += len(self._moves) * dt
            self.gpu_seconds += self.cluster.devices_in_use() * dt
        # requests still held at the end never got an answer in the run
        self.timed_out += sum(len(v) for v in self.held.values())
        return self.record(_time.perf_counter() - started)

    def _reset_counts(self) -> None:
        """The end of the warm-up: what came before is not counted (requests held or queued
        for a batch across the boundary are, since they are counted when they are answered or
        time out)."""
        self.hist[:] = 0
        self.served = self.within_slo = self.timed_out = self.cold_requests = self.starts = self.unplaceable = 0
        self.cold_starts = 0
        self.slice_seconds = self.gpu_seconds = self.replica_seconds = 0.0
        self.reasons = {}
        self.takebacks, self.held_short, self.held_short_by_rank = {}, {}, {}
        self.time_shared = 0
        self.requests = sum(len(v) for v in self.held.values()) + sum(len(q[0]) for q in self._queued.values())

    def record(self, wall_s: float) -> dict:
        total = max(1, self.requests)
        quantiles = {f"p{q}_ms": _hist_quantile(self.hist, q / 100.0) for q in (50, 95, 99)}
        return {
            "requests": self.requests, "served": self.served, "timed_out": self.timed_out,
            "slo_attainment": self.within_slo / total,
            **quantiles,
            "replica_slice_seconds": round(float(self.slice_seconds), 3),
            "replica_seconds": round(self.replica_seconds, 3),
            "whole_gpu_seconds": round(self.gpu_seconds, 3),
            "start": self.start, "cold_starts": self.cold_starts, "replica_starts": self.starts,
            "cold_start_requests": self.cold_requests,
            "unplaceable": self.unplaceable, "decisions": dict(sorted(self.reasons.items())),
            "takebacks": dict(sorted(self.takebacks.items())),
            "held_short": dict(sorted(self.held_short.items(), key=lambda kv: (-kv[1], kv[0]))),
            "held_short_by_rank": dict(sorted(self.held_short_by_rank.items())),
            "time_shared": self.time_shared, "time_shared_with_warmup": self.time_shared_all,
            "wall_s": round(wall_s, 3),
        }

    # ------------------------------------------------------------------ arrivals

    def _hold_cold(self, a: np.ndarray, f: np.ndarray, t0: float) -> tuple[np.ndarray, np.ndarray]:
        """Requests of functions with no replica ready in the tick: held, as the gateway holds
        them until a replica is ready (counted in the snapshot's activator_queue meanwhile);
        for one with no replica at all the policy hears of the first at once. Returns the
        requests to serve now (with earlier held ones whose first replica is ready in the tick)."""
        cold = self.n_srv[f] == 0
        if cold.any():
            cold_a, cold_fids = a[cold], f[cold]
            _, first = np.unique(cold_fids, return_index=True)
            self.cold_requests += int(cold.sum())
            self._arriving = (a, f)  # what the gateway holds at each look: _traffic_and_need
            end = t0 + self.config.tick_s
            for i in np.sort(first).tolist():  # in the order their first requests came
                fid = int(cold_fids[i])
                if self.n_srv[fid] == 0 and self.policy.reactive:
                    # the poke's look, poke_lag_s after the request (within the tick), reads every
                    # request of the function held by then
                    at = min(float(cold_a[i]) + self.config.poke_lag_s, end)
                    come = int(np.count_nonzero((cold_fids == fid) & (cold_a <= at))) if self.config.poke_lag_s else 1
                    self._decide(fid, at, activator_queue=len(self.held.get(fid, ())) + come)
            self._arriving = None
        unready = self._unready(t0 + self.config.tick_s)  # after the looks above: their starts count
        if not self.held and not cold.any() and unready is None:
            return a, f
        # everything for a function with a replica ready in the tick is served; the rest waits
        extra_a, extra_f = [], []
        for fid in [x for x in self.held if self.n_srv[x] > 0 and (unready is None or not unready[x])]:
            waiting = self.held.pop(fid)
            extra_a.append(np.asarray(waiting))
            extra_f.append(np.full(len(waiting), fid, np.int64))
        still = self.n_srv[f] == 0 if unready is None else (self.n_srv[f] == 0) | unready[f]
        for fid, when in zip(f[still].tolist(), a[still].tolist()):
            self.held.setdefault(fid, []).append(when)
        keep = ~still
        if extra_a:
            return np.concatenate(extra_a + [a[keep]]), np.concatenate(extra_f + [f[keep]])
        return a[keep], f[keep]

    def _unready(self, t1: float) -> np.ndarray | None:
        """Per function, whether it has replicas but none ready before `t1`; None when no
        replica is starting then (the common tick: nothing to hold beyond functions at zero)."""
        srv = self.servers
        starting = srv.alive & (srv.ready_at >= t1)
        if not starting.any():
            return None
        ready = np.bincount(srv.fid[srv.alive & ~starting], minlength=len(self.profiles))
        return (self.n_srv > 0) & (ready == 0)

    def _first_ready(self, t0: float) -> np.ndarray | None:
        """Per function, when its first replica is ready: the gateway holds the tick's requests
        (and those held before) until then, and sends them to a replica at max(arrival, it) (by
        the exact batcher one by one: released_one_by_one);
        None when every function serving in the tick had a replica ready at its start. A
        function whose first replica is ready inside the tick is marked unscraped for it: live,
        a replica's first scrape comes at the first look after it is ready, so what it did
        before is in no window."""
        srv = self.servers
        late = srv.alive & (srv.ready_at > t0)
        if not late.any():
            return None
        first = self._first_ready_times()
        self.tick_scraped[(first > t0) & np.isfinite(first)] = False
        return first

    def _first_ready_times(self) -> np.ndarray:
        """Per function, when its first live replica is (or was) ready; inf for one with none."""
        srv = self.servers
        first = np.full(len(self.profiles), np.inf)
        np.minimum.at(first, srv.fid[srv.alive], srv.ready_at[srv.alive])
        return first

    def _expire_held(self, now: float) -> None:
        limit = now - self.config.timeout_s
        for fid in list(self.held):
            waiting = self.held[fid]
            expired = sum(1 for t in waiting if t <= limit)
            if expired:
                self.timed_out += expired
                self.tick_refused[fid] += expired
                del waiting[:expired]
                if not waiting:
                    del self.held[fid]

    # ------------------------------------------------------------------ serving

    def _serve(self, a: np.ndarray, f: np.ndarray, t0: float, t1: float, until: float = math.inf) -> None:
        """The tick's requests served (their outcomes counted now; by the exact batcher, those
        whose batch would start at or after `until` wait for the next tick), then what the
        controller's look at t1 reads of them and of those before (_observe): the requests
        answered by t1."""
        stretch = self._stretch(t0) if self._shared_on is not None else None
        self.tick_n[:] = 0.0
        self.tick_busy[:] = 0.0
        self.tick_scraped[:] = True
        self.tick_refused[:] = 0.0
        if len(a) or self._queued:
            self._serve_arrivals(a, f, t0, stretch, until)
        self._observe(t0, t1)

    def _serve_arrivals(self, a: np.ndarray, f: np.ndarray, t0: float, stretch: np.ndarray | None,
                        until: float = math.inf) -> None:
        dt = self.config.tick_s
        first_ready = self._first_ready(t0)
        hop = self._hops()
        hop_of = hop[f] if hop is not None else np.zeros(len(a))
        a = a + hop_of  # the replicas see them a hop later; their latency still counts from arrival
        # in flight from when the gateway sends it on (the activator's hop counts: it reports the
        # requests it proxies); a request held for a cold start is in flight once a replica is ready
        sent = a - hop_of if first_ready is None else np.maximum(a - hop_of, first_ready[f])
        if self.config.batcher == "exact":  # shoal up's gateway sends what it held on one by one
            first = first_ready if first_ready is not None else self._first_ready_times()
            a, f, hop_of, sent = released_one_by_one(a, f, hop_of, sent, first)
        order = np.argsort(f, kind="stable")
        a, f, hop_of, sent = a[order], f[order], hop_of[order], sent[order]
        n_f = np.bincount(f, minlength=len(self.profiles))
        first = np.cumsum(n_f) - n_f
        srv = self.servers
        slots = np.flatnonzero(srv.alive)
        slots = slots[np.lexsort((srv.free[slots], srv.fid[slots]))]  # by function, earliest free first
        offset = np.searchsorted(srv.fid[slots], np.arange(len(self.profiles)))
        service, latency_extra = self._service_times(n_f, slots, t0, dt, stretch)
        parts, came = [], []  # each path's answers, in the order of its requests' arrivals (came)
        hops, sents = [], []  # and each one's hop and when it was sent
        n_rest = n_f
        if self.config.batcher == "exact":  # batching functions by shoal up's batcher, the rest below
            batching = self._batching[f]
            if batching.any() or self._queued:
                *answers, ran_a, ran_hop, ran_sent = self._serve_batches(
                    a[batching], f[batching], hop_of[batching], sent[batching], slots, offset, stretch, until)
                parts.append(tuple(answers))
                came.append(ran_a)
                hops.append(ran_hop)
                sents.append(ran_sent)
                a, f, hop_of, sent = a[~batching], f[~batching], hop_of[~batching], sent[~batching]
                n_rest = np.bincount(f, minlength=len(self.profiles))
                first = np.cumsum(n_rest) - n_rest
        # the interleaved solution is exact when the servers' free times (none earlier than the
        # first request) lie within one service time of each other; otherwise (a replica still
        # starting, or a new one beside busy ones) the function is served one request at a time
        present = np.flatnonzero(n_rest)
        earliest = np.maximum(srv.free[slots[offset[present]]], a[first[present]])
        latest = np.maximum(srv.free[slots[offset[present] + self.n_srv[present] - 1]], a[first[present]])
        uneven = np.zeros(len(self.profiles), bool)
        uneven[present] = latest - earliest > service[present] + 1e-12
        if uneven.any():
            mask = uneven[f]
            parts.append(self._serve_one_by_one(a[mask], f[mask], slots, offset, service, latency_extra))
            came.append(a[mask])
            hops.append(hop_of[mask])
            sents.append(sent[mask])
            a, f, hop_of, sent = a[~mask], f[~mask], hop_of[~mask], sent[~mask]
        if len(a):
            parts.append(self._serve_interleaved(a, f, t0, slots, offset, service, latency_extra))
            came.append(a)
            hops.append(hop_of)
            sents.append(sent)
        f, latency, s, rows = (np.concatenate(x) for x in zip(*parts)) if len(parts) > 1 else parts[0]
        came, hop_of, sent = (np.concatenate(x) if len(x) > 1 else x[0] for x in (came, hops, sents))
        end = came + latency  # answered at (a hop included)
        latency = latency + hop_of
        self._account(f, latency, s, n_f)
        self._answering = [np.concatenate(x) for x in zip(self._answering,
                                                          (end, f, latency, s, rows, np.zeros(len(end), bool), sent))]

    # ------------------------------------------------------------------ the baselines' request paths

    def _hops(self) -> np.ndarray | None:
        """Per function, seconds its requests spend in an extra hop before a replica: Knative's
        activator while the KPA keeps it in the path (KpaPolicy.hops); None for the other
        policies. The hop adds to latency (and so to the requests in flight the KPA reads: the
        activator reports the requests it proxies, collector.go's record takes them off the
        pods' count, and each is counted once), not to a replica's occupancy."""
        return self.policy.hops(len(self.profiles)) if isinstance(self.policy, KpaPolicy) else None

    def _cap_batches_at_max_ongoing(self, policy: "RayPolicy") -> None:
        """Ray Serve's router queue: the handle sends a replica at most `max_ongoing_requests`
        and holds the rest until a replica frees a slot (router.py). A queue at the router in
        front of replicas that each take the next request when they free one is the one FIFO
        queue, earliest-free replica first, that the serving solvers already model (a replica
        still starting takes nothing until it is ready); what the bound changes is the batch a
        replica can form: at most max_ongoing_requests rows (@serve.batch batches the requests
        the replica holds). E.g. resnet50, batches up to 32, max_ongoing_requests 5: batches of
        at most 5, 5.1 ms for 5 rows (1.0 ms a request) instead of 14 ms for 32 (0.44 ms).
        The requests at the router count in Ray's metric (ray_serve.split_ongoing)."""
        caps = [policy.max_ongoing(fid, spec) for fid, spec in enumerate(self.specs)]
        self.max_batch = np.minimum(self.max_batch, np.array(caps, dtype=self.max_batch.dtype))

    def _serve_interleaved(self, a, f, t0, slots, offset, service, latency_extra):
        """Request k of a function's tick goes to its server k mod c (servers by free time),
        each server a single-server queue: d_r = (r + 1) S + max(free, cummax(a_r - r S)),
        solved for all servers at once with one cummax whose segments are kept apart by
        adding server index x BIG."""
        srv = self.servers
        n_f = np.bincount(f, minlength=len(self.profiles))
        k = np.arange(len(a)) - (np.cumsum(n_f) - n_f)[f]
        c = self.n_srv[f]
        j, r = k % c, k // c
        g = offset[f] + j
        s = service[f]
        order = np.lexsort((r, g))
        a, f, g, r, s = a[order], f[order], g[order], r[order], s[order]
        v = (a - t0) - r * s
        cm = np.maximum.accumulate(v + g * BIG) - g * BIG
        floor = np.maximum(srv.free[slots[g]] - t0, -1.0)
        u = np.maximum(cm, floor)
        done = t0 + u + (r + 1) * s
        extra = latency_extra[f]
        rows = self._batch[f]  # each request's batch, in rows
        if self.batch_backlog:
            # a batcher runs what is queued: a request with requests queued ahead of it on its
            # replica rides in a batch of them (up to the largest), cheaper per request; one
            # correction of the tick's rule, solved again with per-request service times
            ahead = np.floor((done - s - a) / s + 1e-9)
            tick_batch = self._batch[f]
            batch = np.minimum(np.maximum(tick_batch, ahead + 1), self.max_batch[f])
            grown = batch > tick_batch
            if grown.any():
                lat = self._latency_of(batch, f) * (s + extra) / self._latency_of(tick_batch, f)  # on its slice
                s = np.where(grown, lat / batch, s)
                extra = np.where(grown, lat - s, extra)
                rows = batch
                starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
                total = np.cumsum(s)
                before = total - s - np.repeat((total - s)[starts], np.diff(np.r_[starts, len(s)]))
                cm = np.maximum.accumulate(((a - t0) - before) + g * BIG) - g * BIG
                done = t0 + np.maximum(cm, floor) + before + s
        last = np.flatnonzero(np.r_[g[1:] != g[:-1], True])
        srv.free[slots[g[last]]] = done[last]
        back = np.empty_like(order)
        back[order] = np.arange(len(order))  # in the order the requests came in, as the other paths
        return f[back], (done - a + extra)[back], s[back], rows[back]

    def _serve_one_by_one(self, a, f, slots, offset, service, latency_extra):
        """Earliest-free replica first, one request at a time (a heap per function). With
        batch_backlog, a request that finds requests queued ahead of it rides in a batch of
        them, as in _serve_interleaved (here from the wait it really finds)."""
        srv = self.servers
        latency = np.empty(len(a))
        occupied = service[f].copy()
        rows = self._batch[f]  # a copy (fancy indexing): each request's batch, in rows
        bounds = np.flatnonzero(np.r_[True, f[1:] != f[:-1], True])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            fid = int(f[lo])
            mine = slots[offset[fid]:offset[fid] + self.n_srv[fid]].tolist()
            heap = [(float(srv.free[x]), x) for x in mine]
            heapq.heapify(heap)
            s, extra = float(service[fid]), float(latency_extra[fid])
            costs = self._backlog_costs(fid, s, extra) if self.batch_backlog else None
            for i, arrival in enumerate(a[lo:hi].tolist(), lo):
                free, slot = heap[0]
                s_i, extra_i = s, extra
                if costs is not None and free > arrival:
                    ahead = int((free - arrival) / s + 1e-9)
                    s_i, extra_i, rows[i] = costs[min(ahead, len(costs) - 1)]
                    occupied[i] = s_i
                done = (free if free > arrival else arrival) + s_i
                heapq.heapreplace(heap, (done, slot))
                latency[i] = done - arrival + extra_i
            for free, slot in heap:
                srv.free[slot] = free
        return f, latency, occupied, rows

    def _serve_batches(self, a, f, hop_of, sent, slots, offset, stretch, until=math.inf):
        """Batching functions' requests as shoal up's batcher serves them (SimConfig.batcher
        "exact") on a function's replicas as they are (a replica still starting frees at its
        ready time), each at its speed on its slice. Routing "fewest" (the default) routes as the
        gateway does, each request at its arrival to the replica with the fewest outstanding,
        where it queues (_serve_routed, serve_routed); "queue" keeps one queue per function,
        served by the replica that frees first (serve_batched): with one replica the same; with
        several in a burst, fuller batches than live (the real trace's minutes 10-20 at 4x: about
        0.9 points of SLO, docs/simlive.md). A
        batch that would start at or after `until` (the tick's end) waits with the rest of the
        queue (_queued) for the next tick's call, as a replica that frees then runs what is queued
        by then, the next tick's requests too; e.g. one replica busy until 1.05 s, 2 requests
        queued from 0.95 s and 3 more by 1.05 s: one batch of 5 at 1.05 s, not 2 and then 3. A
        function's last replica removed with requests queued runs them before it goes (_remove,
        _draining), as live drains a replica. Returns
        (function, latency from the replicas' arrival, occupancy, rows, that arrival, hop, sent)
        of the requests run, the queue's first."""
        srv = self.servers
        spans: dict[int, tuple[int, int]] = {}
        bounds = np.flatnonzero(np.r_[True, f[1:] != f[:-1], True]) if len(f) else np.zeros(1, np.int64)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            spans[int(f[lo])] = (lo, hi)
        out = []
        for fid in sorted(spans.keys() | self._queued.keys()):
            lo, hi = spans.get(fid, (0, 0))
            mine_a, mine_hop, mine_sent = a[lo:hi], hop_of[lo:hi], sent[lo:hi]
            by_rows = batch_seconds(self.profiles[fid].latency_ms, int(self.max_batch[fid]))
            pinned_slots, pinned = self._queued_at.pop(fid, None), None
            if fid in self._queued:
                qa, qhop, qsent = self._queued.pop(fid)
                if fid in self._draining:  # its last replica went: it runs them, all, before it is gone
                    free, speed, share = self._draining.pop(fid)
                    sizes, ends, busy, frees = serve_batched(qa.tolist(), [free], [speed], by_rows)
                    self.slice_seconds += (frees[0] - free) * share
                    out.append(self._ran(fid, qa, qhop, qsent, sizes, ends, busy))
                else:
                    mine_a, mine_hop, mine_sent = (np.concatenate(x) for x in ((qa, mine_a), (qhop, mine_hop),
                                                                              (qsent, mine_sent)))
                    order = np.argsort(mine_a, kind="stable")  # an activator's hop may have changed since
                    mine_a, mine_hop, mine_sent = mine_a[order], mine_hop[order], mine_sent[order]
                    if pinned_slots is not None:  # routing "fewest": each waits at the replica it went to
                        pinned = np.concatenate([pinned_slots, np.full(hi - lo, -1, np.int64)])[order]
            if not len(mine_a):
                continue
            if self.n_srv[fid] == 0:  # not reached: a function at zero has its requests held (_hold_cold)
                self.held[fid] = sorted(self.held.get(fid, []) + (mine_a - mine_hop).tolist())
                continue
            mine = slots[offset[fid]:offset[fid] + self.n_srv[fid]]
            speed = srv.speed[mine] if stretch is None else srv.speed[mine] * stretch[srv.device[mine]]
            if self.config.routing == "fewest":
                out += self._serve_routed(fid, mine, speed, mine_a, mine_hop, mine_sent, by_rows, until, pinned)
                continue
            sizes, ends, busy, frees = serve_batched(mine_a.tolist(), srv.free[mine].tolist(), speed.tolist(),
                                                     by_rows, until)
            srv.free[mine] = frees
            ran = sum(sizes)
            if ran < len(mine_a):
                self._queued[fid] = (mine_a[ran:], mine_hop[ran:], mine_sent[ran:])
            if ran:
                out.append(self._ran(fid, mine_a, mine_hop, mine_sent, sizes, ends, busy))
        if not out:
            return tuple(np.zeros(0, np.int64) if k == 0 else np.zeros(0) for k in range(7))
        return tuple(np.concatenate(x) for x in zip(*out))

    def _serve_routed(self, fid, mine, speed, a, hop_of, sent, by_rows, until, pinned_slots) -> list:
        """_serve_batches's step for SimConfig.routing "fewest": serve_routed on the function's
        replicas `mine` (slots), requests queued at a replica from before staying at it while it
        is there (else routed again at their arrival, no batch starting before the tick's); those
        not run wait at their replica for the next call (_queued, _queued_at)."""
        srv = self.servers
        pinned = None
        if pinned_slots is not None:  # a slot to its index among `mine`; -1: not one of them (or not routed)
            index = np.full(len(srv.free) + 1, -1, np.int64)  # the last entry answers slot -1
            index[mine] = np.arange(len(mine))
            pinned = index[pinned_slots].tolist()
        busy = [self._batch_rows.get(int(slot), 1) for slot in mine.tolist()]
        ends, rows, share, frees, left, at, running = serve_routed(
            a.tolist(), srv.free[mine].tolist(), srv.ready_at[mine].tolist(), speed.tolist(), by_rows, until,
            pinned, busy, until - self.config.tick_s if math.isfinite(until) else -math.inf)
        srv.free[mine] = frees
        for slot, b in zip(mine.tolist(), running):
            self._batch_rows[int(slot)] = b
        if left:
            keep = np.array(left, np.int64)
            self._queued[fid] = (a[keep], hop_of[keep], sent[keep])
            self._queued_at[fid] = mine[np.array(at, np.int64)]
        run = np.flatnonzero(np.array(rows) > 0)
        if not len(run):
            return []
        size = np.array(rows, float)[run]
        return [(np.full(len(run), fid, np.int64), np.array(ends)[run] - a[run], np.array(share)[run], size,
                 a[run], hop_of[run], sent[run])]

    @staticmethod
    def _ran(fid, a, hop_of, sent, sizes, ends, busy):
        """_serve_batches's answers for the first sum(sizes) of a function's requests (`a`, as
        the replicas saw them) run as serve_batched's batches of `sizes` rows."""
        ran = sum(sizes)
        size = np.array(sizes, float)
        return (np.full(ran, fid, np.int64), np.repeat(ends, sizes) - a[:ran],
                np.repeat(np.array(busy) / size, sizes),  # a request's share of its batch
                np.repeat(size, sizes), a[:ran], hop_of[:ran], sent[:ran])

    def _backlog_costs(self, fid: int, s: float, extra: float) -> list[tuple[float, float, float]] | None:
        """(occupancy, rest of the batch, rows) for a request with 0, 1, ... requests ahead of
        it: a batch of max(the tick's batch, ahead + 1) rows, up to the largest; None when the
        function's batches cannot grow."""
        top, tick_batch = int(self.max_batch[fid]), float(self._batch[fid])
        if tick_batch >= top:
            return None
        scale = (s + extra) / float(self._latency_of(np.array([tick_batch]), np.array([fid]))[0])  # the slice
        rows = np.maximum(tick_batch, np.arange(1, top + 1, dtype=float))
        lat = self._latency_of(rows, np.full(top, fid)) * scale
        return [(s, extra, tick_batch) if b <= tick_batch else (float(x / b), float(x - x / b), float(b))
                for b, x in zip(rows.tolist(), lat.tolist())]

    def _service_times(self, n_f: np.ndarray, slots: np.ndarray, t0: float, dt: float,
                       stretch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per function: seconds a request occupies a replica, and the rest of its batch's latency.
        The batch size is `batch_size`'s rule for what each serving replica has to do in the
        tick: the tick's arrivals plus the backlog its replicas carry in (their work past t0
        over the last tick's occupancy), over the replicas that serve in the tick (one ready
        for a part of it counts for that part; one still starting does not batch for the
        others). E.g. 400/s on 2 ready replicas of 4 ms, nothing queued ->
        ceil(200 x 0.004 / 0.8) = 1; with 100 requests still queued on them -> 250/s each
        for the batch rule: ceil(250 x .004 / .8) = 2. On a time-shared device a replica's speed
        is stretched (_stretch)."""
        srv = self.servers
        n = len(self.profiles)
        fid = srv.fid[slots]
        weights = srv.speed[slots] if stretch is None else srv.speed[slots] * stretch[srv.device[slots]]
        speed_sum = np.bincount(fid, weights=weights, minlength=n)
        speed = np.where(self.n_srv > 0, speed_sum / np.maximum(self.n_srv, 1), 1.0)
        ready_at = srv.ready_at[slots]
        serving = np.bincount(fid, weights=np.clip((t0 + dt - ready_at) / dt, 0.0, 1.0), minlength=n)
        backlog_s = np.bincount(fid, weights=np.maximum(srv.free[slots] - np.maximum(ready_at, t0), 0.0), minlength=n)
        queued = backlog_s / self._occupancy
        per_replica = (n_f + queued) / np.where(serving > 0.05, serving, np.maximum(self.n_srv, 1)) / dt
        batch = np.ones(n)
        # only functions that batch and have work iterate (most of a large population is idle in a tick)
        busy = np.flatnonzero((per_replica > 0) & (self.max_batch > 1)) if self.config.batcher == "rule" \
            else np.zeros(0, np.int64)  # the exact batcher forms its own (_serve_batches)
        if len(busy):
            load = per_replica[busy] * speed[busy] / BATCH_FILL  # arrivals per second of batch latency, over the fill
            top, b = self.max_batch[busy], np.ones(len(busy))
            for _ in range(int(top.max())):  # rises to its fixed point; one step per size at most
                wanted = np.minimum(np.maximum(np.ceil(load * self._latency_s(b, busy) - 1e-9), b), top)
                if (wanted == b).all():
                    break
                b = wanted
            batch[busy] = b
        lat = self._latency_s(batch) * speed
        occupancy = lat / batch
        self._occupancy, self._batch = occupancy, batch
        return occupancy, lat - occupancy

    def _latency_of(self, batch: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Batch latency of each request's function at its own batch size (reference slice)."""
        out = np.empty(len(f))
        group = self._lat_group[f]
        for g, (_, sizes, secs) in enumerate(self._lat_tables):
            mask = group == g
            if mask.any():
                out[mask] = np.interp(batch[mask], sizes, secs)
        return out

    def _latency_s(self, batch: np.ndarray, of: np.ndarray | None = None) -> np.ndarray:
        """Batch latency per function at `batch` rows (on the profile's reference slice);
        with `of`, `batch` is for those functions only."""
        if of is None:
            out = np.empty(len(self.profiles))
            for ix, sizes, secs in self._lat_tables:
                out[ix] = np.interp(batch[ix], sizes, secs)
            return out
        out = np.empty(len(of))
        group = self._lat_group[of]
        for g, (_, sizes, secs) in enumerate(self._lat_tables):
            mask = group == g
            if mask.any():
                out[mask] = np.interp(batch[mask], sizes, secs)
        return out

    def _account(self, f: np.ndarray, latency: np.ndarray, s: np.ndarray, n_f: np.ndarray) -> None:
        """The tick's requests: their outcomes (answered, within the SLO, timed out, the latency
        histogram of the record) and the work they brought, by arrival (the gateway's count,
        their replicas' occupancy): what the lending and the sharing of a device weigh. What
        the policy's look reads is _observe's."""
        n = len(self.profiles)
        self.served += len(latency)
        ok = latency <= self.slo_s[f]
        self.within_slo += int(ok.sum())
        self.timed_out += int((latency > self.config.timeout_s).sum())
        self.hist += np.bincount(np.searchsorted(LAT_EDGES, latency), minlength=len(self.hist))
        self.tick_n[:] = n_f
        self.tick_busy[:] = np.bincount(f, weights=s, minlength=n)

    def _observe(self, t0: float, t1: float) -> None:
        """What a look at t1 reads of the requests answered or being run (`_answering`): as the
        gateway's histogram and the replicas' counters grow, a request counts (rps, p95, the share
        over the SLO, the batches learned) once it is answered, by t1, and its replica's busy time
        as it runs, each tick its overlap with the run of its batch: a request whose batch ran
        0.9-1.1 s counts half its occupancy at the look at 1 s, half and its answer at 2 s. Live,
        a request that arrived at 0.95 s and is answered at 1.05 s is counted, with its latency,
        in no window of the look at 1 s; the simulator counted it there before it was answered.
        Requests in flight are the gateway's integral's growth over the tick
        (serving.metrics.InFlight, read as sources.direct reads it): each request's overlap of its
        time from sent to answered with the tick; e.g. one sent at 0.5 s and answered at 2.5 s
        adds 0.5 request-seconds to the look at 1 s and 1.0 to the look at 2 s (the one of
        0.95-1.05 s, 0.05 to the look at 1 s); one queued for a batch that starts after the tick
        (_queued) counts from sent to t1 (or its timeout)."""
        end, f, latency, share, rows, read, sent = self._answering
        n = len(self.profiles)
        limit = self.config.timeout_s
        self.seen_n[:] = 0.0
        self.seen_busy[:] = 0.0
        self.seen_p95[:] = np.nan
        self.seen_over[:] = 0.0
        self.seen_inflight[:] = 0.0
        for fid, (qa, qhop, qsent) in self._queued.items():  # queued at a replica, their batch not begun
            until = np.minimum(qa - qhop + limit, t1)  # a 504 at the timeout ends it
            self.seen_inflight[fid] += float(np.maximum(until - np.maximum(qsent, t0), 0.0).sum())
        if not len(end):
            return
        # one slower than the timeout is answered (504) at it, its latency the timeout, and read
        # then; its replica runs it on to the end (busy till then)
        late = latency > limit
        answered = np.where(late, end - latency + limit, end) if late.any() else end
        inside = np.minimum(answered, t1) - np.maximum(sent, t0)
        self.seen_inflight += np.bincount(f, weights=np.maximum(inside, 0.0), minlength=n)
        run = share * rows  # the seconds of its batch, which ended when it was answered
        start = np.maximum(end - run, end - latency)
        with np.errstate(divide="ignore", invalid="ignore"):
            part = np.where(end > start, (np.minimum(end, t1) - np.maximum(start, t0)) / (end - start), 1.0)
        self.seen_busy[:] = np.bincount(f, weights=share * np.clip(part, 0.0, 1.0), minlength=n)
        now = (answered <= t1 + 1e-9) & ~read
        gone = end <= t1 + 1e-9  # each read by now: answered <= end
        if gone.all():
            self._answering = list(NOTHING_ANSWERING)
        else:
            self._answering = [x[~gone] for x in (end, f, latency, share, rows, read | now, sent)]
        if not now.any():
            return
        f, latency, share, rows = f[now], np.minimum(latency[now], limit), share[now], rows[now]
        n_f = np.bincount(f, minlength=n)
        self.seen_n[:] = n_f
        # p95 and the share over the SLO as the controller reads them: from the gateway's latency
        # histogram (from arrival), interpolated inside its buckets (metrics.quantile,
        # fraction_over); e.g. 8 requests of 60-95 ms and one of 110 ms: p95 in (0.1, 0.15],
        # 0.1 + 0.05 x (8.55 - 8) = 0.1275 s, and none over a 200 ms SLO
        present = np.flatnonzero(n_f)
        row = np.zeros(n, np.int64)
        row[present] = np.arange(len(present))
        width = len(GATEWAY_BOUNDS)
        counts = np.bincount(row[f] * width + np.searchsorted(GATEWAY_BOUNDS, latency, side="left"),
                             minlength=len(present) * width).reshape(len(present), width).cumsum(axis=1)
        self.seen_p95[present] = quantiles(GATEWAY_BOUNDS, counts, 0.95)
        self.seen_over[present] = fractions_over(GATEWAY_BOUNDS, counts, self.slo_s[present]) * n_f[present]
        self._learn_batches(f, rows, share, n_f)

    def _learn_batches(self, f: np.ndarray, rows: np.ndarray, share: np.ndarray, n_f: np.ndarray) -> None:
        """What the controller learns of the tick's batches, per batching function that ran any:
        its window as metrics.batch_window reads a replica's counters (requests per batch,
        seconds per batch: a request is 1/rows of a batch, its occupancy its share of the
        batch's seconds, on the slice it ran on), learned by loop.Memory.learn on the slice new
        replicas get (a table learned on another is carried to it at its speed: loop.on_slice).
        E.g. 40 requests, 8 in batches of 1 (4 ms) and 32 in batches of 8 (6 ms): 8 + 4 = 12
        batches, (40 / 12, (8 x 4 + 4 x 6) / 12 ms) = (3.33, 4.67 ms)."""
        fids = np.flatnonzero((n_f > 0) & self._batching & self.tick_scraped)
        if not len(fids):
            return
        batches = np.bincount(f, weights=1.0 / rows, minlength=len(n_f))[fids]
        sizes, seconds = n_f[fids] / batches, np.bincount(f, weights=share, minlength=len(n_f))[fids] / batches
        # batches of one: each request's occupancy is the batch's seconds, exactly (a sum of n
        # equal occupancies over n differs in its last bits from tick to tick)
        seconds = np.where(sizes == 1.0, self._occupancy[fids], seconds)
        moved = (sizes != self._settled[fids, 0]) | (seconds != self._settled[fids, 1])
        learn, known, names, slices, tables = self.memory.learn, self.memory.batch, self._names, self._slice_of, \
            self._tables
        settled = self._settled
        for fid, size, secs in zip(fids[moved].tolist(), sizes[moved].tolist(), seconds[moved].tolist()):
            before = known.get(names[fid])
            table = learn(names[fid], slices[fid], (size, secs))
            settled[fid] = (size, secs) if before is not None and before == known[names[fid]] else (math.nan, math.nan)
            tables[fid] = policy_table(table, int(self.max_batch[fid]))

    def _count_cold_starts(self, a: np.ndarray, f: np.ndarray) -> None:
        """A start from zero that a request of the tick (or one held before) waited for, i.e.
        arrived before its first replica was ready: one cold start, as the gateway counts a
        replica ready while requests wait (serving/gateway.py add_endpoint)."""
        if not len(a):
            return
        waited = a < self._wait_until[f]
        if waited.any():
            fids = np.unique(f[waited])
            self.cold_starts += len(fids)
            self._wait_until[fids] = -np.inf

    # ------------------------------------------------------------------ decisions

    def _deploy_looks(self, now: float) -> None:
        """The first look at every function at zero, at its deploy (`deployed_at`; t = 0 by
        default): a deploy pokes the live loop (deploy/local/server.py, put_function), which looks
        at once, before the function's first request, and the policy's windows (the error
        budget's) and the needs a rise is read from begin there with a need of 0 (docs/simlive.md,
        "The deploy's own look"). One warm-started was deployed before the trace (as if it had
        been running): its first look is the first tick's, with that tick's measurements (a look
        at t=0 would read a window of no traffic that never was)."""
        for fid in np.flatnonzero(self.n_srv == 0).tolist():
            if fid not in self._settled_once:
                self._decide(fid, now, activator_queue=0)

    def _measure_cold(self, fids) -> None:
        """These functions have had a replica ready: their cold start is measured (create to
        ready, as shoal up's backend times it) and the policy reads it from now on."""
        for fid in fids:
            self._cold[fid] = float(self.cold[fid])
            self._measured[fid] = True
            if self._batching[fid]:  # and its probe is read (DataPlane._probe), on the slice it ran on
                srv = self.servers
                mine = [s for s in self.slots[fid] if srv.alive[s]]
                on = float(srv.slice[min(mine, key=lambda s: srv.ready_at[s])]) if mine else self._slice_of[fid]
                self._tables[fid] = policy_table(self.memory.learn(self._names[fid], self._slice_of[fid], None,
                                                                   (on, self.profiles[fid].probe(on))),
                                                 int(self.max_batch[fid]))

    def _wake(self, t1: float) -> None:
        while self.wakes and self.wakes[0][0] < t1:
            when, fid = heapq.heappop(self.wakes)
            if self.n_srv[fid] == 0 and fid not in self.held:
                self._decide(fid, max(when, t1 - self.config.tick_s), activator_queue=0)

    def _decide_all(self, t1: float) -> None:
        """Every function with replicas, except idle ones its policy said it would leave
        alone until later (looked at again at that time, or once a request of it arrives, is
        answered or runs); then those without one that hold requests."""
        live = np.flatnonzero((self.n_srv > 0) & ((self.quiet <= t1 + 1e-9) | (self.tick_n > 0) | (self.seen_n > 0)
                                                   | (self.seen_busy > 0)))
        srv = self.servers  # ready replicas per function, counted once (a decision changes only its own)
        ready = np.bincount(srv.fid[srv.alive & (srv.ready_at <= t1)], minlength=len(self.slots))
        fresh = np.flatnonzero((ready > 0) & ~self._measured)
        if len(fresh):
            self._measure_cold(fresh.tolist())
        if self._lends:
            self._note_activity(t1)
            self._needs.append((t1, self._traffic_and_need()[1]))
            trim_to_window(self._needs, t1, self._need_window_s)
        self._in_tick = True  # replicas that do not fit wait for the tick's end (_share_out)
        self._look_each(live, ready[live], t1)
        waiting = np.array([x for x in self.held if self.n_srv[x] == 0], np.int64)
        self._look_each(waiting, ready[waiting], t1)
        self._in_tick = False
        if self._short:
            self._share_out(t1)
        if self._move_asks:  # in the room the tick's starts left; asked again each tick until done
            for fid in [f for f, asked in self._move_asks.items() if not asked or self._move(f, t1)]:
                del self._move_asks[fid]

    def _look_each(self, fids: np.ndarray, ready: np.ndarray, now: float) -> None:
        """The policy's looks at `fids` (`ready` replicas ready at `now`) from this tick's
        measurements, in one call (looks.look_each), then the decisions to act on, in order: the
        same as one look and its action after another, since a function's snapshot, spec and state
        are its own and acting on a decision changes only its own. Concurrency as the time average
        of requests in flight over the tick (_observe), the duty of each ready replica (busy seconds
        / (ready x tick), at most 1), p95, seconds of service and the share over the SLO per request
        answered, from numpy at once."""
        if not len(fids):
            return
        dt = self.config.tick_s
        n, scraped = self.seen_n[fids], self.tick_scraped[fids]
        seen, busy = n * scraped, self.seen_busy[fids] * scraped  # what the replicas' scrapes saw
        with np.errstate(divide="ignore", invalid="ignore"):
            duty = np.where(ready > 0, np.minimum(1.0, busy / (ready * dt)), 0.0)
            service = np.where(seen > 0, busy / seen, np.nan)
            # the gateway's: it saw them all, the held ones that timed out as misses past every bound
            refused = self.tick_refused[fids]
            over_slo = np.where(n + refused > 0, (self.seen_over[fids] + refused) / (n + refused), 0.0)
            p95 = np.where(refused > 0.05 * (n + refused), GATEWAY_BOUNDS[-2], self.seen_p95[fids])
        inflight = self.seen_inflight[fids] / dt
        tick = looks.Tick(fids.tolist(), ready.tolist(), self.n_srv[fids].tolist(), inflight.tolist(),
                          duty.tolist(), (seen / dt).tolist(), p95.tolist(), service.tolist(),
                          over_slo.tolist(), ((n + refused) / dt).tolist(), now, dt)
        acted, quiet = self.policy.look_each(tick, self._functions)
        if quiet is not None:
            self.quiet[fids] = quiet
        for fid, snapshot, decision in acted:
            self._settle(fid, snapshot, decision, now)

    def _decide(self, fid: int, now: float, activator_queue: int) -> None:
        """A look between ticks (a request held, a pre-warm due): only the held requests are known."""
        mine = self.slots[fid]
        ready = sum(1 for s in mine if self.servers.ready_at[s] <= now)
        if ready and not self._measured[fid]:
            self._measure_cold((fid,))
        self._asking = (fid, activator_queue, now)  # the requests a replica it cannot place waits for (_share_out)
        self._look(fid, self.policy.snapshot_type(self._names[fid], now, ready=ready, starting=len(mine) - ready,
                                                  activator_queue=activator_queue, cold_start_s=self._cold[fid],
                                                  slice_fraction=self._slice_of[fid],
                                                  deployed_slice=self.profiles[fid].slice_fraction,
                                                  batch_latency_s=self._tables[fid]),  # as learned so far
                   now)
        self._asking = (-1, 0, 0.0)  # this look only: kept, a tick's end read its requests as held for ever

    def _look(self, fid: int, snapshot: MetricsSnapshot, now: float) -> None:
        """The policy's decision on `snapshot`, applied; when the policy may leave the function
        alone (idle) or should be asked again (a pre-warm ahead)."""
        self._settle(fid, snapshot, self.policy.decide(fid, snapshot, self.specs[fid], now), now)

    def _settle(self, fid: int, snapshot: MetricsSnapshot, decision: ScaleDecision, now: float) -> None:
        """`decision` on `snapshot` applied, then the function's quiet time and wake-up."""
        self._settled_once.add(fid)
        self._apply(fid, decision, now)
        current = len(self.slots[fid])  # the same as n_srv[fid], without a numpy read
        cold = self._cold[fid]
        if snapshot.rps == 0 and snapshot.demand == 0 and current and decision.desired == current and not snapshot.starting:
            self.quiet[fid] = self.policy.quiet_until(fid, current, now, cold)
        else:
            self.quiet[fid] = 0.0
        if current == 0:
            wake = self.policy.wake_at(fid, cold)
            if wake is not None and wake > now:
                heapq.heappush(self.wakes, (wake, fid))

    def _apply(self, fid: int, decision: ScaleDecision, now: float) -> None:
        if decision.slice_fraction is not None and decision.slice_fraction != self._slice_of[fid]:
            # new replicas get the new slice; what was learned on the old one is carried at the
            # new slice's speed, as the live loop carries it at its next look (loop.Memory.learn)
            self._slice_of[fid] = decision.slice_fraction
            self._tables[fid] = policy_table(self.memory.learn(self._names[fid], decision.slice_fraction, None),
                                             int(self.max_batch[fid]))
            self._settled[fid] = math.nan
        current = len(self.slots[fid])  # n_srv[fid]
        if self.config.move_to_slice:
            steady = decision.desired == current
            self._move_asks[fid] = not self._moving(fid, steady) and steady
        if decision.desired == current:
            return
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        if decision.desired > current:
            self._start(fid, decision.desired - current, now)
            if self._short and not self._in_tick:  # a look between ticks: shared out at once
                self._share_out(now)
        else:
            self._stop(fid, current - decision.desired, now)

    def _moving(self, fid: int, steady: bool) -> bool:
        """Whether a move of the function goes on (steady, to the slice asked; one whose old
        replica went was called off in _remove); one that does not is called off."""
        pending = self._moves.get(fid)
        if pending is None:
            return False
        if steady and abs(pending[3] - self._slice_of[fid]) <= 1e-9:
            return True
        self._cancel_move(fid)
        return False

    def _move(self, fid: int, now: float) -> bool:
        """A ready replica on a larger slice than the function's replicas now get, moved to that
        slice (lending.to_move, as ReplicaScaler._move), for a function whose look neither scaled
        it nor has a replica of it starting: a replica on it placed where a slice is free after the
        tick's starts (_decide_all), and once it is ready (_finish_moves) the old one gives its
        slice back. A look that scales the function, or asks another slice, calls a move off.
        Only looks that act reach here (looks.look_each), where the live loop's scaler hears every
        look: so one that could not be placed (no free slice, a replica starting) is asked again
        each tick until a later look scales the function. Whether it is done (placed, or nothing
        to move)."""
        srv, mine = self.servers, self.slots[fid]
        if fid in self._moves or not mine:
            return True
        i = to_move([float(srv.slice[s]) for s in mine], self._slice_of[fid])
        if i is None:
            return True  # nothing to move
        if any(srv.ready_at[s] > now for s in mine):
            return False  # one starting: asked again once it is ready
        demand = self._demand(fid)
        placed = self.cluster.place(demand)
        if isinstance(placed, Unplaceable):
            return False
        self._moves[fid] = (demand.replica, self.slot_replica[mine[i]], now + float(self.cold[fid]),
                            self._slice_of[fid], self._device_index[placed.device.id])
        self.starts += 1
        return True

    def _cancel_move(self, fid: int) -> None:
        new = self._moves.pop(fid)[0]
        self.cluster.release(new)

    def _finish_moves(self, now: float) -> None:
        """The moves whose new replica is ready by `now`: the old replica's slot runs on from now
        as the new one, on its slice and device, and the old slice is given back."""
        srv = self.servers
        for fid, (new, old, ready_at, fraction, device) in list(self._moves.items()):
            if ready_at > now:
                continue
            del self._moves[fid]
            slot = self.replica_slot.pop(old)
            del self.slot_replica[slot]
            # the old one finishes what it has queued, its slice charged until then (as _remove)
            self.slice_seconds += max(0.0, srv.free[slot] - now) * srv.slice[slot]
            self.cluster.release(old)
            srv.slice[slot], srv.device[slot] = fraction, device
            srv.speed[slot] = self.profiles[fid].ref_slice / fraction
            self.replica_slot[new], self.slot_replica[slot] = slot, new

    def _start(self, fid: int, count: int, now: float) -> None:
        """Place `count` replicas; those that do not fit for want of room wait for _share_out when
        the policy lends (Shoal's controller), else count as unplaceable."""
        if not self.slots[fid]:  # from zero: a cold start if a request waits for it (_count_cold_starts)
            self._wait_until[fid] = now + float(self.cold[fid])
        for k in range(count):
            placed = self._place(fid, self._demand(fid), now)
            if isinstance(placed, Unplaceable):
                if self._lends and placed.status == Status.UNSCHEDULABLE:
                    self._short[fid] = self._short.get(fid, 0) + count - k
                else:
                    self.unplaceable += 1
                break

    def _demand(self, fid: int) -> Demand:
        """A new replica of `fid` on the slice its replicas get now."""
        self._ids += 1
        fraction = self._slice_of[fid]
        name = self._names[fid]
        memory = self.profiles[fid].memory_mib
        return Demand(f"{name}-{self._ids}", name, Fraction(fraction).limit_denominator(64),
                      int(self.config.gpu_memory_mib * fraction) if memory is None else memory, ("gpu",))

    def _place(self, fid: int, demand: Demand, now: float):
        placed = self.cluster.place(demand)
        if isinstance(placed, Unplaceable):
            return placed
        return self._add_server(fid, demand, placed, now)

    def _add_server(self, fid: int, demand: Demand, placed: Placement, now: float):
        fraction = self._slice_of[fid]
        slot = self.servers.add(fid, now + float(self.cold[fid]), self.profiles[fid].ref_slice / fraction, fraction,
                                self._device_index[placed.device.id])
        self.slots[fid].append(slot)
        self.replica_slot[demand.replica], self.slot_replica[slot] = slot, demand.replica
        self.n_srv[fid] += 1
        self.starts += 1
        return placed

    def _stop(self, fid: int, count: int, now: float) -> None:
        srv = self.servers
        # replicas still starting go first, newest first (as the controller stops them): they
        # serve nobody yet; then the placement's consolidating choice
        starting = sorted((s for s in self.slots[fid] if srv.ready_at[s] > now), key=lambda s: -srv.ready_at[s])
        victims = [self.slot_replica[s] for s in starting[:count]]
        if len(victims) < count:
            chosen = set(victims)
            rest = self.cluster.scale_down_victims(self._names[fid], count + len(victims))
            victims += [r for r in rest if r not in chosen][:count - len(victims)]
        for replica in victims:
            self._remove(fid, replica, now)

    def _remove(self, fid: int, replica: str, now: float) -> None:
        if fid in self._moves and self._moves[fid][1] == replica:  # taken back while moving
            self._cancel_move(fid)
        srv = self.servers
        slot = self.replica_slot.pop(replica)
        del self.slot_replica[slot]
        # a removed replica finishes what it has queued: its slice is charged until then
        self.slice_seconds += max(0.0, srv.free[slot] - now) * srv.slice[slot]
        if self.n_srv[fid] == 1 and fid in self._queued:  # and those waiting for its next batch
            self._draining[fid] = (max(float(srv.free[slot]), now), float(srv.speed[slot]), float(srv.slice[slot]))
        elif fid in self._queued_at:  # routing "fewest": those waiting at it go to the others (live: it drains them)
            self._queued_at[fid] = np.where(self._queued_at[fid] == slot, -1, self._queued_at[fid])
        self._batch_rows.pop(slot, None)
        if srv.ready_at[slot] <= now and not self._measured[fid]:
            self._measure_cold((fid,))  # it was ready before it went
        self.cluster.release(replica)
        srv.remove(slot)
        self.slots[fid].remove(slot)
        self.n_srv[fid] -= 1

    # ------------------------------------------------------------------ a full cluster shared

    def _note_activity(self, now: float) -> None:
        """Each function's request rate (lending.decay_rate over the controller's 120 s window,
        every function at once) and when it last had requests, as ReplicaScaler notes them."""
        dt = self.config.tick_s
        self._rate_count, self._rate_seconds = decay_rate(self._rate_count, self._rate_seconds, self.tick_n, dt,
                                                          RATE_WINDOW_S)
        self._active_at[self.tick_n > 0] = now

    def _share_out(self, now: float) -> None:
        """The replicas this tick's decisions could not place, granted by autoscaler.lending.share
        against what every placed replica serves (_holds): a function's floor first, then needed
        replicas, then headroom, each by the late requests its loss would cost per slice; a grant
        takes back lower-ranked replicas of other functions (idle ones cheapest first) and is
        placed now. As the live controller does (ReplicaScaler._start), a first replica with
        requests waiting takes only idle replicas at first; one that cannot time-shares a quiet
        device (_time_share) before it may take more; and only a first replica takes a kept one
        (share's rule, live alike), which a further replica took before, ranked by need here: on
        the saturated cluster at seed 3 a whisper-tiny function at 90 requests a second, quiet
        for one tick, lost both its replicas to other functions' needed ones and started again
        cold. A needed further replica takes busy headroom (live too:
        ReplicaScaler._further_ranks), headroom by its function's most need over the policy's
        delay window (lending.held_need over _needs; an ask by the need of now). Those held short
        are counted per function."""
        short, self._short = self._short, {}
        traffic, need = self._traffic_and_need()
        asks = []
        for fid, count in short.items():
            current = len(self.slots[fid])
            k = np.arange(current + 1, current + count + 1)
            ranks, values = self._ranks(np.full(count, fid), k, traffic, need)
            waiting = int(traffic[fid] * self.config.tick_s - self.tick_n[fid])
            asks += [Ask(self._demand(fid), r, v, waiting) for r, v in zip(ranks.tolist(), values.tolist())]
        top = max(a.rank for a in asks)
        holds = self._holds(now, traffic, held_need(need, self._needs, now, self._need_window_s), top)
        if self.config.time_share_busy > 0:
            firsts = {a.demand.replica: a for a in asks if a.rank == FLOOR}  # a function's first replica
            if firsts:
                shares = share(self.cluster, list(firsts.values()), [h for h in holds if h.rank == IDLE])
                self._grant(shares.grants, now)
                waiting = [h.demand for h in shares.short if firsts[h.demand.replica].waiting > 0]
                if waiting:  # each device's busy compute in the last tick, once: placing changes it not
                    busy = self._device_busy(now)
                    shared = {d.replica for d in waiting if self._time_share(d, now, busy)}
                else:
                    shared = set()
                left = {h.demand.replica for h in shares.short} - shared
                asks = [a for a in asks if a.demand.replica not in firsts or a.demand.replica in left]
        shares = share(self.cluster, asks, holds)
        self._grant(shares.grants, now)
        for fid in {self._fid_of[h.demand.function] for h in shares.short}:
            self.unplaceable += 1  # once per function and tick, as _start counts one
        for held in shares.short:
            self.held_short[held.demand.function] = self.held_short.get(held.demand.function, 0) + 1
            self.held_short_by_rank[RANKS[held.rank]] = self.held_short_by_rank.get(RANKS[held.rank], 0) + 1

    def _grant(self, grants, now: float) -> None:
        """Each grant placed now, its victims taken back first."""
        for grant in grants:
            fid = self._fid_of[grant.demand.function]
            for victim in grant.victims:
                loser = self._fid_of[victim.function]
                self._remove(loser, victim.replica, now)
                self.quiet[loser] = 0.0  # its policy is told at its next look
                self.takebacks[RANKS[victim.rank]] = self.takebacks.get(RANKS[victim.rank], 0) + 1
            self._place(fid, grant.demand, now)

    def _time_share(self, demand: Demand, now: float, busy: np.ndarray) -> bool:
        """A first replica placed beyond the compute of a device whose replicas are busy at most
        time_share_busy of it (SliceCluster.place_shared, with `busy`, each device's busy compute
        from the last tick: _device_busy), as ReplicaScaler._time_share places it; its device's
        replicas then share the compute (_stretch). Whether it was placed."""
        placed = self.cluster.place_shared(demand, self.config.time_share_busy, busy=busy)
        if isinstance(placed, Unplaceable):
            return False
        self._add_server(self._fid_of[demand.function], demand, placed, now)
        self.time_shared += 1
        self.time_shared_all += 1
        if self._shared_on is None:
            self._shared_on = np.ones(len(self._device_index))
        return True

    def _device_busy(self, now: float, scraped: bool = True) -> np.ndarray:
        """Per device, its ready replicas' duty in the last tick times their slice, summed, as
        ReplicaScaler._note_activity adds it up: e.g. two 1/8 replicas busy half the time,
        2 x 0.5 x 1/8 = 0.125 of the device. `scraped`: as a scrape reads it (at most 1, none
        for work no scrape saw: the busy time run in the tick, _observe); else the work the tick's
        requests brought, queued beyond it too."""
        srv = self.servers
        slots = np.flatnonzero(srv.alive & (srv.ready_at <= now))
        f = srv.fid[slots]
        ready = np.bincount(f, minlength=len(self.slots))
        busy = self.seen_busy if scraped else self.tick_busy
        duty = busy[f] / (ready[f] * self.config.tick_s)
        if scraped:
            duty = np.minimum(1.0, duty * self.tick_scraped[f])
        return np.bincount(srv.device[slots], weights=duty * srv.slice[slots], minlength=len(self._device_index))

    def _stretch(self, now: float) -> np.ndarray | None:
        """Per device, how much slower its replicas run in this tick for sharing its compute:
        where time-shared slices hold more than the device, the compute they asked of it in the
        last tick (_device_busy, at their own speed) over the device's, when over 1 (a fluid
        model: time slices interleave without cost; under 1 nobody waits), else 1. None while no
        device is time-shared. E.g. 9 x 1/8 replicas on one device, all busy the whole tick:
        9/8 = 1.125, each runs 12.5 % slower."""
        srv = self.servers
        alive = np.flatnonzero(srv.alive)
        held = np.bincount(srv.device[alive], weights=srv.slice[alive], minlength=len(self._device_index))
        shared = held > 1.0 + 1e-9
        if not shared.any():
            self._shared_on = None
            return None
        before = self._shared_on if self._shared_on is not None else np.ones(len(held))
        asked = self._device_busy(now, scraped=False) / before  # at the replicas' own speed
        self._shared_on = np.where(shared, np.maximum(1.0, asked), 1.0)
        return self._shared_on

    def _traffic_and_need(self) -> tuple[np.ndarray, np.ndarray]:
        """Per function, the requests per second of the last tick with those held, and the replicas
        that carry its work at the policy's max duty (busy seconds / (tick x duty), at least one
        while requests come). E.g. 0.45 s of service in a 1 s tick at duty 0.9: 1 replica; 2.0 s: 3.
        At a look between ticks (a function's first request, _hold_cold) those held are what the
        gateway holds then: the tick's requests come so far to functions with no replica ready,
        as well as those held before; so a replica another function's look started a moment
        earlier in the tick, its request waiting for it, is that function's floor, not idle."""
        dt = self.config.tick_s
        held = np.zeros(len(self.slots))
        for fid, waiting in self.held.items():
            held[fid] = len(waiting)
        if not self._in_tick and self._asking[0] >= 0:  # a look between ticks: its requests are not held yet
            fid, asking, now = self._asking
            if self._arriving is not None:
                a, f = self._arriving
                srv = self.servers
                ready = np.bincount(srv.fid[srv.alive & (srv.ready_at <= now)], minlength=len(self.slots))
                come = f[a <= now]
                held += np.bincount(come[ready[come] == 0], minlength=len(self.slots))
            held[fid] = max(held[fid], asking)
        traffic = (self.tick_n + held) / dt
        duty = getattr(getattr(self.policy, "config", None), "max_duty", DEFAULT_CONFIG.max_duty)
        return traffic, need_of(self.tick_busy / dt, duty, traffic > 0)

    def _ranks(self, fids: np.ndarray, k: np.ndarray, traffic: np.ndarray, need: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """The rank and value of the k-th replica (1 the first) of each of `fids`
        (lending.replica_rank, at the cold start the policy knows: measured once a replica of it
        was ready). A function without traffic ranks IDLE, value 0: a pre-warm fits
        only a free slice; an idle replica's value is its take-back cost (_holds)."""
        ranked = [replica_rank(kth, float(traffic[f]), float(need[f]), self._slice_of[f], self._cold[f],
                               float(self.slo_s[f]))
                  for kth, f in zip(k.tolist(), fids.tolist())]
        ranks = np.array([r for r, _ in ranked], dtype=np.int64)
        values = np.array([v for _, v in ranked], dtype=float)
        return ranks, values

    def _holds(self, now: float, traffic: np.ndarray, need: np.ndarray, below: int) -> list[Hold]:
        """What every placed replica serves, as lending.Hold, those ranked below `below` (no ask
        can take the rest). A function's replicas count in order: ready ones oldest first, then
        those starting, so the newest go first. One without traffic in the tick is idle: each
        of its replicas ranked by the cost of taking it (lending.takeback_cost: the chance of a
        request before the policy's keep-alive ends x its cold-start misses), IDLE under one late
        request and KEPT above (lending.idle_rank), as shoal up ranks an idle replica. Until
        2026-12-01 a function's further idle replicas ranked IDLE at that cost / k whatever the
        cost, so a busy function quiet for one tick lost them to any ask."""
        srv = self.servers
        slots = np.flatnonzero(srv.alive)
        f = srv.fid[slots]
        order = np.lexsort((srv.ready_at[slots], f))
        slots, f = slots[order], f[order]
        k = np.arange(len(f)) - np.searchsorted(f, f) + 1
        ranks, values = self._ranks(f, k, traffic, need)
        holds = []
        rate = self._rate_count / np.maximum(self._rate_seconds, 1.0)
        costs: dict[int, float] = {}
        for slot, fid, kth, r, v in zip(slots.tolist(), f.tolist(), k.tolist(), ranks.tolist(), values.tolist()):
            if r == IDLE:  # no traffic in the tick
                if fid not in costs:
                    spec = self.specs[fid]
                    costs[fid] = takeback_cost(Idle("", "", float(rate[fid]), float(self._active_at[fid]),
                                                    self.policy.keep_alive_s(fid, spec), self._cold[fid],
                                                    float(self.slo_s[fid])),
                                               now)[0]
                v = costs[fid]
                r = idle_rank(v)
            if r < below:
                holds.append(Hold(self.slot_replica[slot], self._names[fid], r, v))
        return holds


def _as_class(cls: type, value):
    """The dataclass `value` (a ScalingSpec, a PolicyConfig) as an instance of `cls`: its own
    class, or the same class compiled with the policy (native.POLICY_GROUP), the only one a
    compiled decide() takes, read as a struct. The compiled one is another class: not equal to,
    nor an instance of, the interpreted one, and it neither pickles nor copies; the simulator
    only reads it."""
    return value if type(value) is cls else cls(**{f.name: getattr(value, f.name) for f in fields(value) if f.init})


def _hist_quantile(hist: np.ndarray, q: float) -> float | None:
    total = hist.sum()
    if total == 0:
        return None
    index = int(np.searchsorted(np.cumsum(hist), q * total))
    upper = LAT_EDGES[min(index, len(LAT_EDGES) - 1)]
    return round(float(upper) * 1000.0, 3)


# ---------------------------------------------------------------------- scheduled baselines


def oracle_counts(trace: Trace, profiles: list[Profile], tick_s: float,
                  batcher: str = "rule") -> dict[int, dict[int, int]]:
    """Perfect foresight, no cold start: for every tick with requests, the fewest replicas
    with which every request of that tick (starting from idle replicas) meets its SLO and
    the tick's work fits in the tick, batches formed as SimConfig.batcher `batcher` forms them;
    zero in ticks without requests. {fid: {tick: replicas}}.
    E.g. 10 requests at once, 4 ms each, SLO 10 ms: 2 replicas finish the 5th at 20 ms, 4
    replicas finish the 3rd at 12 ms, 5 finish every one by 8 ms -> 5."""
    out: dict[int, dict[int, int]] = {}
    ticks = np.floor(trace.times / tick_s).astype(np.int64)
    order = np.argsort(trace.fids, kind="stable")
    fids, times, ticks = trace.fids[order], trace.times[order], ticks[order]
    bounds = np.flatnonzero(np.r_[True, (fids[1:] != fids[:-1]) | (ticks[1:] != ticks[:-1]), True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        fid, tick = int(fids[lo]), int(ticks[lo])
        out.setdefault(fid, {})[tick] = _fewest_replicas(times[lo:hi], profiles[fid], tick_s, batcher)
    return out


RELEASE_GAP_S = 1e-6  # between two held requests' sends: after one another, no measured length


def released_one_by_one(a: np.ndarray, f: np.ndarray, hop_of: np.ndarray, sent: np.ndarray,
                        first: np.ndarray):
    """Requests held for a cold start (those that came before their function's first replica was
    ready, at `first`), as shoal up's gateway releases them: when the replica is ready it wakes
    them in the order they came, and each is sent on by itself (serving/gateway.py), so they
    reach the replica one after another, RELEASE_GAP_S apart, and an idle replica's batcher (no
    queue delay) runs the first alone; the rest queue behind it. Live, the first batch after the
    cold start held 1, 2, 4 and 1 of 12 held requests in four runs (sl15c-sl15f,
    docs/simlive.md), where sending them all at one instant would make it a full batch. Each held
    request's wait counts as its hop (`hop_of`: its latency still counts from when it came, `a` -
    `hop_of`), and it is in flight from its send (`sent`). Returns (a, f, hop_of, sent) in the
    order they reach a replica. E.g. 3 held from 0.1, 0.2, 0.3 s, the replica ready at 0.5 s:
    sent at 0.5, 0.500001 and 0.500002 s. A replica ready exactly at a tick's start holds the
    requests before it as one ready within the tick does."""
    came = a - hop_of
    held = came < first[f]  # a function with no live replica has its requests held elsewhere (inf)
    if not held.any():
        return a, f, hop_of, sent
    idx = np.flatnonzero(held)
    idx = idx[np.lexsort((came[idx], f[idx]))]
    fh = f[idx]
    starts = np.r_[0, np.flatnonzero(fh[1:] != fh[:-1]) + 1]
    rank = np.arange(len(idx)) - np.repeat(starts, np.diff(np.r_[starts, len(idx)]))
    sent = sent.copy()
    sent[idx] = first[fh] + rank * RELEASE_GAP_S
    a = a.copy()
    a[idx] = sent[idx] + hop_of[idx]
    hop_of = hop_of.copy()
    hop_of[idx] = a[idx] - came[idx]
    by_time = np.argsort(a, kind="stable")
    return a[by_time], f[by_time], hop_of[by_time], sent[by_time]


@functools.lru_cache(maxsize=None)
def batch_seconds(latency_ms: tuple[tuple[int, float], ...], top: int) -> tuple[float, ...]:
    """A batch's seconds at 1 .. `top` rows on the reference slice, a profile's latency table
    (`latency_ms`) interpolated; computed once per table and size, for the simulator's replicas
    and the oracle's count alike. E.g. ((1, 40), (8, 120)) ms, top 3: (0.04, 0.0514, 0.0629)."""
    sizes = [float(b) for b, _ in latency_ms]
    secs = [ms / 1000.0 for _, ms in latency_ms]
    return tuple(np.interp(np.arange(1, top + 1, dtype=float), sizes, secs).tolist())


def serve_batched(times: list[float], frees: list[float], speeds: list[float], seconds: Sequence[float],
                  until: float = math.inf) -> tuple[list[int], list[float], list[float], list[float]]:
    """shoal up's batcher with no queue delay (serving/batch_loop.py), exactly: requests at `times`
    (ascending) queue in one FIFO; the replica that frees first (free at `frees`, running
    `speeds` times the reference) runs what is queued then, up to len(`seconds`) rows, a batch of
    b rows taking seconds[b - 1] x its speed; an idle one runs a request as it comes, with any that
    came at the same instant. One batch at a time per replica. Returns, per batch in order, its
    rows, its end and its seconds, and each replica's free time after. E.g. one replica free at 0,
    batches (1, 40 ms) and (8, 120 ms), arrivals at 0, 10, 20 and 30 ms: the first runs alone,
    done at 40 ms; the three queued by then run as one batch of 3, 40 + 2/7 x 80 = 62.9 ms, done
    at 102.9 ms. A batch that would start at or after `until` is not run: its requests and those
    after it (from sum(rows) on) are left to the caller, to run with what comes later (a batch
    that starts then takes requests that come by then). Pure: the simulator's replicas
    (Simulation._serve_batches) and the oracle's count (_fewest_replicas) both run it."""
    heap = [(free, k) for k, free in enumerate(frees)]
    heapq.heapify(heap)
    top, m, i = len(seconds), len(times), 0
    sizes: list[int] = []
    ends: list[float] = []
    busy: list[float] = []
    while i < m:
        free, k = heap[0]
        t = free if free > times[i] else times[i]
        if t >= until:
            break
        j = bisect.bisect_right(times, t, i, i + top if i + top < m else m)  # queued at t, up to top rows
        took = seconds[j - i - 1] * speeds[k]
        heapq.heapreplace(heap, (t + took, k))
        sizes.append(j - i)
        ends.append(t + took)
        busy.append(took)
        i = j
    after = list(frees)
    for free, k in heap:
        after[k] = free
    return sizes, ends, busy, after


def serve_routed(times: list[float], frees: list[float], readies: list[float], speeds: list[float],
                 seconds: Sequence[float], until: float = math.inf, pinned: Sequence[int] | None = None,
                 busy_rows: Sequence[int] | None = None, not_before: float = -math.inf
                 ) -> tuple[list[float], list[int], list[float], list[float], list[int], list[int], list[int]]:
    """shoal up's batcher behind shoal up's gateway (serving/gateway.py _pick): each request at
    `times` (ascending) goes at its arrival to the replica with the fewest outstanding (queued
    there, or in its running batch) among those ready (`readies`; none ready: the first to be),
    ties to the one that frees first, then the first (the gateway picks at random: a little
    kinder than live); or to `pinned[i]` (>= 0: routed before, a replica index). A replica busy
    from before the first arrival counts `busy_rows[k]` (its batch's rows; one when not given)
    outstanding until it frees; no batch starts before `not_before` (a request routed again
    after its replica went, the tick's start). A replica (free at `frees`, running `speeds`
    times the reference) runs what is queued at it when it frees, up to len(`seconds`) rows, a
    batch of b rows taking seconds[b - 1] x its speed; requests that come at one instant are
    routed before any batch starts then. A batch that would start at or after `until` is not
    run: its requests stay queued at their replica. Returns per request its batch's end, rows
    and its share of the batch's seconds (rows 0: not run), each replica's free time after, and
    the requests not run with the replica each waits at, and the rows of each replica's last
    batch. E.g. two replicas free at 0, batches (1, 40 ms) and (8, 120 ms), arrivals at 0, 0, 10
    and 20 ms: the first two run alone, one on each, done at 40 ms; the third goes to the first
    (one outstanding each, it frees no later), the fourth to the second: each alone from 40 ms,
    done at 80 ms (serve_batched's one queue: the first two as one batch of 2, done at 51.4 ms,
    the others alone on the second replica, at 50 and 90 ms). Pure."""
    n, m, top = len(frees), len(times), len(seconds)
    free = list(frees)
    running = [(busy_rows[k] if busy_rows is not None else 1) if m and frees[k] > times[0] else 0
               for k in range(n)]
    queues: list = [deque() for _ in range(n)]
    ends, rows, share = [math.nan] * m, [0] * m, [0.0] * m
    starts: list[tuple[float, int]] = []  # (when a replica may start a batch, replica)
    first_ready = min(range(n), key=lambda k: (readies[k], k))  # while none is ready
    # the pick as a heap of (outstanding, free, replica, version) over the ready replicas, each
    # replica's newest entry the one that counts; a change to its queue or its free time pushes a
    # new one, and so do its readiness and the end of its running batch (`readying`, `done`: seen
    # at the first arrival at or after them)
    version = [0] * n
    picks: list[tuple[int, float, int, int]] = []
    done: list[tuple[float, int]] = []
    readying = sorted((readies[k], k) for k in range(n))

    def rekey(k: int, t: float) -> None:
        version[k] += 1
        if readies[k] <= t:
            heapq.heappush(picks, (len(queues[k]) + (running[k] if free[k] > t else 0), free[k], k, version[k]))

    def start(k: int, t: float) -> None:
        b = min(top, len(queues[k]))
        took = seconds[b - 1] * speeds[k]
        for _ in range(b):
            i = queues[k].popleft()
            ends[i], rows[i], share[i] = t + took, b, took / b
        free[k], running[k] = t + took, b
        heapq.heappush(starts, (t + took, k))
        heapq.heappush(done, (t + took, k))
        rekey(k, t)

    for k in range(n):
        if running[k]:
            heapq.heappush(done, (free[k], k))
    readying.reverse()  # popped from the end, the earliest first

    i = 0
    if pinned is not None and m and not_before > times[0]:
        # requests pinned in an earlier tick that arrive before `not_before` (no batch starts
        # earlier) join their replicas' queues at once, in arrival order: a backlog carried across
        # ticks costs no loop; the first arrival after them rekeys every replica (`readying`)
        pin = np.asarray(pinned[:bisect.bisect_left(times, not_before)])
        lead = pin >= 0
        i = len(pin) if lead.all() else int(np.argmin(lead))
        if i:
            order = np.argsort(pin[:i], kind="stable")
            cuts = np.cumsum(np.bincount(pin[:i], minlength=n))[:-1]
            for k, queued in enumerate(np.split(order, cuts)):
                if len(queued):
                    queues[k].extend(queued.tolist())
                    heapq.heappush(starts, (max(free[k], readies[k], not_before), k))
    while True:
        t_arr = times[i] if i < m else math.inf
        if starts and starts[0][0] < t_arr:  # a replica frees (or may start) before the next arrival
            t, k = heapq.heappop(starts)
            if free[k] > t or not queues[k]:
                continue  # busy again already, or nothing waits at it
            if t >= until:
                continue
            start(k, t)
            continue
        if i >= m:
            break
        t = t_arr
        while readying and readying[-1][0] <= t:  # a replica became ready
            rekey(readying.pop()[1], t)
        while done and done[0][0] <= t:  # a batch ended: its rows no longer count
            end, k = heapq.heappop(done)
            if free[k] == end:
                rekey(k, t)
        if pinned is not None and pinned[i] >= 0:
            k = pinned[i]
        else:
            while picks and picks[0][3] != version[picks[0][2]]:
                heapq.heappop(picks)
            k = picks[0][2] if picks else first_ready
        queues[k].append(i)
        rekey(k, t)
        if len(queues[k]) == 1:  # else its next start is in `starts` already
            heapq.heappush(starts, (max(t, free[k], readies[k], not_before), k))
        i += 1
    left = [i for k in range(n) for i in queues[k]]
    at = [k for k in range(n) for _ in queues[k]]
    return ends, rows, share, free, left, at, running


def batch_size(rate: float, latency_s: Callable[[float], float], max_batch: int, fill: float = BATCH_FILL) -> int:
    """Rows per batch a dynamic batcher runs at `rate` requests per second on one replica:
    the smallest batch that keeps the replica at most `fill` occupied, within [1, max_batch].
    A batcher takes what is queued when its replica frees, so a load that would keep it
    busier than that builds a queue, and the queue makes the batches larger. The rule is
    b = ceil(rate x latency(b) / fill), iterated from 1 to its fixed point (latency grows
    with b, so the iteration only rises). E.g. ((1, 4), (8, 6), (32, 14)) ms at 250/s:
    ceil(250 x .004 / .8) = 2, lat(2) = 4.29 ms -> ceil(1.34) = 2: batch 2 (4.29 ms for 2
    rows, 54 % occupied; batch 1 would be 100 %). Simulation._service_times applies the
    same rule to every function at once."""
    b = 1
    for _ in range(max_batch):
        wanted = min(max_batch, max(b, math.ceil(rate * latency_s(b) / fill - 1e-9)))
        if wanted == b:
            break
        b = wanted
    return b


def _fewest_replicas(a: np.ndarray, profile: Profile, tick_s: float, batcher: str = "rule") -> int:
    n = len(a)
    slo = profile.slo_ms / 1000.0
    if batcher == "exact" and profile.max_batch > 1:
        # shoal up's batcher: more replicas make smaller batches, each request dearer, so whether c
        # replicas serve the tick need not hold for every larger c (e.g. 300 requests 1/300 s
        # apart on ((1, 40), (8, 120)) ms, SLO 200 ms: 9 replicas carry 8.91 s of batches in the
        # 1 s tick, 10 carry 10.06 s, 11 fit again): the fewest is found counting up from the
        # most rows a second of batches can carry (each row at its cheapest, a full batch's share)
        by_rows = batch_seconds(profile.latency_ms, profile.max_batch)
        if by_rows[0] > slo:
            return max(n, 1)  # a request alone is late: no count serves the tick in time
        times = a.tolist()
        cheapest = min(x / b for b, x in enumerate(by_rows, 1))
        c = max(1, math.ceil(n * cheapest / tick_s - 1e-9))
        while c < n:
            rows, ends, busy, _ = serve_batched(times, [-math.inf] * c, [1.0] * c, by_rows)
            # the tick's batches fit in the tick (no backlog carried into the next) and meet the SLO
            if sum(busy) <= c * tick_s + 1e-9 and float((np.repeat(ends, rows) - a).max()) <= slo:
                return c
            c += 1
        return max(n, 1)
    sizes = np.array([b for b, _ in profile.latency_ms], float)
    secs = np.array([m for _, m in profile.latency_ms]) / 1000.0
    meets = _meets_by_rule(a, profile, tick_s, sizes, secs)
    low = max(1, math.ceil(n * secs[0] / tick_s / profile.max_batch))
    if meets(low):
        return low
    high = low
    while high < n and not meets(high):
        low, high = high, min(n, high * 2)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid, high)
    return high


def _meets_by_rule(a: np.ndarray, profile: Profile, tick_s: float, sizes: np.ndarray, secs: np.ndarray
                   ) -> Callable[[int], bool]:
    """Whether c replicas serve the tick's requests `a` within the SLO, batches of batch_size's rule."""
    n = len(a)
    slo = profile.slo_ms / 1000.0

    def meets(c: int) -> bool:
        b = batch_size(n / c / tick_s, lambda x: float(np.interp(x, sizes, secs)), profile.max_batch)
        lat = float(np.interp(b, sizes, secs))
        s = lat / b
        if n * s > c * tick_s:
            return False  # more work than the tick holds: a backlog would carry into the next
        k = np.arange(n)
        g, r = k % c, k // c
        order = np.lexsort((r, g))
        v = a[order] - r[order] * s
        cm = np.maximum.accumulate(v + g[order] * BIG) - g[order] * BIG
        done = cm + (r[order] + 1) * s
        return float((done - a[order]).max()) + lat - s <= slo

    return meets


def oracle_policy(counts: dict[int, dict[int, int]]) -> Scheduled:
    """The oracle's counts as changes: a function's replicas exist only in its ticks with requests."""
    changes: dict[int, list[tuple[int, int]]] = {}
    for fid, per_tick in counts.items():
        previous, previous_tick = 0, -1
        for tick in sorted(per_tick):
            if previous and tick > previous_tick + 1:
                changes.setdefault(previous_tick + 1, []).append((fid, 0))  # idle ticks between: none held
                previous = 0
            if per_tick[tick] != previous:
                changes.setdefault(tick, []).append((fid, per_tick[tick]))
            previous, previous_tick = per_tick[tick], tick
        changes.setdefault(previous_tick + 1, []).append((fid, 0))
    return Scheduled("oracle", changes)


def static_policy(counts: dict[int, dict[int, int]]) -> Scheduled:
    """Provisioned for the peak: each function's largest oracle count, warm from the start."""
    return Scheduled("static", {0: [(fid, max(per_tick.values())) for fid, per_tick in counts.items()]})


class HeldMax(Scheduled):
    """held_max_policy's schedule; its starts take the profile's cold start."""

    final: dict[int, int]  # replicas each function holds at the end of the schedule

    def cold_start_s(self, profile: Profile) -> float:
        return profile.cold_start_s


def held_max_policy(counts: dict[int, dict[int, int]], initial: dict[int, int] | None = None,
                    factor: float = 1.0, window_ticks: int | None = None) -> HeldMax:
    """A yardstick for what reacting can do, not a policy to run: each function holds `factor`
    times the most replicas any past second needed (the oracle's count of a second, known at its
    end, so one tick late; rounded up), from `initial` on, never fewer, each start a cold start.
    It knows each past second's exact need, as no controller does; at factor 1 what it misses
    comes with a need larger than any before. E.g. counts 1, 3, 2, 5 at ticks 0..3 from 1: 3 from
    tick 2, 5 from tick 4; at factor 1.5: 2 from tick 1, 5 from tick 2, 8 from tick 4.
    With `window_ticks` W it remembers only the last W seconds (a sliding-window max, the
    window-max yardstick): it holds factor times the most any of them needed and scales down as
    that falls, from tick 1 on (`initial` until then: a warm start above the first second's
    need goes at once; a function with no counts goes to zero). E.g. the counts above (none
    after), W 2, from 1: 3 from tick 2, 5 from tick 4, 0 from tick 6 (ticks 4 and 5 needed
    none)."""
    if window_ticks is not None and window_ticks < 1:
        raise ValueError(f"window_ticks ({window_ticks}) must be >= 1")
    changes: dict[int, list[tuple[int, int]]] = {}
    final: dict[int, int] = {}
    for fid, per_tick in counts.items():
        held = (initial or {}).get(fid, 0)
        if window_ticks is None:
            for tick in sorted(per_tick):
                wanted = math.ceil(per_tick[tick] * factor - 1e-9)
                if wanted > held:
                    held = wanted
                    changes.setdefault(tick + 1, []).append((fid, held))
        else:
            need = np.zeros(max(per_tick, default=0) + window_ticks + 1)
            need[list(per_tick)] = list(per_tick.values())
            window: deque[tuple[int, float]] = deque()  # (tick, need), needs falling
            for tick, n in enumerate(need.tolist()):
                while window and window[0][0] <= tick - window_ticks:
                    window.popleft()
                while window and window[-1][1] <= n:
                    window.pop()
                window.append((tick, n))
                wanted = math.ceil(window[0][1] * factor - 1e-9)
                if wanted != held:
                    held = wanted
                    changes.setdefault(tick + 1, []).append((fid, held))
        final[fid] = held
    policy = HeldMax("held-max" if window_ticks is None else f"window-max {window_ticks}", changes)
    policy.final = final  # what each function holds at the end
    return policy


def forced_cold(trace: Trace, profiles: list[Profile], initial: dict[int, int], warmup_s: float = 0.0) -> int:
    """Requests at or after `warmup_s` that find their function cold under any policy that keeps
    no function warm before its first request: each function's first request, when `initial`
    starts it with no replica and its cold start is longer than its SLO (no look can start a
    replica before a request it has not seen). Only foresight, or holding every function warm
    from the start, avoids them."""
    fids, index = np.unique(trace.fids, return_index=True)  # times are sorted: the first of each
    return sum(1 for fid, t in zip(fids.tolist(), trace.times[index].tolist()) if t >= warmup_s
               and not initial.get(fid) and profiles[fid].cold_start_s > profiles[fid].slo_ms / 1000.0)


# ---------------------------------------------------------------------- runs


POLICIES = ("shoal", "shoal-fixed", "kpa", "kpa-tuned", "ray", "ray-tuned", "static", "oracle")
STARTS = ("warm", "cold")


def oracle_slice_seconds(counts: dict[int, dict[int, int]], profiles: list[Profile], config: SimConfig) -> float:
    """The oracle's replica-slice-seconds after the warm-up: each second's count on its function's
    slice (what `vs_oracle` divides by)."""
    warm = round(config.warmup_s / config.tick_s)
    return sum(c * profiles[fid].slice_fraction * config.tick_s
               for fid, per in counts.items() for tick, c in per.items() if tick >= warm)


def warm_start(trace: Trace, profiles: list[Profile], counts: dict[int, dict[int, int]] | None = None,
               duty: float = 0.7) -> dict[int, int]:
    """Replicas each function starts with, the same for every reactive policy, as if it had
    been running: the oracle's count for its first second with requests / 0.7, rounded up
    (without counts: mean rate x batch-1 latency / 0.7); none for a function under one
    request a minute (it starts cold, as in production)."""
    rates = trace.rates if trace.rates is not None else trace.counts() / trace.duration_s
    out = {}
    for fid, rate in enumerate(np.asarray(rates, float).tolist()):
        if rate < 1 / 60:
            continue
        if counts is not None and counts.get(fid):
            first = counts[fid][min(counts[fid])]
        else:
            first = rate * profiles[fid].latency_ms[0][1] / 1000.0
        out[fid] = max(1, math.ceil(first / duty - 1e-9))
    return out


def assign_profiles(trace: Trace, seed: int = 0, profiles: tuple[Profile, ...] = PROFILES) -> list[Profile]:
    rng = np.random.default_rng(seed + 7919)
    return [profiles[i] for i in rng.integers(0, len(profiles), len(trace.functions))]


def simulate(trace: Trace, policies: list[str], config: SimConfig = SimConfig(), seed: int = 0,
             profiles: list[Profile] | None = None, shoal_config: PolicyConfig = DEFAULT_CONFIG,
             start: str = "warm", extra: dict[str, Callable[[list[Profile]], SimPolicy]] | None = None) -> dict:
    """Run every policy on the same trace and functions; the JSON-ready comparison. `start`:
    every reactive policy begins "warm" (warm_start's replicas, as if it had been running) or
    "cold" (every function at zero); the scheduled baselines follow their schedules. `extra`:
    more policies by name, each made from the profiles (e.g. a baseline at another setting:
    loadtests/bench/frontier.py), run as the named ones, after them."""
    extra = extra or {}
    clash = [name for name in extra if name in POLICIES]
    if clash:
        raise ValueError(f"extra policy {clash[0]!r} has the name of a built-in one")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}: expected one or more of {', '.join(POLICIES)}")
    if start not in STARTS:
        raise ValueError(f"start ({start!r}) must be one of {', '.join(STARTS)}")
    profiles = profiles if profiles is not None else assign_profiles(trace, seed)
    counts = oracle_counts(trace, profiles, config.tick_s, config.batcher)
    makers: dict[str, Callable[[], SimPolicy]] = {
        "shoal": lambda: ShoalPolicy(shoal_config),
        "shoal-fixed": lambda: ShoalPolicy(replace(shoal_config, slice_hints=False), name="shoal-fixed"),
        "kpa": kpa_policy, "ray": ray_policy,
        "kpa-tuned": lambda: kpa_tuned_policy(profiles), "ray-tuned": lambda: ray_tuned_policy(profiles),
        "static": lambda: static_policy(counts), "oracle": lambda: oracle_policy(counts),
    }
    for name, make in extra.items():
        makers[name] = functools.partial(make, profiles)
    initial = warm_start(trace, profiles, counts) if start == "warm" else None
    records = {}
    for name in [*policies, *extra]:
        made = makers[name]()
        records[name] = Simulation(trace, profiles, made, config, initial if made.reactive else None).run()
    oracle = oracle_slice_seconds(counts, profiles, config)
    for record in records.values():
        record["oracle_replica_slice_seconds"] = round(oracle, 3)
        record["vs_oracle"] = round(record["replica_slice_seconds"] / oracle, 3) if oracle else None
    mix: dict[str, int] = {}
    for p in profiles:
        mix[p.name] = mix.get(p.name, 0) + 1
    return {
        "policies": records,
        "trace": trace.summary(),
        "cluster": {"gpus": config.gpus, "gpu_memory_mib": config.gpu_memory_mib, "tick_s": config.tick_s,
                    "timeout_s": config.timeout_s, "warmup_s": config.warmup_s, "start": start, "profiles": mix,
                    "batcher": config.batcher, "routing": config.routing if config.batcher == "exact" else None,
                    "note": "simulated GPUs and simulated latency profiles: no figure here is a GPU measurement"},
    }
