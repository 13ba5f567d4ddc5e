"""A tick's looks at many functions in one call: each function's `MetricsSnapshot` from the
numbers the tick measured, `policy.decide()`, its new state kept, and when an idle function may
be left alone (`policy.quiet_until`). Pure: no I/O, no clock. The simulator asks it once a
tick; `autoscaler.native` compiles it with policy.py in one mypyc group, so that each look is
a native call of the one decide(), and interpreted it is the reference. It imports only the
policy and its inputs, never the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import DEFAULT_CONFIG, PolicyConfig, PolicyState, ScaleDecision, decide, quiet_until
from functions.spec import ScalingSpec


class Tick(NamedTuple):
    """What one tick measured of the functions looked at, one entry per function, in order."""

    fids: list[int]
    ready: list[int]
    replicas: list[int]  # ready and starting
    inflight: list[float]  # requests inside replicas, on average over the tick
    duty: list[float]  # of each ready replica
    rps: list[float]
    p95_s: list[float]  # NaN: nothing answered
    service_s: list[float]  # NaN: nothing answered
    over_slo: list[float]
    answered_rps: list[float]  # the gateway's: answered and timed out while held, per second
    now: float
    window_s: float  # the tick


class Functions(NamedTuple):
    """What the simulator keeps of every function, indexed by function id."""

    names: Sequence[str]
    specs: list[ScalingSpec]
    cold_start_s: list[float]
    slice_fraction: list[float]  # the slice new replicas get
    deployed_slice: list[float]  # the slice each function's profile declares
    batch_latency_s: list[tuple[tuple[float, float], ...]]
    held: dict[int, list[float]]  # arrival times of the requests held at the gateway, for those with any


def snapshot_of(tick: Tick, i: int, functions: Functions) -> MetricsSnapshot:
    """The snapshot of the tick's i-th function, as the controller would read it at the end
    of the tick (its held requests and replicas as they are then)."""
    fid, ready = tick.fids[i], tick.ready[i]
    p95, service = tick.p95_s[i], tick.service_s[i]
    held = functions.held.get(fid)
    return MetricsSnapshot(
        functions.names[fid], tick.now, ready=ready, starting=tick.replicas[i] - ready, inflight=tick.inflight[i],
        activator_queue=len(held) if held is not None else 0, duty=(tick.duty[i],) * ready, rps=tick.rps[i],
        p95_s=None if math.isnan(p95) else p95, cold_start_s=functions.cold_start_s[fid],
        slice_fraction=functions.slice_fraction[fid], deployed_slice=functions.deployed_slice[fid],
        service_s=None if math.isnan(service) else service,
        batch_latency_s=functions.batch_latency_s[fid], over_slo=tick.over_slo[i],
        answered_rps=tick.answered_rps[i], window_s=tick.window_s)


class Looked(NamedTuple):
    """A look whose decision the caller must act on: its count or slice changes, or it has no
    replica (a pre-warm may be due)."""

    fid: int
    snapshot: MetricsSnapshot
    decision: ScaleDecision


def look_each(tick: Tick, functions: Functions, states: dict[int, PolicyState],
              config: PolicyConfig = DEFAULT_CONFIG) -> tuple[list[Looked], list[float]]:
    """decide() for each function of the tick, its state kept in `states`. Returns the looks
    to act on, and per function until when it may be left alone: for one idle (nothing in
    flight, held or answered, none starting) whose count stays, policy.quiet_until (the caller
    looks again sooner if a request arrives, is answered or runs); else 0
    (look again next tick; for the looks to act on, the caller decides once it has acted)."""
    acted: list[Looked] = []
    quiet: list[float] = []
    now = tick.now
    for i in range(len(tick.fids)):
        fid, current = tick.fids[i], tick.replicas[i]
        snapshot = snapshot_of(tick, i, functions)
        spec = functions.specs[fid]
        state = states.get(fid)
        decision, state = decide(snapshot, spec, PolicyState() if state is None else state, now, config)
        states[fid] = state
        if decision.desired != current or decision.slice_fraction is not None or current == 0:
            acted.append(Looked(fid, snapshot, decision))
            quiet.append(0.0)
        elif snapshot.rps == 0 and snapshot.demand == 0 and not snapshot.starting:
            quiet.append(quiet_until(state, spec, current, now, functions.cold_start_s[fid], config))
        else:
            quiet.append(0.0)
    return acted, quiet
