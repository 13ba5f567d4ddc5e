"""The compiled pass of decide() (autoscaler/policy_kernel.py) against decide() itself.

Every look the kernel commits must be decide()'s answer (the count, the reason) and leave
decide()'s state, field by field and bit for bit; every other look it must leave alone.
Looks come from seeded random walks of one function (counts, traffic, silences, timers,
batch tables, clock steps) under several configs, and from whole simulations."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from autoscaler import policy_kernel as K
from autoscaler import simulator as S
from autoscaler.metrics import MetricsSnapshot
from autoscaler.policy import Budget, PolicyConfig, PolicyState, decide, quiet_until
from autoscaler.traces import make_trace
from functions.spec import ScalingSpec

TABLES = ((), ((1.0, 0.004), (8.0, 0.006), (32.0, 0.014)), ((1.0, 0.02), (4.0, 0.05)))
CONFIGS = (
    PolicyConfig(),
    PolicyConfig(concurrency_window_s=0.0, keep_alive_max_s=0.0),
    PolicyConfig(dispersion_window_s=0.0, burst_window_s=40.0),  # a burst window longer than the delay window
    PolicyConfig(scale_down_delay_s=5.0, trend_window_s=8.0, budget_window_s=4.0, budget_clean_windows=2,
                 gaps_min=2, onset_gap_s=6.0, slice_window_s=20.0, periodic_keep_s=3.0),
    # windows of 0 s, at wall-clock times where now - 0 - EPS rounds to now (policy.window_start)
    PolicyConfig(burst_window_s=0.0, scale_down_delay_s=0.0, trend_window_s=0.0),
)
STARTS = (100.0, 100.0, 100.0, 100.0, 1.7e9)


def _spec(rng: np.random.Generator) -> ScalingSpec:
    low = int(rng.choice([0, 0, 0, 1, 2]))
    return ScalingSpec(min_replicas=low, max_replicas=int(rng.integers(max(1, low), 12)),
                       slo_p95_ms=float(rng.choice([20.0, 100.0, 400.0])), target_duty=float(rng.uniform(0.5, 0.9)),
                       target_concurrency=float(rng.choice([1.0, 2.0, 4.0])),
                       idle_to_zero_s=float(rng.choice([0.0, 5.0, 30.0, 60.0])))


def _looks(rng: np.random.Generator, steps: int, start: float = 100.0):
    """(now, snapshot) of one function, as a generator that is sent each look's decision:
    its replicas follow the decisions (new ones start, then turn ready; now and then one
    fails or one comes that was not asked for), its traffic wanders around its own level with silences (regular ones: a
    timer), the clock steps by 0 to 3 s, and now and then the same time comes twice or
    the clock steps back."""
    now, ready, starting = start, int(rng.integers(0, 4)), 0
    period = float(rng.choice([0.0, 8.0, 25.0]))  # a timer's period, or none
    table = TABLES[int(rng.integers(len(TABLES)))]
    level = float(rng.lognormal(3.0, 1.5))  # the function's usual requests per second
    for step in range(steps):
        u = rng.random()
        now += 0.0 if u < 0.03 else -0.5 if u < 0.04 else float(rng.choice([0.5, 1.0, 1.0, 1.0, 3.0]))
        if period and step % 12 == 11:
            now += period + float(rng.normal(0.0, 0.05))
        if starting and rng.random() < 0.4:
            ready, starting = ready + 1, starting - 1
        if ready and rng.random() < 0.02:
            ready -= 1
        if rng.random() < 0.02:  # one it did not ask for (left from an earlier revision): over max_replicas too
            ready += 1
        idle = rng.random() < 0.2 or (period and step % 12 > 6)
        rps = 0.0 if idle else level * float(rng.lognormal(0.0, 0.4))
        service = float(rng.uniform(0.001, 0.05)) if rps else None
        duty = min(1.0, rps * service / max(1, ready)) if rps else float(rng.choice([0.0, 0.01]))
        u = rng.random()  # now and then a scrape short of a replica, or with one that is no longer ready
        shown = max(0, ready - 1) if u < 0.05 else ready + 1 if u < 0.08 else ready
        decision = yield now, MetricsSnapshot(
            "f", now, ready=ready, starting=starting, inflight=0.0 if idle else float(rng.exponential(3.0)),
            activator_queue=int(rng.choice([0, 0, 0, 5, 40])) if ready == 0 else 0,
            duty=(duty,) * shown, rps=rps,
            p95_s=float(rng.uniform(0.001, 0.6)) if rps and rng.random() < 0.8 else None,
            cold_start_s=float(rng.choice([1.0, 8.0])) if rng.random() < 0.7 else None,
            slice_fraction=float(rng.choice([0.125, 0.25, 1.0])) if rng.random() < 0.9 else None,
            service_s=service, batch_latency_s=table if rng.random() < 0.9 else (),
            over_slo=float(rng.choice([0.0, 0.0, 0.0005, 0.02])) if rps else 0.0,
            window_s=float(rng.choice([0.0, 1.0, 1.0, 30.0])))
        change = decision.desired - ready - starting
        if change > 0:
            starting += change
        elif change < 0:  # a scale-down stops starting replicas first
            stop = min(starting, -change)
            starting, ready = starting - stop, ready + change + stop


def _check(arrays, specs, spec, state, snapshot, now, config, codes: Counter) -> tuple:
    """One look both ways; the state decide() leaves."""
    decision, after = decide(snapshot, spec, state, now, config)
    arrays.put(0, state)
    rows = K.snapshot_rows([snapshot], [spec], config)
    lead = snapshot.cold_start_s if snapshot.cold_start_s is not None else 3.0
    desired, code, quiet = arrays.decide(np.array([0]), now, specs=specs, lead_s=np.array([lead]), **rows)
    code = int(code[0])
    codes[code] += 1
    if code == K.FALLBACK:
        assert arrays.get(0) == state, "a look handed back must leave the state as it was"
        return after, decision
    current = snapshot.ready + snapshot.starting
    assert (int(desired[0]), K.CODES[code], None) == (decision.desired, decision.reason, decision.slice_fraction)
    assert decision.desired == current
    assert arrays.get(0) == after
    idle = snapshot.demand == 0 and snapshot.rps == 0 and not snapshot.starting
    assert quiet[0] == (quiet_until(after, spec, current, now, lead, config) if idle else 0.0)
    return after, decision


@pytest.mark.parametrize("config, start", zip(CONFIGS, STARTS),
                         ids=["default", "no-averaging", "long-burst", "short-windows", "zero-windows-wall-clock"])
def test_committed_looks_are_decides_own(config, start):
    """120 functions x 150 looks per config: every committed look equals decide(). The
    counts of each code show both paths ran: a kernel that handed every look back, or
    never held a count with HOLD, COLD_START or FORECAST, fails here."""
    rng = np.random.default_rng(7)
    codes: Counter = Counter()
    for _ in range(120):
        spec = _spec(rng)
        arrays = K.PolicyArrays(1, config, needs_capacity=int(rng.choice([4, 64])))
        specs = K.spec_rows([spec])
        state = PolicyState()
        looks = _looks(rng, 150, start)
        now, snapshot = next(looks)
        while True:
            state, decision = _check(arrays, specs, spec, state, snapshot, now, config, codes)
            try:
                now, snapshot = looks.send(decision)
            except StopIteration:
                break
    assert codes[K.STABLE] > 1000 and codes[K.FALLBACK] > 100, codes
    assert min(codes[K.COLD_START], codes[K.FORECAST]) > 20, codes
    assert codes[K.HOLD] > 20 or config.scale_down_delay_s == 0, codes  # no delay: nothing to hold for


def shadow_run(kind: str, seconds: float, functions: int, gpus: int, seed: int = 0) -> Counter:
    """A simulation with decide() alone in which every look, from the state decide() had
    before it, also goes through the kernel and is checked as in the walks above; the codes
    the kernel gave. Also from the command line, at the scale run's size:
    python -c "from tests.unit.test_policy_kernel import shadow_run; print(shadow_run('azure', 300.0, 10000, 1000))"
    """
    trace = make_trace(kind, functions=functions, seconds=seconds, seed=seed)
    profiles = S.assign_profiles(trace, seed)
    policy = S.ShoalPolicy(compiled=False)
    sim = S.Simulation(trace, profiles, policy, S.SimConfig(gpus=gpus), S.warm_start(trace, profiles))
    arrays = K.PolicyArrays(1, policy.config)
    codes: Counter = Counter()
    decide_one = policy.decide

    def both(fid, snapshot, spec, now):
        before = policy.states.get(fid)
        if before is None:
            codes["first look"] += 1
        else:
            _check(arrays, K.spec_rows([spec]), spec, before, snapshot, now, policy.config, codes)
        return decide_one(fid, snapshot, spec, now)

    policy.decide = both
    sim.run()
    return codes


def test_each_look_of_a_simulation():
    codes = shadow_run("azure", 150.0, 300, 40)
    assert codes[K.STABLE] > 2000 and codes[K.FALLBACK] > 50 and codes[K.COLD_START] > 10, codes


def test_the_first_look_and_a_clock_step_back_go_to_decide():
    config = PolicyConfig()
    spec = ScalingSpec()
    arrays = K.PolicyArrays(1, config)
    snapshot = MetricsSnapshot("f", 10.0, ready=1, duty=(0.5,), rps=10.0, service_s=0.01, window_s=1.0)
    look = dict(specs=K.spec_rows([spec]), lead_s=np.array([2.0]), **K.snapshot_rows([snapshot], [spec], config))
    _, code, _ = arrays.decide(np.array([0]), 10.0, **look)
    assert code[0] == K.FALLBACK and arrays.get(0) is None  # no state yet: decide() starts it
    _, state = decide(snapshot, spec, PolicyState(), 10.0, config)
    arrays.put(0, state)
    _, code, _ = arrays.decide(np.array([0]), 9.0, **look)  # before its last look
    assert code[0] == K.FALLBACK and arrays.get(0) == state
    _, code, _ = arrays.decide(np.array([0]), 11.0, **look)
    assert code[0] == K.STABLE and arrays.get(0) == decide(snapshot, spec, state, 11.0, config)[1]


def test_needs_out_of_order_stay_with_decide():
    """A state whose needs are not in time order (a clock stepped back under decide())
    is decide()'s alone: the kernel's trimming assumes order."""
    arrays = K.PolicyArrays(2, PolicyConfig())
    state = PolicyState(last_active_at=5.0, needs=((5.0, 1.0), (4.0, 2.0)), rate_avg=1.0, inflight_avg=0.0,
                        rate_at=5.0, budget=Budget(0.0), peak=(4.0, 2.0))
    arrays.put(1, state)
    assert arrays.get(1) == state
    assert arrays.numbers[1, K.KIND] == K.SCALAR_ONLY
    snapshot = MetricsSnapshot("f", 6.0, ready=1, duty=(0.5,), rps=10.0, service_s=0.01, window_s=1.0)
    _, code, _ = arrays.decide(np.array([1]), 6.0, specs=K.spec_rows([ScalingSpec()] * 2), lead_s=np.array([2.0]),
                               **K.snapshot_rows([snapshot], [ScalingSpec()], PolicyConfig()))
    assert code[0] == K.FALLBACK and arrays.get(1) == state


@pytest.mark.parametrize("state", [
    PolicyState(),
    PolicyState(last_active_at=3.0, needs=((1.0, 0.5), (2.0, 1.25), (3.0, 2.0)), onsets=(0.0, 30.0, 61.0),
                duty_avg=0.4, duty_since=1.0, duty_last=3.0, slice_fraction=0.5, slice_at=2.0, rate_avg=12.5,
                inflight_avg=0.3, rate_at=3.0, budget=Budget(0.0, 2, 1, 0.004), served=40.0, served_over=0.5,
                forecast=(2.0, 3.5), gaps=(25.0, 31.0), gap_quantiles=(25.0, 31.0), rate_var=7.5, rps_last=12.0,
                peak=(3.0, 2.0), rps_last_at=3.0),
])
def test_put_then_get_is_the_same_state(state):
    arrays = K.PolicyArrays(3, PolicyConfig(gaps_min=2), needs_capacity=2)  # grows for three needs
    arrays.put(2, state)
    assert arrays.get(2) == state
    assert arrays.get(0) is None and arrays.get(1) is None


def test_states_longer_than_the_config_keeps_are_refused():
    arrays = K.PolicyArrays(1, PolicyConfig(onsets_kept=3))
    with pytest.raises(ValueError, match="4 onsets"):
        arrays.put(0, PolicyState(onsets=(1.0, 2.0, 3.0, 4.0)))


def _run(trace, compiled: bool, functions: int, gpus: int):
    profiles = S.assign_profiles(trace, 0)
    policy = S.ShoalPolicy(compiled=compiled)
    calls = Counter()
    decide_one = policy.decide

    def counted(*args):
        calls["decide"] += 1
        return decide_one(*args)

    policy.decide = counted
    sim = S.Simulation(trace, profiles, policy, S.SimConfig(gpus=gpus, tick_s=1.0), S.warm_start(trace, profiles))
    record = sim.run()
    return {k: v for k, v in record.items() if "wall" not in k}, calls["decide"], policy


@pytest.mark.parametrize("kind, options, gpus", [
    ("azure", dict(functions=300, seconds=150.0), 40),
    ("gamma", dict(functions=4, seconds=120.0, rate=300.0, cv=4.0), 8),
])
def test_whole_runs_are_the_same_compiled_or_not(kind, options, gpus):
    """The simulator with the compiled pass gives the reference's record, every number of
    it, while decide() itself runs for a small share of the looks."""
    trace = make_trace(kind, seed=3, **options)
    compiled, looks_in_python, policy = _run(trace, True, options["functions"], gpus)
    reference, looks, _ = _run(trace, False, options["functions"], gpus)
    assert compiled == reference
    assert looks_in_python < looks / 3, (looks_in_python, looks)
    assert policy.arrays is not None
    assert sum(policy.state_of(f) is not None for f in range(options["functions"])) > 0


def test_a_policy_carries_its_states_into_a_second_simulation():
    """As decide() alone does (its states dict): a second prepare() keeps what the first run learned."""
    trace = make_trace("gamma", functions=3, seconds=40.0, seed=1, rate=50.0, cv=2.0)
    profiles = S.assign_profiles(trace, 0)
    records, states = {}, {}
    for compiled in (True, False):
        policy = S.ShoalPolicy(compiled=compiled)
        for _ in range(2):
            sim = S.Simulation(trace, profiles, policy, S.SimConfig(gpus=8), S.warm_start(trace, profiles))
            record = sim.run()
        records[compiled] = {k: v for k, v in record.items() if "wall" not in k}
        states[compiled] = [policy.state_of(f) for f in range(3)]
    assert records[True] == records[False] and states[True] == states[False]


def test_config_vector_follows_the_config():
    config = PolicyConfig(max_spare=3, burst_window_s=9.0)
    vector = K.config_vector(config)
    assert vector[K.C_MAX_SPARE] == 3 and vector[K.C_BURST] == 9.0
    assert vector[K.C_KEPT] == config.kept_s == 30.0 and vector[K.C_Z] == config.burst_z
    assert len(K.CONFIG) == len(vector) and all(math.isfinite(x) for x in vector)
