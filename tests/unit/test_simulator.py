"""The cluster simulator (autoscaler/simulator.py) and `shoal simulate` (deploy/cli/simulate.py).

Table-driven on tiny hand-made traces; expected latencies carry their arithmetic. Unless
a case says otherwise: one function "f0" with profile P10 = batch-1 latency 10 ms on its
reference slice (0.25 of a GPU, so speed 1), no cold start, SLO 1 s; SimConfig(gpus=1),
1-s ticks, 60-s timeout. Latencies are read exactly by a Simulation subclass that records
what `_account` is given; the record's p50/p95/p99 come from a log histogram whose bins
are 10^(1/50) = 4.7 % wide and report a bin's upper edge, so they are compared as
true <= reported < true x 1.0471.

Accounting invariant (from run(), _hold_cold, _expire_held, _reset_counts, _account):
every counted request is either served in the tick it is released (counted in `served`;
also in `timed_out` when its latency is over timeout_s), expires while held (timed_out),
or is still held at the end (timed_out). Hence
    requests == served + timed_out - (served with latency > timeout_s),
    hist.sum() == served, within_slo <= served <= requests,
and, after a warm-up, requests == (trace requests at or after warmup_s) + (held then)."""

from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler import simulator as S
from autoscaler.policy import ScaleDecision
from autoscaler.simulator import (
    POLICIES,
    PROFILES,
    RELEASE_GAP_S,
    Profile,
    Scheduled,
    ShoalPolicy,
    SimConfig,
    Simulation,
    _fewest_replicas,
    kpa_policy,
    oracle_counts,
    oracle_policy,
    ray_policy,
    released_one_by_one,
    simulate,
    static_policy,
    warm_start,
)
from autoscaler.traces import Trace, make_trace
from deploy.cli import simulate as cli

BIN = 10 ** (1 / 50)  # histogram bin width ratio (4.7 %)
P10 = Profile("p10", ((1, 10.0),), 0.25, 0.25, cold_start_s=0.0, slo_ms=1000)
TOL = 1e-9


class Recording(Simulation):
    """Records every served latency (seconds) and its function; forgets them at the warm-up
    boundary, as the simulation forgets its counts."""

    instances: list[Recording] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latencies: list[float] = []
        self.lat_fids: list[int] = []
        self.paths: list[str] = []
        self.held_at_reset: int | None = None
        Recording.instances.append(self)

    def _account(self, f, latency, s, n_f):
        self.latencies.extend(latency.tolist())
        self.lat_fids.extend(f.tolist())
        super()._account(f, latency, s, n_f)

    def _reset_counts(self):
        self.held_at_reset = sum(len(v) for v in self.held.values())
        self.latencies, self.lat_fids = [], []
        super()._reset_counts()

    def _serve_interleaved(self, *args):
        self.paths.append("interleaved")
        return super()._serve_interleaved(*args)

    def _serve_one_by_one(self, *args):
        self.paths.append("one_by_one")
        return super()._serve_one_by_one(*args)


class OneByOne(Recording):
    """The reference: every function served one request at a time from a heap."""

    def _serve_interleaved(self, a, f, t0, slots, offset, service, latency_extra):
        return self._serve_one_by_one(a, f, slots, offset, service, latency_extra)


def trace_of(times, fids=None, duration=2.0, functions=1) -> Trace:
    times = np.asarray(times, float)
    fids = np.zeros(len(times), np.int32) if fids is None else np.asarray(fids, np.int32)
    return Trace(kind="csv", duration_s=duration, functions=tuple(f"f{i}" for i in range(functions)),
                 times=times, fids=fids, params={})


def ms(values) -> list[float]:
    return sorted(v * 1000.0 for v in values)


def check_quantile(reported_ms, latencies_s, q):
    """The record's quantile is the upper edge of the bin holding sorted[ceil(q n) - 1]."""
    true = sorted(latencies_s)[math.ceil(q * len(latencies_s)) - 1] * 1000.0
    assert true - 1e-3 <= reported_ms < true * BIN + 1e-3, (reported_ms, true)


class Starting(Scheduled):
    """A scheduled baseline whose replicas take `cold` seconds to become ready."""

    def __init__(self, changes, cold):
        super().__init__("starting", changes)
        self.cold = cold

    def cold_start_s(self, profile):
        return self.cold


def lazy_policy(start_at: float) -> S._Reactive:
    """Reactive, but keeps a function at zero until `start_at`, then asks for 1 replica."""
    def step(snapshot, spec, state, now):
        return ScaleDecision(1 if now >= start_at else 0, "LAZY"), state

    return S._Reactive("lazy", step, lambda: None)


# ---------------------------------------------------------------------- 1. exact serving

SERVE_CASES = [
    # id, arrivals (s), replicas, profile, expected latencies (ms)
    # 4 at once on 2 replicas of 10 ms: two finish at 10, the next two queue behind them: 20
    ("4-at-once-on-2", [0, 0, 0, 0], 2, P10, [10, 10, 20, 20]),
    # 3 at once on 1: 10, 20, 30
    ("3-at-once-on-1", [0, 0, 0], 1, P10, [10, 20, 30]),
    # 1 replica: t=0 done .010; t=.005 waits to .010, done .020 (15); t=.1 idle again (10)
    ("queue-then-idle", [0, 0.005, 0.1], 1, P10, [10, 15, 10]),
    # 2 replicas: 0,0 -> done 10,10; .005,.005 wait until .010, done .020: 15, 15
    ("second-round-waits", [0, 0, 0.005, 0.005], 2, P10, [10, 10, 15, 15]),
    # a half-GPU slice of a profile measured on a quarter: speed 0.25/0.5 -> 5 ms; 5, 10
    ("bigger-slice-faster", [0, 0], 1, Profile("half", ((1, 10.0),), 0.5, 0.25, cold_start_s=0.0, slo_ms=1000),
     [5, 10]),
    # batching: 200 at once on 1 replica of ((1,10),(8,20)) ms. batch_size, fill 0.8: b = ceil(200/s x
    # lat(b) / 0.8), b0=1: ceil(200 x .010 / .8)=3, lat(3)=90/7=12.86; ceil(200 x .01286 / .8)=ceil(3.21)=4,
    # lat(4)=100/7=14.29 ms; ceil(3.57)=4: the tick's batch is 4. Request k has k queued ahead of it, so
    # it rides in a batch of max(4, k + 1) rows up to 8 (see BACKLOG_BATCHES)
    ("batch-of-4-then-backlog", [0] * 200, 1,
     Profile("b", ((1, 10.0), (8, 20.0)), 0.25, 0.25, cold_start_s=0.0, slo_ms=1000), "BACKLOG_BATCHES"),
]


def _backlog_batches() -> list[float]:
    """The batch-of-4-then-backlog case: batch b takes L(b) = 10 + (b - 1) x 10/7 ms, a request
    occupies s(b) = L(b) / b of it. Requests 0-3 ride in batches of 4 (s = 25/7 ms), 4, 5, 6
    in batches of 5, 6, 7, the rest in batches of 8 (20 ms, s = 2.5 ms). Request k is done
    when the occupancies of 0..k are, and waits out the rest of its batch: sum s(b_i) + L(b_k)
    - s(b_k). E.g. k = 0: 25/7 + 75/7 = 14.29 ms; k = 199: 4 x 25/7 + s(5) + s(6) + s(7) +
    193 x 2.5 + 17.5 ms."""
    def lat(b):
        return 10 + (b - 1) * 10 / 7

    out, done = [], 0.0
    for k in range(200):
        b = min(8, max(4, k + 1))
        done += lat(b) / b
        out.append(done + lat(b) - lat(b) / b)
    return out


@pytest.mark.parametrize("arrivals, replicas, profile, expected",
                         [c[1:] for c in SERVE_CASES], ids=[c[0] for c in SERVE_CASES])
def test_serving_is_exact(arrivals, replicas, profile, expected):
    if expected == "BACKLOG_BATCHES":
        expected = _backlog_batches()
    sim = Recording(trace_of(arrivals), [profile], static_policy({0: {0: replicas}}), SimConfig(gpus=1))
    record = sim.run()
    assert ms(sim.latencies) == pytest.approx(sorted(expected), abs=1e-6)
    assert sim.paths == ["interleaved"]  # idle identical servers: the vectorized path
    assert record["requests"] == record["served"] == len(arrivals) and record["timed_out"] == 0
    assert int(sim.hist.sum()) == len(arrivals)
    for q in (50, 95, 99):
        check_quantile(record[f"p{q}_ms"], sim.latencies, q / 100)


ONE_BY_ONE_CASES = [
    # id, arrivals, expected latencies (ms), path. Replica A warm (free at 0); B started at t=0 with
    # a 0.5-s start, free from 0.5: 0.5 s apart > one 10-ms service -> served one at a time.
    # 3 at once: all on A (A is free again at .01, .02 long before B): 10, 20, 30
    # (the interleaved rule would have sent the 2nd to B: done at .51)
    ("3-wait-for-A", [0, 0, 0], [10, 20, 30], "one_by_one"),
    # 52 at once: A serves 50 by 0.50 (10, 20, ..., 500 ms); at 0.5 A and B are both free:
    # the 51st and 52nd are done at .51 (510, 510)
    ("52-B-joins-at-0.5", [0] * 52, [10 * k for k in range(1, 51)] + [510, 510], "one_by_one"),
    # one at .6: both free before it (max(free, .6) equal for both): the interleaved path; 10
    ("late-one", [0.6], [10], "interleaved"),
]


@pytest.mark.parametrize("arrivals, expected, path", [c[1:] for c in ONE_BY_ONE_CASES],
                         ids=[c[0] for c in ONE_BY_ONE_CASES])
def test_serving_one_by_one_while_a_replica_starts(arrivals, expected, path):
    sim = Recording(trace_of(arrivals), [P10], Starting({0: [(0, 2)]}, cold=0.5), SimConfig(gpus=1), initial={0: 1})
    record = sim.run()
    assert ms(sim.latencies) == pytest.approx(sorted(expected), abs=1e-6)
    assert sim.paths == [path]
    # B is the one replica started in the run (A was warm before it); a scale-out, no cold start
    assert record["served"] == len(arrivals) and (record["replica_starts"], record["cold_starts"]) == (1, 0)


@st.composite
def idle_cluster(draw):
    """1-2 functions, 1-4 idle replicas each, 1-25 arrivals each in one tick [0, 1)."""
    profiles = [Profile("a", ((1, 1.0),), cold_start_s=0.0), Profile("b", ((1, 10.0),), cold_start_s=0.0),
                Profile("c", ((1, 4.0), (8, 6.0), (32, 14.0)), cold_start_s=0.0),
                Profile("d", ((1, 30.0), (4, 45.0)), 0.5, 0.5, cold_start_s=0.0)]
    n = draw(st.integers(1, 2))
    chosen = [profiles[draw(st.integers(0, len(profiles) - 1))] for _ in range(n)]
    replicas = [draw(st.integers(1, 4)) for _ in range(n)]
    times, fids = [], []
    for fid in range(n):
        arrivals = draw(st.lists(st.floats(0, 0.999, allow_nan=False), min_size=1, max_size=25))
        times += arrivals
        fids += [fid] * len(arrivals)
    order = np.argsort(times, kind="stable")
    return chosen, replicas, np.asarray(times)[order], np.asarray(fids, np.int64)[order]


def serve_inputs(sim, a, f):
    """What Simulation._serve hands its two solvers (the same lines, for one tick at t0 = 0)."""
    order = np.argsort(f, kind="stable")
    a, f = a[order], f[order]
    n_f = np.bincount(f, minlength=len(sim.profiles))
    srv = sim.servers
    slots = np.flatnonzero(srv.alive)
    slots = slots[np.lexsort((srv.free[slots], srv.fid[slots]))]
    offset = np.searchsorted(srv.fid[slots], np.arange(len(sim.profiles)))
    service, extra = sim._service_times(n_f, slots, 0.0, sim.config.tick_s)
    return a, f, slots, offset, service, extra


def per_function(f, values, n):
    f, values = np.asarray(f), np.asarray(values)
    return [np.sort(values[f == fid]) for fid in range(n)]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(idle_cluster())
def test_interleaved_equals_one_by_one_on_idle_servers(case):
    profiles, replicas, a, f = case
    n = len(profiles)
    sim = Simulation(trace_of([], duration=1.0, functions=n), profiles, static_policy({}), SimConfig(gpus=4))
    for fid, count in enumerate(replicas):
        sim._start(fid, count, 0.0)  # a Scheduled policy: no cold start, so idle from 0
    a, f, slots, offset, service, extra = serve_inputs(sim, a, f)
    sim.batch_backlog = False  # the two solvers, with the tick's batch alone (each grows batches its own way)
    free0 = sim.servers.free.copy()
    # each solver also says the batch (rows) each request rode in: what the controller learns from
    f1, lat1, s1, rows1 = sim._serve_interleaved(a, f, 0.0, slots, offset, service, extra)
    free1 = sim.servers.free[slots].copy()
    sim.servers.free[:] = free0
    f2, lat2, s2, rows2 = sim._serve_one_by_one(a, f, slots, offset, service, extra)
    free2 = sim.servers.free[slots].copy()
    for x, y in zip(per_function(f1, lat1, n), per_function(f2, lat2, n)):
        np.testing.assert_allclose(x, y, rtol=0, atol=TOL)
    for x, y in zip(per_function(f1, rows1, n), per_function(f2, rows2, n)):
        np.testing.assert_array_equal(x, y)
    fid_of_slot = sim.servers.fid[slots]
    for x, y in zip(per_function(fid_of_slot, free1, n), per_function(fid_of_slot, free2, n)):
        np.testing.assert_allclose(x, y, rtol=0, atol=TOL)  # the same busy-until times are left behind


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["static", "oracle", "shoal", "kpa"]))
def test_whole_runs_match_the_one_by_one_reference(seed, policy):
    """Whichever path _serve picks tick by tick (the reactive policies' new replicas beside busy
    ones take the one-by-one path), a run's latencies equal the all-heap reference's."""
    trace = make_trace("gamma", functions=2, seconds=4, seed=seed, rate=40, cv=3)
    profiles = [PROFILES[seed % 4], PROFILES[(seed // 4) % 4]]
    counts = oracle_counts(trace, profiles, 1.0)
    makers = {"static": lambda: static_policy(counts), "oracle": lambda: oracle_policy(counts),
              "shoal": ShoalPolicy, "kpa": kpa_policy}
    initial = warm_start(trace, profiles, counts) if policy in ("shoal", "kpa") else None
    runs = []
    for cls in (Recording, OneByOne):
        sim = cls(trace, profiles, makers[policy](), SimConfig(gpus=2), initial=initial)
        sim.batch_backlog = False  # the solvers with the tick's batch alone
        sim.run()
        runs.append(sim)
    assert len(runs[0].latencies) == len(runs[1].latencies) > 0
    for x, y in zip(per_function(runs[0].lat_fids, runs[0].latencies, 2),
                    per_function(runs[1].lat_fids, runs[1].latencies, 2)):
        np.testing.assert_allclose(x, y, rtol=0, atol=TOL)


CODE = Profile("code", ((1, 40.0), (8, 120.0)), 0.25, 0.25, cold_start_s=2.0, slo_ms=200.0)  # emulated_code's


def exact_sim(replicas: int = 1) -> Simulation:
    """One function of CODE on `replicas` replicas idle from 0, shoal up's batcher."""
    sim = Simulation(trace_of([], duration=1.0), [CODE], static_policy({}), SimConfig(gpus=1, batcher="exact"))
    sim._start(0, replicas, 0.0)
    return sim


def serve_exact(sim, times):
    a = np.asarray(times, float)
    f = np.zeros(len(a), np.int64)
    srv = sim.servers
    slots = np.flatnonzero(srv.alive)
    slots = slots[np.lexsort((srv.free[slots], srv.fid[slots]))]
    return sim._serve_batches(a, f, np.zeros(len(a)), a, slots, np.array([0]), None)[:4]  # no hop; sent on arrival


EXACT_CASES = [
    # id, arrivals (s), a second replica ready at (s) or None, latencies (ms), rows
    # the docstring's: the first alone (40 ms, done at 40); the 3 queued by then as one batch,
    # 40 + 2/7 x 80 = 62.86 ms, done at 102.86
    ("queued-run-together", (0.0, 0.01, 0.02, 0.03), None, (40.0, 92.857, 82.857, 72.857), (1, 3, 3, 3)),
    # 10 at once, batches of at most 8: 8 in 120 ms, then 2 in 40 + 80/7 = 51.43 ms after them
    ("largest-batch", (0.0,) * 10, None, (120.0,) * 8 + (171.429,) * 2, (8,) * 8 + (2,) * 2),
    # a second replica still starting frees at its ready time (50 ms): the 3 queued at 40 ms go to
    # the first, which is free then; the one at 60 ms to the second, free since 50 ms: alone, 40 ms
    ("starting-replica", (0.0, 0.01, 0.02, 0.03, 0.06), 0.05, (40.0, 92.857, 82.857, 72.857, 40.0),
     (1, 3, 3, 3, 1)),
    # apart by more than a batch: each alone
    ("spread-out", (0.0, 0.05, 0.1), None, (40.0, 40.0, 40.0), (1, 1, 1)),
]


@pytest.mark.parametrize("times,second_ready,latency_ms,rows", [c[1:] for c in EXACT_CASES],
                         ids=[c[0] for c in EXACT_CASES])
def test_exact_batcher_runs_what_is_queued(times, second_ready, latency_ms, rows):
    sim = exact_sim(1 if second_ready is None else 2)
    if second_ready is not None:
        second = sim.slots[0][1]
        sim.servers.ready_at[second] = sim.servers.free[second] = second_ready
    f, latency, occupied, got_rows = serve_exact(sim, times)
    np.testing.assert_allclose(latency * 1000, latency_ms, atol=1e-3)
    np.testing.assert_array_equal(got_rows, rows)
    # each request occupies its share of its batch: the replicas' busy time is the batches' time
    batches = {}
    for end, r in zip(np.round(np.asarray(times) + latency, 9), got_rows):
        batches[end] = r
    expected_busy = sum(float(np.interp(r, [1, 8], [0.04, 0.12])) for r in batches.values())
    assert occupied.sum() == pytest.approx(expected_busy)


def test_exact_batcher_leaves_each_replica_busy_until_its_last_batch_ends():
    sim = exact_sim(1)
    serve_exact(sim, (0.0, 0.01, 0.02, 0.03))
    assert sim.servers.free[sim.slots[0][0]] == pytest.approx(0.04 + 0.04 + 2 / 7 * 0.08)
    # the next tick's request at 0.1 finds it busy until 102.86 ms: it waits and runs alone
    _, latency, _, rows = serve_exact(sim, (0.1,))
    assert latency[0] == pytest.approx(0.0028571 + 0.04, abs=1e-6) and rows.tolist() == [1]


@pytest.mark.parametrize("t0", [0.0, 0.5], ids=["ready-within-the-tick", "ready-at-the-tick-s-start"])
def test_requests_held_for_a_cold_start_reach_the_replica_one_by_one(t0):
    """As shoal up's gateway releases them (released_one_by_one): 9 held from 0.1-0.3 s, the
    replica ready at 0.5 s. The first runs alone (40 ms, to 0.54 s), the other 8 reach it just
    after and run as one batch from 0.54 s (120 ms, to 0.66 s). Sent all at 0.5 s they would run
    8 (to 0.62 s) and then 1 (to 0.66 s). Latency counts from when each came. The same when the
    tick begins at the ready time (the held ones served in the tick after it)."""

    class RanAndRecorded(Ran, Recording):
        pass

    sim = RanAndRecorded(trace_of([], duration=1.0), [CODE], static_policy({}), SimConfig(gpus=1, batcher="exact"))
    sim._start(0, 1, 0.0)
    slot = sim.slots[0][0]
    sim.servers.ready_at[slot] = sim.servers.free[slot] = 0.5
    came = 0.1 + np.arange(9) * 0.025
    sim._serve(came, np.zeros(9, np.int64), t0, t0 + 1.0, t0 + 1.0)
    ran = sorted(sim.ran)  # (reached the replica, latency from then, rows)
    assert [rows for _, _, rows in ran] == [1] + [8] * 8
    np.testing.assert_allclose([a + lat for a, lat, _ in ran], [0.54] + [0.66] * 8, atol=1e-5)
    reached = np.array([a for a, _, _ in ran])
    assert reached[0] == pytest.approx(0.5) and np.all(np.diff(reached) > 0) and reached[-1] < 0.5001
    np.testing.assert_allclose(sorted(sim.latencies), sorted([0.44] + (0.66 - came[1:]).tolist()), atol=1e-5)


RELEASE_CASES = [
    # id, came (s), function, hop (s), first ready per function, expected sends
    # two held (0.1, 0.2) go on from 0.5 s one after the other; one that came after (0.6) as it came
    ("held-then-not", (0.1, 0.2, 0.6), (0, 0, 0), (0.0, 0.0, 0.0), (0.5,), (0.5, 0.5 + RELEASE_GAP_S, 0.6)),
    # per function, from its own first ready (function 0 at 0.4 s, 1 at 0.25 s), one that came
    # after it (0.45) as it came; a hop (the activator's) still comes after the send
    ("two-functions", (0.1, 0.15, 0.2, 0.45), (1, 0, 1, 0), (0.01,) * 4, (0.4, 0.25),
     (0.25, 0.4, 0.25 + RELEASE_GAP_S, 0.45)),
    # a replica ready exactly at the tick's start (1.0) holds what came before it
    ("ready-at-the-tick", (0.9, 0.95, 1.0), (0, 0, 0), (0.0,) * 3, (1.0,), (1.0, 1.0 + RELEASE_GAP_S, 1.0)),
]


@pytest.mark.parametrize("came,fids,hop,first,sends", [c[1:] for c in RELEASE_CASES], ids=[c[0] for c in RELEASE_CASES])
def test_released_one_by_one_sends_held_requests_in_order(came, fids, hop, first, sends):
    came, f, hop = np.array(came), np.array(fids, np.int64), np.array(hop)
    a, _, hop2, sent = released_one_by_one(came + hop, f, hop, came.copy(), np.array(first))
    assert np.all(np.diff(a) >= 0)  # in the order they reach a replica
    got = dict(zip(np.round(a - hop2, 9).tolist(), sent.tolist()))  # each still counts from when it came
    np.testing.assert_allclose([got[round(c, 9)] for c in came.tolist()], sends)
    np.testing.assert_allclose(a, sent + hop[0])  # the hop (one length per case) after the send


class Ran(Simulation):
    """Keeps each request run by the exact batcher: (arrival, latency, rows)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran = []

    def _serve_batches(self, *args):
        out = super()._serve_batches(*args)
        self.ran.extend(zip(out[4].tolist(), out[1].tolist(), out[3].tolist()))
        return out


def test_a_batch_that_starts_after_its_tick_takes_the_next_ticks_requests():
    """The docstring's: one replica busy until 1.05 s (8 at 0.93 s, 120 ms), 2 queued from 0.95
    and 0.96 s, 3 more at 1.01-1.03 s: one batch of 5 at 1.05 s, 40 + 4 x 80 / 7 = 85.71 ms,
    done at 1.1357 s; split by the tick, 2 (51.43 ms, to 1.1014 s) and then 3 (62.86 ms, to
    1.1643 s). The 2 wait in flight at the look at 1 s: 0.05 + 0.04 request-seconds beside the
    8 running (8 x 0.07)."""
    sim = Ran(trace_of([], duration=2.0), [CODE], static_policy({}), SimConfig(gpus=1, batcher="exact"))
    sim._start(0, 1, 0.0)
    zeros = np.zeros(10, np.int64)
    sim._serve(np.array([0.93] * 8 + [0.95, 0.96]), zeros, 0.0, 1.0, 1.0)
    assert len(sim.ran) == 8 and 0 in sim._queued
    assert sim.seen_inflight[0] == pytest.approx(8 * 0.07 + 0.05 + 0.04)
    sim._serve(np.array([1.01, 1.02, 1.03]), zeros[:3], 1.0, 2.0, 2.0)
    assert not sim._queued
    later = sorted(sim.ran)[8:]
    assert [rows for _, _, rows in later] == [5] * 5
    np.testing.assert_allclose([a + lat for a, lat, _ in later], 1.05 + 0.04 + 4 / 7 * 0.08, atol=1e-9)
    assert sim.served == 13


def test_requests_queued_across_ticks_and_at_the_run_s_end_are_answered():
    """A 2 s trace: 10 at 0.95 s run as 8 (to 1.07 s), and 2 that wait for the next tick and run
    at 1.07 s; 10 more at 1.93 s run as 8 (to 2.05 s) and 2 after the trace's end, the last tick
    running everything it has."""
    times = np.r_[np.full(10, 0.95), np.full(10, 1.93)]
    sim = Ran(trace_of(times, duration=2.0), [CODE], static_policy({0: {0: 1, 1: 1}}),
              SimConfig(gpus=1, batcher="exact"))
    sim._start(0, 1, 0.0)
    record = sim.run()
    assert record["served"] == record["requests"] == 20 and not sim._queued
    ends = sorted((round(a + lat, 6), rows) for a, lat, rows in sim.ran)
    assert [rows for _, rows in ends] == [8] * 8 + [2] * 2 + [8] * 8 + [2] * 2
    assert ends[8][0] == pytest.approx(1.07 + 0.04 + 0.08 / 7) and ends[-1][0] == pytest.approx(2.05 + 0.04 + 0.08 / 7)


def test_a_last_replica_removed_with_requests_queued_runs_them_before_it_goes():
    """As live drains a replica: 8 run at 0.93-1.05 s, 2 wait for the next tick; the function's
    one replica is stopped at 1 s; the next tick runs the 2 on it, 1.05-1.1014 s, and charges its
    1/4 slice until then: (0.05 + 0.05143) x 0.25. Nothing goes back to the gateway."""
    sim = Ran(trace_of([], duration=3.0), [CODE], static_policy({}), SimConfig(gpus=1, batcher="exact"))
    sim._start(0, 1, 0.0)
    sim._serve(np.array([0.93] * 8 + [0.95, 0.96]), np.zeros(10, np.int64), 0.0, 1.0, 1.0)
    before = sim.slice_seconds
    sim._stop(0, 1, 1.0)
    assert sim.n_srv[0] == 0 and 0 in sim._draining
    sim._serve(np.zeros(0), np.zeros(0, np.int64), 1.0, 2.0, 2.0)
    assert sim.served == 10 and not sim.held and not sim._queued and not sim._draining
    late = sorted(sim.ran)[8:]
    np.testing.assert_allclose([a + lat for a, lat, _ in late], 1.05 + 0.04 + 0.08 / 7, atol=1e-9)
    assert sim.slice_seconds - before == pytest.approx((0.05 + 0.04 + 0.08 / 7) * 0.25)


def test_a_run_with_the_exact_batcher_serves_every_request_once():
    """resnet50 (batches to 32) and whisper-tiny (to 4) batch, mlp-small does not: the exact
    batcher serves each request once; a model that does not batch is served as by the rule,
    request for request, and a batching one by other batches (its latencies differ)."""
    trace = make_trace("gamma", functions=3, seconds=6, seed=3, rate=60, cv=3)
    profiles = [PROFILES[0], PROFILES[3], PROFILES[2]]
    counts = oracle_counts(trace, profiles, 1.0)
    runs = {}
    for batcher in ("rule", "exact"):
        sim = Recording(trace, profiles, static_policy(counts), SimConfig(gpus=2, batcher=batcher))
        record = sim.run()
        assert record["served"] == record["requests"] == len(trace.times)
        assert len(sim.latencies) == len(trace.times)
        runs[batcher] = per_function(sim.lat_fids, sim.latencies, 3)
    np.testing.assert_allclose(runs["rule"][2], runs["exact"][2], rtol=0, atol=TOL)
    assert len(runs["exact"][0]) > 0 and not np.allclose(runs["rule"][0], runs["exact"][0])


ORACLE_EXACT_CASES = [
    # id, arrivals (s), fewest replicas by the rule, by shoal up's batcher; CODE: SLO 200 ms
    # 10 at once: one replica runs 8 (120 ms), then 2 (51.4 ms): the last at 171.4 ms
    ("ten-at-once", (0.0,) * 10, 2, 1),
    # 20 at once: 2 replicas run 8 each, then one of them 4: 120 + 74.3 = 194.3 ms
    ("twenty-at-once", (0.0,) * 20, 4, 2),
    # 30 at once: 3 run 24, the other 6 end at 120 + 97.1 = 217.1 ms: 4
    ("thirty-at-once", (0.0,) * 30, 6, 4),
    # 100, 10 ms apart: 2 replicas run 2.09 s of small batches in the 1 s tick, 3 run 2.89 s
    ("hundred-spread", tuple(np.arange(100) / 100), 2, 3),
]


@pytest.mark.parametrize("times,by_rule,exact", [c[1:] for c in ORACLE_EXACT_CASES],
                         ids=[c[0] for c in ORACLE_EXACT_CASES])
def test_the_oracle_counts_replicas_for_the_batcher_it_is_served_by(times, by_rule, exact):
    a = np.asarray(times, float)
    assert S._fewest_replicas(a, CODE, 1.0, "rule") == by_rule
    assert S._fewest_replicas(a, CODE, 1.0, "exact") == exact


def test_the_exact_oracle_counts_serve_the_ticks_and_one_fewer_does_not():
    """20 requests at the start of each of 5 seconds: 2 replicas a tick by shoal up's batcher
    (the table above), and run so they meet the SLO; 1 replica (a batch of 8, then 8 more at
    240 ms) does not."""
    times = np.repeat(np.arange(5.0), 20)
    trace = trace_of(times, duration=5.0)
    counts = oracle_counts(trace, [CODE], 1.0, "exact")
    assert counts == {0: {tick: 2 for tick in range(5)}}
    config = SimConfig(gpus=1, batcher="exact")
    assert Simulation(trace, [CODE], oracle_policy(counts), config).run()["slo_attainment"] == 1.0
    fewer = {0: {tick: 1 for tick in range(5)}}
    assert Simulation(trace, [CODE], oracle_policy(fewer), config).run()["slo_attainment"] < 1.0


def test_sim_config_refuses_an_unknown_batcher():
    with pytest.raises(ValueError, match="batcher 'fifo' must be one of rule, exact"):
        SimConfig(batcher="fifo")


# ---------------------------------------------------------------------- 2. conservation

REQUIRED_KEYS = ("requests", "served", "timed_out", "slo_attainment", "replica_slice_seconds", "whole_gpu_seconds",
                 "cold_starts", "replica_starts", "start", "cold_start_requests", "p50_ms", "p95_ms", "p99_ms", "oracle_replica_slice_seconds",
                 "vs_oracle")

CONSERVATION_CASES = [
    # id, make_trace kwargs, SimConfig. "roomy": 2 light functions on 2 GPUs, nothing times out.
    # "crowded": 10 bursty functions (6 resnet50, 3 mlp-small, 1 whisper-tiny at seed 1) on 1 GPU,
    # timeout 0.2 s: replicas are unplaceable, requests are held (some across the warm-up) and
    # expire, and some served ones queue more than 0.2 s (a request waiting for a cold start is
    # held until a replica is ready, so a served one is over the timeout only by queueing).
    ("roomy", dict(kind="poisson", functions=2, seconds=10, seed=3, rate=5), SimConfig(gpus=2)),
    ("roomy-warmup", dict(kind="poisson", functions=2, seconds=10, seed=3, rate=5), SimConfig(gpus=2, warmup_s=3)),
    ("crowded", dict(kind="gamma", functions=10, seconds=10, seed=0, rate=8, cv=4),
     SimConfig(gpus=1, timeout_s=0.2, warmup_s=2)),
]


@pytest.mark.parametrize("kwargs, config", [c[1:] for c in CONSERVATION_CASES], ids=[c[0] for c in CONSERVATION_CASES])
def test_every_request_is_accounted(monkeypatch, kwargs, config):
    kwargs = dict(kwargs)
    trace = make_trace(kwargs.pop("kind"), **kwargs)
    Recording.instances = []
    monkeypatch.setattr(S, "Simulation", Recording)  # simulate() builds its runs from the module's name
    result = simulate(trace, list(POLICIES), config, seed=1)
    assert set(result) == {"policies", "trace", "cluster"}
    assert list(result["policies"]) == list(POLICIES)
    assert [s.policy.name for s in Recording.instances] == list(POLICIES)
    after_warmup = int(np.count_nonzero(trace.times >= config.warmup_s))
    for sim, (name, record) in zip(Recording.instances, result["policies"].items()):
        assert all(key in record for key in REQUIRED_KEYS), name
        over = sum(1 for x in sim.latencies if x > config.timeout_s)
        held = sim.held_at_reset or 0
        assert record["requests"] == after_warmup + held, name
        assert record["requests"] == record["served"] + record["timed_out"] - over, name
        assert int(sim.hist.sum()) == record["served"] == len(sim.latencies), name
        assert sim.within_slo <= record["served"] <= record["requests"], name
        assert 0.0 <= record["slo_attainment"] <= 1.0, name
        assert record["slo_attainment"] == pytest.approx(sim.within_slo / max(1, record["requests"]))
        assert record["oracle_replica_slice_seconds"] == result["policies"]["oracle"]["oracle_replica_slice_seconds"]
    if kwargs.get("functions") == 10:  # the crowded case does exercise every term
        assert any(s.held_at_reset for s in Recording.instances)
        assert any(x > config.timeout_s for s in Recording.instances for x in s.latencies)
        assert all(r["timed_out"] > 0 for r in result["policies"].values())
    assert result["trace"]["requests"] == len(trace)
    assert result["cluster"]["gpus"] == config.gpus and result["cluster"]["warmup_s"] == config.warmup_s
    assert "simulated" in result["cluster"]["note"]
    json.loads(json.dumps(result))  # JSON-ready


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown policy 'fifo'"):
        simulate(trace_of([0.1]), ["shoal", "fifo"], SimConfig(gpus=1), profiles=[P10])


HELD_CASES = [
    # id, timeout_s, start_at, duration, expected (served, timed_out, latencies ms)
    # request at 0.5 held (the policy keeps 0 until 1.5); decided 1 at the end of tick 1 (t=2.0),
    # ready at once; released at tick 2: done 2.01 -> 1510 ms
    ("held-then-served", 60.0, 1.5, 3.0, (1, 0, [1510])),
    # never started, timeout 1 s: at the end of tick 1 (t=2) 0.5 <= 2 - 1: expired
    ("held-expires", 1.0, 99.0, 3.0, (0, 1, [])),
    # never started, timeout 60 s: still held when the run ends -> counted as timed out
    ("held-at-the-end", 60.0, 99.0, 3.0, (0, 1, [])),
]


@pytest.mark.parametrize("timeout, start_at, duration, expected", [c[1:] for c in HELD_CASES],
                         ids=[c[0] for c in HELD_CASES])
def test_held_requests_are_served_or_time_out(timeout, start_at, duration, expected):
    sim = Recording(trace_of([0.5], duration=duration), [P10], lazy_policy(start_at),
                    SimConfig(gpus=1, timeout_s=timeout))
    record = sim.run()
    served, timed_out, latencies = expected
    assert (record["requests"], record["served"], record["timed_out"]) == (1, served, timed_out)
    assert ms(sim.latencies) == pytest.approx(latencies, abs=1e-6)
    assert record["cold_start_requests"] == 1


# ---------------------------------------------------------------------- 3. the oracle and static

P4 = dict(latency_ms=((1, 4.0),), cold_start_s=0.0)
BATCHY = ((1, 10.0), (8, 20.0))

FEWEST_CASES = [
    # id, arrivals, latency profile, SLO ms, expected replicas
    # 10 at once, 4 ms each (the docstring): c replicas finish the last at ceil(10/c) x 4 ms;
    # SLO 10: c=2 -> 20, c=4 -> 12, c=5 -> 8 <= 10 -> 5
    ("docstring", [0.0] * 10, P4["latency_ms"], 10, 5),
    ("slo-13", [0.0] * 10, P4["latency_ms"], 13, 4),  # c=3 -> 16 > 13, c=4 -> 12
    ("slo-21", [0.0] * 10, P4["latency_ms"], 21, 2),  # c=1 -> 40, c=2 -> 20
    ("slo-41", [0.0] * 10, P4["latency_ms"], 41, 1),  # c=1 -> 40
    ("slo-7-exactly-one-round", [0.0] * 10, P4["latency_ms"], 7, 10),  # needs one round (4 ms): c=10
    ("impossible-capped-at-n", [0.0] * 10, P4["latency_ms"], 3, 10),  # 4 ms > 3 ms for anyone: n
    # 1 ms apart, 10 ms each: one replica finishes the 2nd at 20 ms, 19 ms after it came
    ("two-close-slo-15", [0.0, 0.001], ((1, 10.0),), 15, 2),
    ("two-close-slo-20", [0.0, 0.001], ((1, 10.0),), 20, 1),
    # the work rule: 1,000 evenly over the tick on ((1,10),(8,20)) ms, SLO 10 s (never binding).
    # batch_size at 1000/c per second, fill 0.8: c=1: ceil(1000 x .010 / .8) = 13 -> 8 (20 ms),
    # 2.5 ms a request: 2.5 s of work > 1 s -> no. c=2: 500/s: ceil(6.25) = 7 (18.57 ms),
    # ceil(500 x .01857 / .8) = 12 -> 8: 2.5 ms a request, 2.5 s > 2 s -> no. c=3: 333/s:
    # ceil(4.17) = 5 (15.71 ms), ceil(6.55) = 7 (18.57 ms), ceil(7.74) = 8: 2.5 s <= 3 s -> 3
    ("work-rule", [k / 1000 for k in range(1000)], BATCHY, 10_000, 3),
]


@pytest.mark.parametrize("arrivals, latency_ms, slo_ms, expected", [c[1:] for c in FEWEST_CASES],
                         ids=[c[0] for c in FEWEST_CASES])
def test_fewest_replicas(arrivals, latency_ms, slo_ms, expected):
    profile = Profile("p", latency_ms, cold_start_s=0.0, slo_ms=slo_ms)
    assert _fewest_replicas(np.asarray(arrivals), profile, 1.0) == expected


def test_work_rule_decides_where_latency_alone_would_not():
    """The work-rule case above: two replicas would keep every request far inside the 10-s
    SLO (each takes every other request, 2 ms apart, 2.5 ms each, + 17.5 ms of batch:
    under 0.3 s), but the tick's work does not fit in two."""
    a = [k / 1000 for k in range(1000)]
    lat, s = 0.020, 0.020 / 8
    worst = 0.0
    for server in (a[0::2], a[1::2]):
        done = 0.0
        for t in server:
            done = max(done, t) + s
            worst = max(worst, done - t + lat - s)
    assert worst < 0.3
    assert 1000 * s > 2 * 1.0  # more work than two replicas hold in the tick


@settings(max_examples=30, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.floats(0, 0.999, allow_nan=False), min_size=1, max_size=12),
       latency=st.sampled_from([1.0, 4.0, 10.0, 30.0]), slo=st.sampled_from([5.0, 15.0, 50.0, 200.0]))
def test_fewest_replicas_equals_brute_force(arrivals, latency, slo):
    """Batch-1 profiles: the fewest idle FIFO replicas (earliest free first) that serve every
    request within the SLO and hold the tick's work; n if none does."""
    a = np.sort(np.asarray(arrivals))
    s = latency / 1000
    n = len(a)

    def fits(c):
        heap = [0.0] * c
        worst = 0.0
        for t in a.tolist():
            done = max(heapq.heappop(heap), t) + s
            heapq.heappush(heap, done)
            worst = max(worst, done - t)
        return worst <= slo / 1000 + 1e-12 and n * s <= c * 1.0

    expected = next((c for c in range(1, n + 1) if fits(c)), n)
    assert _fewest_replicas(a, Profile("p", ((1, latency),), cold_start_s=0.0, slo_ms=slo), 1.0) == expected


def test_oracle_counts_and_changes():
    # f0: 10 at once in tick 0 (SLO 10 ms, 4 ms -> 5), 1 in tick 1 (-> 1), none in tick 2, 1 in tick 3
    # f1: 2 requests in tick 2 only (10 ms, SLO 1 s -> 1)
    times = [0.0] * 10 + [1.5, 2.2, 2.3, 3.1]
    fids = [0] * 10 + [0, 1, 1, 0]
    trace = trace_of(times, fids, duration=4.0, functions=2)
    profiles = [Profile("p", ((1, 4.0),), cold_start_s=5.0, slo_ms=10), P10]
    counts = oracle_counts(trace, profiles, 1.0)
    assert counts == {0: {0: 5, 1: 1, 3: 1}, 1: {2: 1}}
    oracle = oracle_policy(counts)
    assert oracle.cold_start_s(profiles[0]) == 0.0  # perfect foresight: no cold start
    # changes: f0 5 at tick 0, 1 at 1, 0 at 2 (idle tick), 1 at 3, 0 at 4; f1 1 at 2, 0 at 3
    assert [oracle.scheduled(k) for k in range(5)] == [[(0, 5)], [(0, 1)], [(0, 0), (1, 1)], [(0, 1), (1, 0)],
                                                       [(0, 0)]]
    assert static_policy(counts).scheduled(0) == [(0, 5), (1, 1)]  # the peaks, warm from the start
    assert static_policy(counts).scheduled(1) == []


def test_oracle_run_has_no_cold_start_and_costs_its_counts():
    # the trace above; every request is done well before its tick ends, so no removal is charged
    # beyond the tick: slice-seconds = (5 + 1 + 1) ticks x 0.25 + 1 tick x 0.25 = 2.0
    times = [0.0] * 10 + [1.5, 2.2, 2.3, 3.1]
    fids = [0] * 10 + [0, 1, 1, 0]
    trace = trace_of(times, fids, duration=4.0, functions=2)
    profiles = [Profile("p", ((1, 4.0),), cold_start_s=5.0, slo_ms=10), P10]
    result = simulate(trace, ["oracle", "static"], SimConfig(gpus=2), profiles=profiles)
    oracle, static = result["policies"]["oracle"], result["policies"]["static"]
    assert oracle["cold_start_requests"] == 0
    assert oracle["slo_attainment"] == 1.0  # f0's 10: two rounds of 5 -> 4, 8 ms; the rest 4 or 10 ms
    assert oracle["replica_slice_seconds"] == oracle["oracle_replica_slice_seconds"] == 2.0
    assert oracle["vs_oracle"] == 1.0
    assert oracle["replica_seconds"] == 5 + 1 + 1 + 1  # replica-ticks of 1 s
    # static holds the peaks (5 + 1) for all 4 ticks: 24 replica-seconds, 24 x 0.25 = 6 slice-seconds
    assert static["replica_seconds"] == 24.0 and static["replica_slice_seconds"] == 6.0
    assert static["vs_oracle"] == 3.0 and static["cold_start_requests"] == 0


STATIC_CASES = [
    # id, replicas, duration, warmup_s, expected replica-seconds: replicas x counted seconds
    ("2x3s", 2, 3.0, 0.0, 2 * 3),
    ("3x5s-warm2", 3, 5.0, 2.0, 3 * (5 - 2)),
    ("1x2.5s", 1, 2.5, 0.0, 1 * 3),  # ceil(2.5) = 3 ticks of 1 s are simulated and charged
]


@pytest.mark.parametrize("replicas, duration, warmup, expected", [c[1:] for c in STATIC_CASES],
                         ids=[c[0] for c in STATIC_CASES])
def test_static_is_constant(replicas, duration, warmup, expected):
    sim = Simulation(trace_of([0.1], duration=duration), [P10], static_policy({0: {0: replicas}}),
                     SimConfig(gpus=1, warmup_s=warmup))
    record = sim.run()
    assert record["replica_seconds"] == expected
    assert record["replica_slice_seconds"] == expected * 0.25
    assert record["whole_gpu_seconds"] == expected / replicas  # all on the one GPU
    # started at tick 0, before a warm-up; ready at once, so no request waited: no cold start
    assert (record["replica_starts"], record["cold_starts"]) == (0 if warmup else replicas, 0)


def test_oracle_start_at_the_warmup_boundary_is_counted():
    # warm-up 1 s; requests only in tick 1 -> the oracle starts 1 replica at t=1 (after the warm-up)
    trace = trace_of([1.2, 1.3], duration=3.0)
    sim = Simulation(trace, [P10], oracle_policy(oracle_counts(trace, [P10], 1.0)), SimConfig(gpus=1, warmup_s=1.0))
    record = sim.run()
    assert (record["replica_starts"], record["cold_starts"]) == (1, 0)  # ready at t=1, before 1.2: nobody waited
    assert record["decisions"] == {"SCHEDULED": 2}  # start at t=1, stop at t=2


def test_warm_start():
    # 2 functions over 10 s: f0 30 requests (3/s), f1 none (< 1 a minute: starts cold)
    trace = trace_of(np.linspace(0, 9.9, 30), duration=10.0, functions=2)
    # with counts: f0's first count 2 / 0.7 = 2.86 -> 3
    assert warm_start(trace, [P10, P10], {0: {0: 2, 5: 9}}) == {0: 3}
    # without: 3/s x 10 ms = 0.03 / 0.7 -> at least 1
    assert warm_start(trace, [P10, P10]) == {0: 1}


# ---------------------------------------------------------------------- 4. cold start

COLD_CASES = [
    # id, arrival, policy maker: one request to a function at zero, cold start 2 s, 10 ms service.
    # Held at the activator, the policy asked at the arrival, the replica ready 2 s later:
    # latency 2.000 + 0.010 = 2.010 s
    ("shoal-at-0", 0.0, ShoalPolicy),
    ("shoal-at-0.5", 0.5, ShoalPolicy),
    ("kpa", 0.5, kpa_policy),
    ("ray", 0.5, ray_policy),
]


@pytest.mark.parametrize("arrival, make", [c[1:] for c in COLD_CASES], ids=[c[0] for c in COLD_CASES])
def test_cold_start_latency(arrival, make):
    profile = Profile("cold", ((1, 10.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000)
    sim = Recording(trace_of([arrival], duration=5.0), [profile], make(), SimConfig(gpus=1))
    record = sim.run()
    assert sim.latencies == pytest.approx([2.010], abs=1e-9)
    assert record["cold_start_requests"] == record["cold_starts"] == record["replica_starts"] == 1
    assert record["slo_attainment"] == 0.0  # 2.01 s > 1 s
    check_quantile(record["p50_ms"], sim.latencies, 0.5)


# ---------------------------------------------------------------------- 5. warm-up

WARMUP_CASES = [
    # id, warmup_s, tick_s, expected counted requests: arrivals 0.5, 0.7 | 1.5, 1.6, 1.7 | 2.5
    ("none", 0.0, 1.0, 6),
    ("1s", 1.0, 1.0, 4),  # 1.5, 1.6, 1.7, 2.5
    ("2s", 2.0, 1.0, 1),  # 2.5
    ("1.5s-half-ticks", 1.5, 0.5, 4),  # 3 ticks of 0.5 s: [1.5, 2.0) is the first counted: 1.5, 1.6, 1.7, 2.5
]


@pytest.mark.parametrize("warmup, tick, expected", [c[1:] for c in WARMUP_CASES], ids=[c[0] for c in WARMUP_CASES])
def test_warmup_excludes_earlier_requests(warmup, tick, expected):
    arrivals = [0.5, 0.7, 1.5, 1.6, 1.7, 2.5]
    sim = Recording(trace_of(arrivals, duration=3.0), [P10], static_policy({0: {0: 1}}),
                    SimConfig(gpus=1, warmup_s=warmup, tick_s=tick))
    record = sim.run()
    assert record["requests"] == record["served"] == expected
    assert int(sim.hist.sum()) == expected


def test_warmup_counts_requests_held_across_it():
    # the held-then-served case with warm-up 1 s: the request at 0.5 is still held at t=1,
    # so it is counted (requests 1) and answered after (1510 ms)
    sim = Recording(trace_of([0.5], duration=3.0), [P10], lazy_policy(1.5), SimConfig(gpus=1, warmup_s=1.0))
    record = sim.run()
    assert (record["requests"], record["served"], record["timed_out"]) == (1, 1, 0)
    assert ms(sim.latencies) == pytest.approx([1510], abs=1e-6)


@pytest.mark.parametrize("warmup, tick", [(0.5, 1.0), (1.25, 0.5), (2.3, 1.0)])
def test_warmup_must_be_whole_ticks(warmup, tick):
    sim = Simulation(trace_of([0.1], duration=3.0), [P10], static_policy({0: {0: 1}}),
                     SimConfig(gpus=1, warmup_s=warmup, tick_s=tick))
    with pytest.raises(ValueError, match="whole number of ticks"):
        sim.run()


# ---------------------------------------------------------------------- configuration errors

@pytest.mark.parametrize("make, match", [
    (lambda: SimConfig(gpus=0), "gpus"),
    (lambda: SimConfig(gpu_memory_mib=0), "gpu_memory_mib"),
    (lambda: SimConfig(tick_s=0), "tick_s"),
    (lambda: SimConfig(timeout_s=0), "timeout_s"),
    (lambda: SimConfig(warmup_s=-1), "warmup_s"),
    (lambda: Profile("x", ((2, 5.0),)), "batch size 1"),
    (lambda: Profile("x", ((1, 5.0),), slice_fraction=1.5), "slice_fraction"),
    (lambda: Simulation(trace_of([0.1], functions=2, fids=[1]), [P10], static_policy({})), "2 functions"),
])
def test_bad_configuration(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------------- 6. the CLI

def test_cli_writes_both_policies(tmp_path, capsys):
    out = tmp_path / "o.json"
    rc = cli.main(["--trace", "poisson", "--rate", "5", "--functions", "2", "--seconds", "30",
                   "--policy", "shoal,kpa", "--warmup-s", "0", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert set(result) == {"policies", "trace", "cluster"}
    assert list(result["policies"]) == ["shoal", "kpa"]
    assert result["trace"]["kind"] == "poisson" and result["trace"]["functions"] == 2
    assert "simulated" in result["cluster"]["note"]
    printed = capsys.readouterr().out
    assert "shoal" in printed and "kpa" in printed and f"wrote {out}" in printed


@pytest.mark.parametrize("extra, batcher, routing", [
    ([], "rule", None),
    (["--batcher", "exact"], "exact", "fewest"),
    (["--batcher", "exact", "--routing", "queue"], "exact", "queue"),
])
def test_cli_records_how_requests_were_served(tmp_path, capsys, extra, batcher, routing):
    """The exact batcher routes as shoal up's gateway unless told to keep one queue; the rule's
    batcher has no replica queues to route to."""
    out = tmp_path / "o.json"
    rc = cli.main(["--trace", "poisson", "--rate", "5", "--functions", "1", "--seconds", "5", "--policy", "shoal",
                   "--warmup-s", "0", "--json", str(out), *extra])
    assert rc == 0
    cluster = json.loads(out.read_text())["cluster"]
    assert (cluster["batcher"], cluster["routing"]) == (batcher, routing)


@pytest.mark.parametrize("extra, message", [
    (["--policy", "shoal,fifo"], "unknown policy 'fifo'"),
    (["--warmup-s", "0.5"], "whole number of ticks"),
    (["--gpus", "0"], "gpus"),
])
def test_cli_errors_exit_2(capsys, extra, message):
    rc = cli.main(["--trace", "poisson", "--rate", "1", "--functions", "1", "--seconds", "3", *extra])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal simulate: ") and message in err


def test_scale_down_stops_a_starting_replica_before_a_ready_one():
    """One warm replica (ready at -cold); at tick 0 the schedule asks for 2 (the second takes
    5 s to start), at tick 1 for 1 again: the starting one goes, so the warm one keeps
    serving (as the controller stops the newest first). Requests at 1.5 s are served by the
    warm replica at once: 10 ms each, not held until a start that will never finish."""
    sim = Recording(trace_of([1.5, 1.6], duration=3.0), [P10], Starting({0: [(0, 2)], 1: [(0, 1)]}, cold=5.0),
                    SimConfig(gpus=1), initial={0: 1})
    # the placement's consolidating choice prefers the warm (oldest) replica here: starting ones still go first
    sim.cluster.scale_down_victims = lambda function, count: sorted(sim.replica_slot, key=sim.replica_slot.get)[:count]
    record = sim.run()
    assert ms(sim.latencies) == pytest.approx([10.0, 10.0])
    (slot,) = sim.slots[0]
    assert sim.servers.ready_at[slot] <= 0.0  # the warm one stayed
    assert (record["replica_starts"], record["cold_starts"]) == (1, 0)  # the starting one; the warm one was before


@pytest.mark.parametrize("path", ["interleaved", "one_by_one"])
def test_a_backlog_rides_in_larger_batches_on_either_path(path):
    """200 requests at once on ((1,10),(8,20)) ms: with batch_backlog the queue is served in
    batches of up to 8: the queue drains faster (median and last answer earlier) and the
    replica works less than with the tick's batch alone (4 rows); a request early in the
    queue may wait out a larger batch, never by more than the largest batch's 20 ms. The
    one-by-one path (a replica still starting beside a warm one) grows its batches from
    the wait it finds."""
    profile = Profile("b", ((1, 10.0), (8, 20.0)), 0.25, 0.25, cold_start_s=0.0, slo_ms=10_000)
    results = {}
    for backlog in (False, True):
        if path == "interleaved":
            sim = Recording(trace_of([0.0] * 200), [profile], static_policy({0: {0: 1}}), SimConfig(gpus=1))
        else:
            sim = Recording(trace_of([0.0] * 200), [profile], Starting({0: [(0, 2)]}, cold=0.5), SimConfig(gpus=1),
                            initial={0: 1})
        sim.batch_backlog = backlog
        record = sim.run()
        assert sim.paths == [path] and record["served"] == 200
        results[backlog] = (np.sort(sim.latencies), float(sim.servers.free[sim.servers.alive].max()))
    (without, busy_without), (with_backlog, busy_with) = results[False], results[True]
    assert np.all(with_backlog <= without + 0.020 + 1e-12)
    assert np.median(with_backlog) < 0.8 * np.median(without) and with_backlog[-1] < 0.8 * without[-1]
    assert busy_with < 0.8 * busy_without  # when the replicas are free again: the queue's work


# ---------------------------------------------------------------------- 7. only what a controller knows

class Scripted(S._Reactive):
    """Reactive: asks for script(now) (a ScaleDecision) and records every snapshot it is shown."""

    def __init__(self, script):
        self.seen: list[tuple[float, object]] = []

        def step(snapshot, spec, state, now):
            self.seen.append((now, snapshot))
            return script(now), state

        super().__init__("scripted", step, lambda: None)

    def at(self, now, function="f0"):
        return [s for t, s in self.seen if t == now and s.function == function][-1]


def on_line(size, seconds, speed):
    """((1, 10), (8, 20)) ms is a line: L(b) = 10 + (b - 1) x 10/7 ms on the reference slice."""
    return seconds == pytest.approx((10 + (size - 1) * 10 / 7) / 1000 * speed, abs=1e-12)


@pytest.mark.parametrize("slice_fraction", [0.25, 0.5])
def test_a_function_learns_the_batches_it_ran(slice_fraction):
    """At zero the policy sees no table. The deploy look at 0 starts one replica, ready at 1.0
    plus its probe's batches (1 and 8 rows: 30 ms x speed, Profile.probe_s); from the look at 2.0
    the policy sees the probe (live: the replica's shoal_replica_batch_probe_seconds); a
    request at 2.0 runs alone (a batch of 1: 10 ms x speed), learned in the probe's stead;
    after 200 requests at 3.0 the policy sees the sizes that replica ran, the probe's 8 given
    way to them, at its slice's latency (a 0.5 slice of a profile measured on 0.25: speed 0.5,
    half the seconds). On 0.25:
    requests 0-3 ride in batches of 4, then 5, 6, 7, the remaining 193 in batches of 8 (see
    BACKLOG_BATCHES): 1 + 1/5 + 1/6 + 1/7 + 193/8 = 25.635 batches; 200 / 25.635 = 7.80 rows
    per batch, and L(7.80) = 10 + 6.80 x 10/7 = 19.717 ms a batch (over half the largest batch,
    8: read as learned, loop.policy_table)."""
    profile = Profile("b", ((1, 10.0), (8, 20.0)), slice_fraction, 0.25, cold_start_s=1.0, slo_ms=10_000)
    policy = Scripted(lambda now: ScaleDecision(1, "S"))
    sim = Simulation(trace_of([2.0] + [3.0] * 200, duration=5.0), [profile], policy, SimConfig(gpus=1))
    sim.run()
    speed = 0.25 / slice_fraction
    assert policy.at(0.0).ready + policy.at(0.0).starting == 0  # the deploy look, at zero
    for now in (0.0, 1.0):  # no replica ready yet: nothing known
        assert policy.at(now).batch_latency_s == ()
    probe = ((1.0, 0.010 * speed), (8.0, 0.020 * speed))
    for now in (2.0, 3.0):  # the probe; then one batch of 1 learned, the probe's 8 beside it
        seen = policy.at(now).batch_latency_s
        assert [r for r, _ in seen] == [1.0, 8.0] and [x for _, x in seen] == pytest.approx([x for _, x in probe])
    learned_on, (first, *_) = sim.memory.batch["f0"]
    assert learned_on == slice_fraction and first == pytest.approx((1.0, 0.010 * speed))
    table = policy.at(4.0).batch_latency_s
    assert len(table) == 2 and table[0] == first
    assert all(on_line(size, secs, speed) for size, secs in table)
    if slice_fraction == 0.25:
        batches = 1 + 1 / 5 + 1 / 6 + 1 / 7 + 193 / 8
        assert table[1][0] == pytest.approx(200 / batches) and table[1][1] == pytest.approx(0.019717, abs=1e-6)


def test_a_slice_change_carries_the_table_at_the_new_slices_speed():
    """Batches learned on 0.25 (as above); the look at 4.0 asks for a 0.5 slice: the table is
    carried to 0.5 at once at twice the speed, each batch's seconds halved (live carries it at
    its next look, before deciding: loop.on_slice), and the next looks, with no batch run since
    (the 200 requests at 3.0 were answered by 3.5), see it so; loop.Memory now learns on 0.5."""
    profile = Profile("b", ((1, 10.0), (8, 20.0)), 0.25, 0.25, cold_start_s=1.0, slo_ms=10_000)
    policy = Scripted(lambda now: ScaleDecision(1, "S", slice_fraction=0.5 if now >= 4 else None))
    sim = Simulation(trace_of([2.0] + [3.0] * 200, duration=6.0), [profile], policy, SimConfig(gpus=1))
    sim.run()
    learned = policy.at(4.0).batch_latency_s
    assert len(learned) == 2  # known when the slice was asked for
    carried = tuple((rows, seconds / 2) for rows, seconds in learned)
    assert policy.at(5.0).batch_latency_s == carried and policy.at(6.0).batch_latency_s == carried
    assert sim.memory.batch["f0"] == (0.5, carried)


def test_the_cold_start_is_seen_once_measured():
    """Cold start 3 s; the policy reads the default (2 s, policy.lead_s's for the None the live
    loop passes) until a replica has been ready: asked at 0.5, ready at 3.5, so the look at
    4.0 reads 3.0 (create to ready, as shoal up times it), and still after the function went
    to zero at 5 and a request at 8 finds it there."""
    profile = Profile("c", ((1, 10.0),), 0.25, 0.25, cold_start_s=3.0, slo_ms=10_000)
    policy = Scripted(lambda now: ScaleDecision(1 if 0.5 <= now < 5 or now >= 8 else 0, "S"))
    sim = Simulation(trace_of([0.5, 8.0], duration=12.0), [profile], policy, SimConfig(gpus=1))
    sim.run()
    default = S.DEFAULT_CONFIG.default_cold_start_s
    assert default == 2.0
    assert [policy.at(t).cold_start_s for t in (0.0, 0.5, 1.0, 2.0, 3.0)] == [default] * 5
    assert [policy.at(t).cold_start_s for t in (4.0, 5.0, 8.0)] == [3.0] * 3
    assert policy.at(8.0).activator_queue == 1 and policy.at(8.0).ready == 0


def test_cold_starts_are_waited_for_starts_from_zero():
    """Every replica start counts in replica_starts; a start from zero counts as a cold start
    only when a request waits for it (arrives before its first replica is ready), as the
    gateway counts one. Cold start 1 s; the schedule: 3 from zero at 0 (ready 1.0; the request
    at 0.5 waits: cold start 1), 0 at 5; 1 at 10 (ready 11; the request at 12 waits for nothing:
    a pre-warm), 0 at 15; 2 at 20 (ready 21; 20.5 waits: cold start 2); 3 at 22 (a scale-out).
    Replica starts 3 + 1 + 2 + 1 = 7, cold starts 2."""
    schedule = {0: [(0, 3)], 5: [(0, 0)], 10: [(0, 1)], 15: [(0, 0)], 20: [(0, 2)], 22: [(0, 3)]}
    sim = Simulation(trace_of([0.5, 12.0, 20.5, 22.5], duration=25.0), [P10], Starting(schedule, cold=1.0),
                     SimConfig(gpus=1))
    record = sim.run()
    assert (record["replica_starts"], record["cold_starts"]) == (7, 2)
    assert record["served"] == 4


def test_every_function_is_looked_at_from_its_deploy():
    """The first look at each function is at t=0, before any request: f0's first request is at
    3.7, f1 has none (looked at once, at its deploy; at zero with nothing held it is not asked
    again)."""
    policy = Scripted(lambda now: ScaleDecision(0, "S"))
    Simulation(trace_of([3.7], duration=5.0, functions=2), [P10, P10], policy, SimConfig(gpus=1)).run()
    firsts = {}
    for now, snapshot in policy.seen:
        firsts.setdefault(snapshot.function, now)
    assert firsts == {"f0": 0.0, "f1": 0.0}
    assert [now for now, s in policy.seen if s.function == "f1"] == [0.0]
    assert any(now == 3.7 and s.activator_queue == 1 for now, s in policy.seen if s.function == "f0")


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_one_start_for_every_reactive_policy(monkeypatch, start):
    """simulate(start=...) starts every reactive policy the same way and says so in the record;
    the scheduled baselines follow their schedules. Poisson 5/s on 2 functions: warm, each
    function has a replica when the trace starts (warm_start) and none waits; cold, each
    function's first request waits for a start from zero."""
    trace = make_trace("poisson", functions=2, seconds=10, seed=3, rate=5)
    Recording.instances = []
    monkeypatch.setattr(S, "Simulation", Recording)
    names = ["shoal", "shoal-fixed", "kpa", "ray", "static"]
    result = simulate(trace, names, SimConfig(gpus=2), seed=1, start=start)
    assert result["cluster"]["start"] == start
    for name in names[:-1]:
        record = result["policies"][name]
        assert record["start"] == start, name
        assert (record["cold_starts"] >= 2) if start == "cold" else (record["cold_starts"] == 0), name
    assert result["policies"]["static"]["start"] == "scheduled"
    with pytest.raises(ValueError, match="start"):
        simulate(trace, ["shoal"], SimConfig(gpus=2), start="hot")


def test_shoal_fixed_keeps_its_slices():
    """One lone, nearly idle replica (1 request a second of 10 ms: duty 0.01 <= 0.15, p95 10 ms
    x 2 within the 800 ms target) with slice_window_s 5: shoal halves its slice (0.25 -> 0.125),
    shoal-fixed (slice hints off) keeps 0.25. Not before its start from zero (a rise of one
    replica for the first request, held at t = 1) has decayed to half a replica, at
    1 + 600 ln 2 = 416.9 s: the hint comes at 417."""
    trace = trace_of(np.arange(0.5, 480.0, 1.0), duration=480.0)
    profiles = [Profile("p", ((1, 10.0),), 0.25, 0.25, cold_start_s=1.0, slo_ms=1000)]
    Recording.instances = []
    result = {}
    for name in ("shoal", "shoal-fixed"):
        sim = Recording(trace, profiles, S.ShoalPolicy(S.PolicyConfig(slice_window_s=5.0, slice_hints=name == "shoal"),
                                                       name=name), SimConfig(gpus=1))
        result[name] = (sim.run(), sim._slice_of[0])
    assert result["shoal"][1] == 0.125 and result["shoal-fixed"][1] == 0.25
    assert result["shoal"][0]["served"] == result["shoal-fixed"][0]["served"] == 480
    # the same load ending at 416 s: no hint yet (the rise of the start from zero is over half a replica)
    early = Recording(trace_of(np.arange(0.5, 416.0, 1.0), duration=416.0), profiles,
                      S.ShoalPolicy(S.PolicyConfig(slice_window_s=5.0), name="shoal"), SimConfig(gpus=1))
    early.run()
    assert early._slice_of[0] == 0.25


def test_a_lone_replica_moves_to_the_slice_its_policy_asks():
    """The load above: the hint to 1/8 comes at the look at 417 s. Before, only replicas started
    after a hint got its slice, and this one, never idle long enough to go to zero, kept 1/4 to
    the end (120 slice-s). Now a replica on 1/8 starts at once (a 1 s start, charged from the
    tick it was asked in: 2 ticks x 1/8) and takes over at the tick start at 418 s: requests 418
    to 479 run on it at 20 ms (1/4 / 1/8 = twice the profile's 10 ms), 62 ticks x 1/8 held less:
    120 - 7.75 + 0.25 = 112.5 slice-s; the same requests within the SLO."""
    trace = trace_of(np.arange(0.5, 480.0, 1.0), duration=480.0)
    profiles = [Profile("p", ((1, 10.0),), 0.25, 0.25, cold_start_s=1.0, slo_ms=1000)]
    runs = {}
    for moves in (True, False):
        Recording.instances = []
        sim = Recording(trace, profiles, S.ShoalPolicy(S.PolicyConfig(slice_window_s=5.0), name="shoal"),
                        SimConfig(gpus=1, move_to_slice=moves))
        record = sim.run()
        (slot,) = sim.slots[0]
        runs[moves] = (record, float(sim.servers.slice[slot]), np.round(np.array(sim.latencies) * 1000.0, 3))
    (moved, moved_slice, moved_ms), (kept, kept_slice, kept_ms) = runs[True], runs[False]
    assert (moved_slice, kept_slice) == (0.125, 0.25)
    assert kept["replica_slice_seconds"] == pytest.approx(120.0)
    assert moved["replica_slice_seconds"] == pytest.approx(112.5)
    assert (moved["replica_starts"], kept["replica_starts"]) == (2, 1)  # the move is a start, not a cold one
    assert moved["cold_starts"] == kept["cold_starts"] and moved["slo_attainment"] == kept["slo_attainment"]
    assert np.flatnonzero(moved_ms == 20.0).tolist() == [1] + list(range(418, 480))  # [1]: queued behind the first
    assert np.flatnonzero(kept_ms == 20.0).tolist() == [1]


def test_a_look_that_scales_calls_a_move_off_and_its_slice_is_given_back():
    """The load above with a 20 s start: the move asked at the tick's end at 421 s (its replica
    ready at 441) is called off by a look that asks for two replicas at 425: its slice is released
    at once and the scale-up's replica placed on 1/8 beside the old one on 1/4."""
    trace = trace_of(np.arange(0.5, 480.0, 1.0), duration=480.0)
    profiles = [Profile("p", ((1, 10.0),), 0.25, 0.25, cold_start_s=20.0, slo_ms=1000)]
    seen = {}

    class Scaled(Recording):
        def _decide_all(self, t1):
            super()._decide_all(t1)
            if t1 == 425.0:
                seen["before"] = dict(self._moves)
                self._apply(0, ScaleDecision(2, "BURST"), t1)
                seen["after"] = (dict(self._moves), "f0-2" in self.cluster,
                                 sorted(float(self.servers.slice[s]) for s in self.slots[0]))

    Recording.instances = []
    Scaled(trace, profiles, S.ShoalPolicy(S.PolicyConfig(slice_window_s=5.0), name="shoal"), SimConfig(gpus=1)).run()
    assert seen["before"] == {0: ("f0-2", "f0-1", 441.0, 0.125, 0)}
    assert seen["after"] == ({}, False, [0.125, 0.25])


def test_cli_starts_cold_on_request(tmp_path, capsys):
    out = tmp_path / "o.json"
    rc = cli.main(["--trace", "poisson", "--rate", "5", "--functions", "2", "--seconds", "10", "--policy",
                   "shoal-fixed,static", "--warmup-s", "0", "--start", "cold", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["cluster"]["start"] == "cold" and result["policies"]["shoal-fixed"]["start"] == "cold"
    assert result["policies"]["shoal-fixed"]["cold_starts"] >= 2  # each function's first request waits
    assert "start cold" in capsys.readouterr().out


# ---------------------------------------------------------------------- a full cluster shared

WHOLE = Profile("whole", ((1, 10.0),), 1.0, 1.0, cold_start_s=2.0, slo_ms=1000.0)


def keeper_policy(lends: bool) -> S._Reactive:
    """f0 keeps its one replica whatever comes; f1 wants one once a request comes (and keeps it)."""
    def step(snapshot, spec, state, now):
        wanted = snapshot.function == "f0" or snapshot.activator_queue > 0 or snapshot.ready + snapshot.starting > 0
        return ScaleDecision(int(wanted), "KEEP"), state

    policy = S._Reactive("keeper", step, lambda: None)
    policy.lends = lends
    return policy


@pytest.mark.parametrize("lends", [True, False])
def test_an_idle_replica_gives_its_slice_to_a_function_at_zero_in_the_same_tick(lends):
    """One GPU, held whole by f0's replica, idle since its one request at 0.5 s. f1's first request
    comes at 40.5 s. Lending: f0's replica is taken back (its cost: ~0.018 rps over the 120 s
    window, 20 s of its 60 s keep-alive left: chance 1 - e^(-0.018 x 20) ~ 0.3 x 1.02 misses < 1:
    IDLE) and f1's placed at 40.5 s, ready at 42.5 s: 2.01 and 1.92 s for its requests. Without,
    f1 cannot be placed and its requests wait past the end of the run."""
    sim = Recording(trace_of([0.5, 40.5, 40.6], [0, 1, 1], duration=45.0, functions=2), [WHOLE, WHOLE],
                    keeper_policy(lends), SimConfig(gpus=1), initial={0: 1})
    record = sim.run()
    if lends:
        (slot,) = sim.slots[1]
        assert sim.servers.ready_at[slot] == pytest.approx(40.5 + 2.0)  # placed at the request, not a tick later
        assert ms(sim.latencies) == pytest.approx([10.0, 1920.0, 2010.0])  # the second behind the first
        assert record["takebacks"] == {"idle": 1} and sim.n_srv.tolist() == [0, 1]
        assert record["unplaceable"] == 0 and record["timed_out"] == 0
    else:
        assert ms(sim.latencies) == pytest.approx([10.0]) and record["timed_out"] == 2
        assert record["takebacks"] == {} and record["unplaceable"] > 0 and sim.n_srv.tolist() == [1, 0]


def test_a_replica_started_in_the_tick_for_a_waiting_request_is_its_functions_floor():
    """One GPU, two functions at zero: f1's first request at 10.3 s, f0's at 10.6 s, the same
    tick. f1's look (the first request's) places its replica; at f0's, f1's request waits at the
    gateway for that starting replica, so it is f1's floor, and f0 is held short. f1's replica is
    ready at 12.3 s and answers; quiet since, it is kept, and f0's floor takes it at 14 s (ready
    at 16 s: 5.41 s for f0's request). Before, the looks went by function (f0's first) and read
    only the asking function's requests as held: f0's starting replica, its request not yet
    counted, was idle at no cost, f1 took it at 10.3 s and f0's request waited to the end."""
    sim = Recording(trace_of([10.3, 10.6], [1, 0], duration=20.0, functions=2), [WHOLE, WHOLE],
                    keeping(), SimConfig(gpus=1))
    record = sim.run()
    assert ms(sim.latencies) == pytest.approx([2010.0, 5410.0])  # f1 through its cold start, then f0
    assert record["takebacks"] == {"kept": 1} and record["timed_out"] == 0
    assert record["held_short_by_rank"] == {"floor": 4}  # f0 at 10.6 s and the ends of ticks 11-13 s


def test_a_look_between_ticks_counts_its_held_requests_for_that_look_only():
    """f0's one request at 10.3 s is held through its cold start (ready at 12.3 s) and answered;
    no other comes. From the tick after it was answered its need is 0, so its kept replica ranks
    by its take-back cost. Before, the look at 10.3 s left its held request behind: every tick's
    end read f0 as one request waiting, need 1, to the run's end."""
    sim = Recording(trace_of([10.3], [0], duration=45.0, functions=1), [WHOLE], keeping(), SimConfig(gpus=1))
    sim.run()
    assert ms(sim.latencies) == pytest.approx([2010.0])
    assert sim._needs and all(need.tolist() == [0] for _, need in sim._needs)  # the last 30 s: 16 .. 45 s
    assert sim._traffic_and_need()[0].tolist() == [0.0]


def test_a_busy_function_keeps_its_replica_and_the_newcomer_is_held_short():
    """As above, but f0 serves a request every 0.2 s to the end: its one replica is its floor,
    never taken; f1's first replica is held short at its request (40.5 s) and at the end of
    each tick its requests wait (41 .. 45 s): 6 times."""
    f0 = np.arange(0.1, 45.0, 0.2)
    times = np.concatenate([f0, [40.5, 40.6]])
    fids = np.concatenate([np.zeros(len(f0), int), [1, 1]])
    order = np.argsort(times, kind="stable")
    sim = Simulation(trace_of(times[order], fids[order], duration=45.0, functions=2), [WHOLE, WHOLE],
                     keeper_policy(True), SimConfig(gpus=1), initial={0: 1})
    record = sim.run()
    assert record["takebacks"] == {} and sim.n_srv.tolist() == [1, 0]
    assert record["held_short"] == {"f1": 6}, record
    assert record["held_short_by_rank"] == {"floor": 6}, record


def test_a_saturated_cluster_is_shared_near_the_oracle():
    """12 functions at 20 req/s, Gamma CV 4, on the GPUs of which the oracle's peak is about 80 %
    (3.125 of 4), counted from the start: Shoal within 1 point of the oracle's SLO attainment
    (99.5 % against 100 % when written), with slices taken back and replicas held short; the
    same policy without sharing (80 %) loses far more."""
    from loadtests.bench.policy import saturated_gpus

    trace = make_trace("gamma", functions=12, seconds=150.0, seed=1, rate=20.0, cv=4.0)
    profiles = S.assign_profiles(trace, 1)
    peak, gpus = saturated_gpus(trace, profiles)
    assert 0.75 <= peak / gpus <= 0.9
    config = SimConfig(gpus=gpus)
    result = simulate(trace, ["shoal", "oracle"], config, seed=1, profiles=profiles)["policies"]
    shoal, oracle = result["shoal"], result["oracle"]
    assert shoal["slo_attainment"] >= oracle["slo_attainment"] - 0.01
    assert sum(shoal["takebacks"].values()) > 0 and set(shoal["held_short"]) <= set(trace.functions)
    assert sum(shoal["held_short"].values()) == sum(shoal["held_short_by_rank"].values()) > 0
    alone = ShoalPolicy()
    alone.lends = False
    off = Simulation(trace, profiles, alone, config, warm_start(trace, profiles, oracle_counts(trace, profiles, 1.0))).run()
    assert off["slo_attainment"] < shoal["slo_attainment"] - 0.1 and off["takebacks"] == {}


# ---------------------------------------------------------------------- time-sharing

HALF = Profile("half", ((1, 10.0),), 0.5, 0.5, cold_start_s=2.0, slo_ms=1000.0, memory_mib=1024)


def keeping(*kept: str) -> S._Reactive:
    """`kept` keep one replica whatever comes; the others want one once a request comes."""
    def step(snapshot, spec, state, now):
        wanted = snapshot.function in kept or snapshot.activator_queue > 0 or snapshot.ready + snapshot.starting > 0
        return ScaleDecision(int(wanted), "KEEP"), state

    policy = S._Reactive("keeper", step, lambda: None)
    policy.lends = True
    return policy


def _two_busy_halves_and_a_newcomer(every_s: float, share_busy: float):
    """One GPU held by f0's and f1's half slices, each answering a request every `every_s`
    (10 ms each) to the end; f2's first request at 10.5 s, its second at 10.6 s."""
    busy = np.arange(0.05, 30.0, every_s)
    times = np.concatenate([busy, busy, [10.5, 10.6]])
    fids = np.concatenate([np.zeros(len(busy), int), np.ones(len(busy), int), [2, 2]])
    order = np.argsort(times, kind="stable")
    sim = Recording(trace_of(times[order], fids[order], duration=30.0, functions=3), [HALF] * 3,
                    keeping("f0", "f1"), SimConfig(gpus=1, time_share_busy=share_busy), initial={0: 1, 1: 1})
    return sim, sim.run()


def test_a_first_replica_time_shares_a_quiet_device():
    """f0 and f1 each busy 2 x 10 ms a second on half the GPU: 0.02 x 0.5 x 2 = 0.02 of it,
    under 0.5, so f2's first replica, with no slice free and no replica idle (both had requests
    in the tick), time-shares the GPU at its request: ready at 12.5 s, its requests answered in
    2.01 and 1.92 s (the second behind the first; 1.5 GPUs of slices at 0.02 busy run nobody
    slower). Off (0): it is held short at its request and at every tick's end to 30 s, 21 times,
    and its two requests wait out the run."""
    sim, record = _two_busy_halves_and_a_newcomer(0.5, 0.5)
    assert record["time_shared"] == 1 and record["held_short"] == {} and record["takebacks"] == {}
    (slot,) = sim.slots[2]
    assert sim.servers.ready_at[slot] == pytest.approx(12.5)
    assert sim.cluster.over_units("sim:0") > 0 and record["timed_out"] == 0
    late = sorted(lat for lat in sim.latencies if lat > 1.0)
    assert ms(late) == pytest.approx([1920.0, 2010.0])  # the second behind the first
    sim, record = _two_busy_halves_and_a_newcomer(0.5, 0.0)
    assert record["time_shared"] == 0 and record["held_short"] == {"f2": 21} and record["timed_out"] == 2


def test_a_busy_device_is_not_time_shared():
    """f0 and f1 each answer a request every 10 ms (10 ms each): busy the whole tick, 1.0 of the
    GPU, over 0.5: f2 is held short 21 times, as without time-sharing."""
    sim, record = _two_busy_halves_and_a_newcomer(0.01, 0.5)
    assert record["time_shared"] == 0 and record["held_short"] == {"f2": 21}


def test_time_shared_replicas_run_slower_only_when_their_work_exceeds_the_device():
    """Three half slices on one GPU (1.5 of it). Each busy a whole tick at its own speed asks
    1.5 of the GPU: every replica 1.5x slower, and stays so (busy 1.5 s a tick then, 1.5 / 1.5
    at its own speed). Busy 0.2 s each while 1.5x slower: 0.2 / 1.5 x 0.5 x 3 = 0.2 of the GPU
    at their own speed, nobody slower."""
    sim = Simulation(trace_of([], duration=1.0, functions=3), [HALF] * 3, keeping(), SimConfig(gpus=1))
    for fid in (0, 1):
        sim._place(fid, sim._demand(fid), 0.0)
    assert sim._stretch(10.0) is None  # nothing time-shared
    assert sim._time_share(sim._demand(2), 0.0, sim._device_busy(0.0))
    slots = np.flatnonzero(sim.servers.alive)
    n_f = np.ones(3)
    alone, _ = sim._service_times(n_f, slots, 10.0, 1.0)
    sim.tick_busy[:] = 1.0
    assert sim._stretch(10.0).tolist() == [1.5]
    shared, _ = sim._service_times(n_f, slots, 10.0, 1.0, sim._shared_on)
    assert shared == pytest.approx(alone * 1.5)
    sim.tick_busy[:] = 1.5
    assert sim._stretch(10.0).tolist() == [1.5]
    sim.tick_busy[:] = 0.2
    assert sim._stretch(10.0).tolist() == [1.0]


def test_only_a_first_replica_takes_a_kept_one():
    """f0 answered every 2 s until 8.5 s (KEPT at 10.5 s, as in
    test_a_quiet_device_is_time_shared_before_a_kept_replica_is_taken); f1, on the GPU's other half,
    answers a request every 10 ms (10 ms each: 1.0 busy second a second, 2 replicas at duty
    0.9) and wants a second replica from 10 s on: a needed one, not a first. It is held short
    at every tick's end from 10 s to 20 s (11 times) and f0 keeps its slice, as live, where a
    further replica takes only idle ones (a needed one took f0's kept one before)."""
    busy = np.arange(0.005, 20.0, 0.01)
    f0 = [0.5, 2.5, 4.5, 6.5, 8.5]
    times = np.concatenate([f0, busy])
    fids = np.concatenate([np.zeros(len(f0), int), np.ones(len(busy), int)])
    order = np.argsort(times, kind="stable")

    def step(snapshot, spec, state, now):
        return ScaleDecision(2 if snapshot.function == "f1" and now >= 10.0 else 1, "KEEP"), state

    policy = S._Reactive("keeper", step, lambda: None)
    policy.lends = True
    sim = Simulation(trace_of(times[order], fids[order], duration=20.0, functions=2), [HALF] * 2, policy,
                     SimConfig(gpus=1, time_share_busy=0.0), initial={0: 1, 1: 1})
    record = sim.run()
    assert record["takebacks"] == {} and sim.n_srv.tolist() == [1, 1]
    assert record["held_short_by_rank"] == {"need": 11}, record


def _f1_wants_a_second_quarter(f0: np.ndarray, duration: float) -> tuple[dict, dict, list[int]]:
    """One GPU of four 1/4 slices (a 10 ms model, a 2 s cold start, SLO 1 s): f0 on two with
    requests at `f0`, f1 on one overloaded (a request every 8 ms) and wanting a second from 10 s
    on (a needed one), f2 on one (every 100 ms); a policy that keeps these counts and lends. The
    record's take-backs and held short by rank, and each function's replicas at the end."""
    quarter = Profile("quarter", ((1, 10.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000.0, memory_mib=1024)
    f1, f2 = np.arange(0.004, duration, 0.008), np.arange(0.05, duration, 0.1)
    times = np.concatenate([f0, f1, f2])
    fids = np.concatenate([np.zeros(len(f0), int), np.ones(len(f1), int), np.full(len(f2), 2)])
    order = np.argsort(times, kind="stable")

    def step(snapshot, spec, state, now):
        wanted = {"f0": 2, "f1": 2 if now >= 10.0 else 1, "f2": 1}[snapshot.function]
        return ScaleDecision(wanted, "KEEP"), state

    policy = S._Reactive("keeper", step, lambda: None)
    policy.lends = True
    sim = Simulation(trace_of(times[order], fids[order], duration=duration, functions=3), [quarter] * 3,
                     policy, SimConfig(gpus=1, time_share_busy=0.0), initial={0: 2, 1: 1, 2: 1})
    record = sim.run()
    return record["takebacks"], record["held_short_by_rank"], sim.n_srv.tolist()


def test_a_replica_needed_within_the_delay_window_is_not_headroom_to_another():
    """f0 on two of the four quarters (busy 1.25 s a second until 5 s: need 2; then a request
    every 200 ms: need 1); from 10 s f1 (need 2) wants a second replica, a needed one. f0's
    second is above f0's need of the moment from 6 s, but its need was 2 within the last 30 s
    (the policy's scale-down delay, its edge included: lending.held_need), so it ranks as needed
    and f1 is held short at every tick from 10 s to 35 s (26 times). At 36 s the tick of need 2
    that ended at 5 s has left the window: f1's ask takes it as headroom. Ranked by the need of
    the moment, it was taken at 10 s."""
    def f0(duration: float) -> np.ndarray:
        return np.concatenate([np.arange(0.004, 5.0, 0.008), np.arange(5.1, duration, 0.2)])

    assert _f1_wants_a_second_quarter(f0(35.0), 35.0) == ({}, {"need": 26}, [2, 1, 1])
    assert _f1_wants_a_second_quarter(f0(36.0), 36.0) == ({"headroom": 1}, {"need": 26}, [1, 2, 1])


def test_a_busy_function_quiet_for_one_tick_keeps_its_further_replica():
    """f0 on two of the four quarters (a request every 8 ms, 1.25 busy seconds a second: need 2)
    but none in the tick from 12 s to 13 s; f1, overloaded, wants a second (a needed one) from
    10 s. In the quiet tick f0's replicas are idle, each ranked by its take-back cost as shoal up
    ranks an idle one (lending.idle_rank): about 126 requests a second through a 2 s cold start
    over a 1 s SLO, 1 + 126 x 1 = 127 late requests at a chance near 1, so KEPT, and a further
    replica does not take it: f1 is held short at every tick from 10 s to 16 s. Before, f0's
    second ranked IDLE at half that cost and f1 took it in the quiet tick, which f0, busy again
    the tick after, wanted back."""
    f0 = np.concatenate([np.arange(0.004, 12.0, 0.008), np.arange(13.004, 16.0, 0.008)])
    assert _f1_wants_a_second_quarter(f0, 16.0) == ({}, {"need": 7}, [2, 1, 1])


# ---------------------------------------------------------------------- what reacting can do

def test_held_max_holds_every_past_need_one_tick_late():
    # counts 1, 3, 2, 5 at ticks 0..3, from 1 warm replica: 3 from tick 2, 5 from tick 4, never down
    policy = S.held_max_policy({0: {0: 1, 1: 3, 2: 2, 3: 5}}, {0: 1})
    assert policy.changes == {2: [(0, 3)], 4: [(0, 5)]}
    assert S.held_max_policy({0: {0: 1, 1: 3, 2: 2, 3: 5}}, {0: 1}, factor=1.5).changes == {
        1: [(0, 2)], 2: [(0, 5)], 4: [(0, 8)]}
    assert policy.cold_start_s(PROFILES[0]) == PROFILES[0].cold_start_s  # its starts are cold


def test_held_max_misses_a_need_larger_than_any_before():
    """One replica of 100 ms serves 10 requests in a second; 40 at once at 5 s need 4 replicas
    (1 s SLO): held-max has 1 then (starting 3 more at 6 s, ready at 8 s), so the burst's tail
    misses; the same burst again at 20 s finds 4 ready and all meet the SLO."""
    burst = lambda at: np.full(40, at)  # noqa: E731
    times = np.concatenate([np.arange(0.5, 5.0, 1.0), burst(5.0), burst(20.0)])
    profile = Profile("p", ((1, 100.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000.0)
    trace = trace_of(times, duration=30.0)
    counts = oracle_counts(trace, [profile], 1.0)
    assert counts[0][5] == 4 and counts[0][20] == 4
    sim = Recording(trace, [profile], S.held_max_policy(counts, {0: 1}), SimConfig(gpus=1), {0: 1})
    record = sim.run()
    first, again = sim.latencies[5:45], sim.latencies[45:]
    assert max(again) <= 1.0  # every one of the second burst in time
    assert sum(1 for x in first if x > 1.0) == 30  # 1 replica: 10 answered within 1 s, the other 30 late
    assert record["replica_starts"] == 3


def test_window_max_holds_the_most_of_the_last_w_seconds_and_lets_it_go():
    # counts 1, 3, 2, 5 at ticks 0..3 (none after), from 1: W 2 holds 3 from tick 2, 5 from
    # tick 4 and none from tick 6, when ticks 4 and 5 needed none; W 1 follows each second
    counts = {0: {0: 1, 1: 3, 2: 2, 3: 5}}
    w2 = S.held_max_policy(counts, {0: 1}, window_ticks=2)
    assert w2.changes == {2: [(0, 3)], 4: [(0, 5)], 6: [(0, 0)]} and w2.final == {0: 0}
    assert S.held_max_policy(counts, {0: 1}, window_ticks=1).changes == {
        2: [(0, 3)], 3: [(0, 2)], 4: [(0, 5)], 5: [(0, 0)]}
    # x1.5 rounds up: 2, 5, 3, 8 of the counts; W 2 holds 2 from tick 1, 5 from 2, 8 from 4
    assert S.held_max_policy(counts, {0: 1}, factor=1.5, window_ticks=2).changes == {
        1: [(0, 2)], 2: [(0, 5)], 4: [(0, 8)], 6: [(0, 0)]}
    # a window longer than the trace is held-max until the window passes the last need
    assert S.held_max_policy(counts, {0: 1}, window_ticks=100).changes == {2: [(0, 3)], 4: [(0, 5)], 104: [(0, 0)]}
    # falling needs: as the 5 leaves the window the most left is 3, not the second's own 1
    assert S.held_max_policy({0: {0: 5, 1: 3, 2: 1}}, {0: 5}, window_ticks=2).changes == {
        3: [(0, 3)], 4: [(0, 1)], 5: [(0, 0)]}
    # a function with no counts goes to zero from its warm start; a window under a tick is refused
    assert S.held_max_policy({0: {}}, {0: 2}, window_ticks=3).changes == {1: [(0, 0)]}
    with pytest.raises(ValueError, match="window_ticks"):
        S.held_max_policy(counts, {0: 1}, window_ticks=0)


def test_window_max_holds_what_a_brute_force_max_over_the_window_holds():
    rng = np.random.default_rng(7)
    for _ in range(50):
        ticks, window, factor = int(rng.integers(1, 40)), int(rng.integers(1, 12)), float(rng.choice([1.0, 1.1, 1.5]))
        need = rng.integers(0, 9, ticks) * (rng.random(ticks) < 0.7)
        counts = {0: {t: int(n) for t, n in enumerate(need) if n}}
        start = int(rng.integers(0, 6))
        changes = S.held_max_policy(counts, {0: start}, factor, window_ticks=window).changes
        held, expect = start, {}
        padded = np.concatenate([need, np.zeros(window + 1, int)])
        for t in range(len(padded)):  # at t + 1: the most of ticks t - W + 1 .. t, times the factor, rounded up
            want = math.ceil(padded[max(0, t - window + 1):t + 1].max() * factor - 1e-9)
            if want != held:
                held = expect[t + 1] = want
        assert {t: [(0, n)] for t, n in expect.items()} == changes, (need.tolist(), window, factor, start)


def test_window_max_misses_a_need_again_once_its_window_has_let_it_go():
    """The two bursts of held-max's test (40 requests at 5 s and 20 s, 4 replicas' worth, 1 s
    SLO, a 2 s cold start): with a 5 s memory the function goes to zero at 11 s, when no second
    of its window needed a replica, so the second burst waits a cold start whole, all 40 late;
    with 30 s it finds the first burst's 4 replicas and all meet the SLO."""
    burst = lambda at: np.full(40, at)  # noqa: E731
    times = np.concatenate([np.arange(0.5, 5.0, 1.0), burst(5.0), burst(20.0)])
    profile = Profile("p", ((1, 100.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000.0)
    trace = trace_of(times, duration=30.0)
    counts = oracle_counts(trace, [profile], 1.0)
    late = {}
    for window in (5, 30):
        sim = Recording(trace, [profile], S.held_max_policy(counts, {0: 1}, window_ticks=window),
                        SimConfig(gpus=1), {0: 1})
        sim.run()
        late[window] = sum(1 for x in sim.latencies[45:] if x > 1.0)
        assert sum(1 for x in sim.latencies[5:45] if x > 1.0) == 30  # the first burst as held-max's
    assert late == {5: 40, 30: 0}


def test_forced_cold_counts_first_requests_of_functions_started_cold():
    """f0 warm; f1's first request at 2 s (cold start 2 s > SLO 1 s): forced; f2's first at 0.5 s,
    before the 1 s warm-up: not counted; f3's profile starts within its SLO: not forced."""
    slow = Profile("slow", ((1, 10.0),), 0.25, 0.25, cold_start_s=2.0, slo_ms=1000.0)
    quick = Profile("quick", ((1, 10.0),), 0.25, 0.25, cold_start_s=0.5, slo_ms=1000.0)
    trace = trace_of([0.1, 0.5, 2.0, 2.5, 3.0], [0, 2, 1, 1, 3], duration=4.0, functions=4)
    assert S.forced_cold(trace, [slow, slow, slow, quick], {0: 1}, warmup_s=1.0) == 1


def _a_quiet_half_and_a_busy_half(f0_times, f2_at: float, share_busy: float):
    """One GPU held by f0's and f1's half slices; f1 answers a request every 0.5 s to the end,
    f0 at `f0_times`; f2's first request at `f2_at`, no slice free."""
    busy = np.arange(0.05, 110.0, 0.5)
    times = np.concatenate([np.asarray(f0_times, float), busy, [f2_at]])
    fids = np.concatenate([np.zeros(len(f0_times), int), np.ones(len(busy), int), [2]])
    order = np.argsort(times, kind="stable")
    sim = Simulation(trace_of(times[order], fids[order], duration=110.0, functions=3), [HALF] * 3,
                     keeping("f0", "f1"), SimConfig(gpus=1, time_share_busy=share_busy), initial={0: 1, 1: 1})
    return sim.run()


@pytest.mark.parametrize("share_busy", [0.5, 0.0])
def test_an_idle_replica_cheap_to_take_is_lent_before_a_device_is_time_shared(share_busy):
    """f0 answered once, at 0.5 s; at f2's request (100.5 s) its 60 s keep-alive is long over:
    taking it costs nothing (IDLE), so f2 takes its slice, time-sharing or not."""
    record = _a_quiet_half_and_a_busy_half([0.5], 100.5, share_busy)
    assert record["takebacks"] == {"idle": 1} and record["time_shared"] == 0


@pytest.mark.parametrize("share_busy, taken, shared", [(0.5, {}, 1), (0.0, {"kept": 1}, 0)])
def test_a_quiet_device_is_time_shared_before_a_kept_replica_is_taken(share_busy, taken, shared):
    """f0 answered every 2 s until 8.5 s (about 0.5 a second, within its keep-alive): taking it
    likely costs a late request (chance ~1 x (1 + 0.5 x (2 - 1)) misses = 1.5: KEPT). With
    time-sharing f2's first replica shares the quiet GPU and f0 keeps its slice, as the live
    controller does; without, f2 takes f0's."""
    record = _a_quiet_half_and_a_busy_half([0.5, 2.5, 4.5, 6.5, 8.5], 10.5, share_busy)
    assert record["takebacks"] == taken and record["time_shared"] == shared


@pytest.mark.parametrize("deployed_at, first_looks", [
    # deployed at 0 (the default): looked at then, and f0 again at its request (held, 0.4 s)
    pytest.param(0.0, {"f0": 0.0, "f1": 0.0}, id="at 0"),
    # deployed at 0.3, between the ticks at 0 and 1: looked at then, as a deploy pokes the live
    # loop, and f0 again at its request's poke (0.4)
    pytest.param(0.3, {"f0": 0.3, "f1": 0.3}, id="between two ticks"),
    # deployed before the trace starts: looked at then, before the first tick
    pytest.param(-1.0, {"f0": -1.0, "f1": -1.0}, id="before the trace"),
])
def test_the_first_look_is_at_the_deploy(deployed_at, first_looks):
    """live looks at a function when it is deployed (the deploy pokes its loop), then on its
    ticks and at a request's poke (docs/simlive.md, "The deploy's own look"): one deploy look
    each, wherever it falls against the ticks."""
    policy = Scripted(lambda now: ScaleDecision(0, "S"))
    Simulation(trace_of([0.4], duration=3.0, functions=2), [P10, P10], policy, SimConfig(gpus=1),
               deployed_at=deployed_at).run()
    firsts = {}
    for now, snapshot in policy.seen:
        firsts.setdefault(snapshot.function, now)
    assert firsts == first_looks
    assert [now for now, s in policy.seen if s.function == "f1"] == [deployed_at]  # at zero, none held: once
    f0 = [now for now, s in policy.seen if s.function == "f0"]
    assert f0[:2] == [deployed_at, 0.4] and len(f0) == len(set(f0))  # then its request's poke


def test_a_deploy_time_must_be_finite_and_before_the_requests():
    with pytest.raises(ValueError, match="deployed_at"):
        Simulation(trace_of([0.4]), [P10], Scripted(lambda now: ScaleDecision(0, "S")), SimConfig(gpus=1),
                   deployed_at=math.nan)
    with pytest.raises(ValueError, match="before its function's deploy"):
        Simulation(trace_of([0.4]), [P10], Scripted(lambda now: ScaleDecision(0, "S")), SimConfig(gpus=1),
                   deployed_at=0.5)


def test_an_arrival_on_the_last_ticks_bound_is_run(tmp_path):
    """A csv trace ends just past its last timestamp; a last arrival at a whole second (79.0 s
    here, 39.5 s stretched 2x) lies on the bound after the last tick that duration gives, and
    was run by none: 119 of 120 counted. Every policy now serves all 120."""
    arrivals = tmp_path / "a.csv"
    stamps = [f"2023-11-16 18:00:{s:02d}.{ms:03d},1,1" for s in range(40) for ms in (0, 250, 500)]
    arrivals.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(stamps) + "\n")
    trace = make_trace("csv", path=str(arrivals), compress=0.5)
    assert trace.times[-1] == 79.0 and math.ceil(trace.duration_s - 1e-9) == 79
    result = S.simulate(trace, ["shoal", "kpa", "static", "oracle"], S.SimConfig(gpus=1), seed=1)
    for name, record in result["policies"].items():
        assert (record["requests"], record["served"]) == (120, 120), name


@pytest.mark.parametrize("lag_s, at, seen", [
    (0.0, 10.0, 1),  # at the first request's instant: one held
    (0.0067, 10.0067, 3),  # a lag as live runs time it (4.3-7.8 ms): the clump of three held by then
    (0.004, 10.004, 2),
])
def test_a_poke_looks_its_lag_after_the_request(lag_s, at, seen):
    """A function at zero; three requests at 10.0, 10.0033 and 10.0045 s (the conversation trace's
    opening clump): the look the first one pokes comes poke_lag_s after it and reads the
    requests held by then (live: docs/simlive.md, "The poke's lag, timed per run")."""
    profile = Profile("b", ((1, 10.0),), 0.25, 0.25, cold_start_s=1.0, slo_ms=10_000)
    policy = Scripted(lambda now: ScaleDecision(1 if now >= 10.0 else 0, "S"))  # at zero until the clump
    sim = Simulation(trace_of([10.0, 10.0033, 10.0045], duration=12.0), [profile], policy,
                     SimConfig(gpus=1, poke_lag_s=lag_s))
    sim.run()
    poked = [(t, s) for t, s in policy.seen if 10.0 <= t < 11.0]
    assert len(poked) == 1 and poked[0][0] == pytest.approx(at) and poked[0][1].activator_queue == seen


def test_a_poke_lag_is_checked():
    with pytest.raises(ValueError, match="poke_lag_s"):
        SimConfig(poke_lag_s=-0.001)
    with pytest.raises(ValueError, match="poke_lag_s"):
        SimConfig(poke_lag_s=1.0)
