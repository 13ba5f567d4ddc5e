"""What Shoal's policy does beyond duty and concurrency, table-driven on a fake clock:
the work of a model that batches (at full batches, from its measured batch latencies),
the request rate averaged over rate_window_s, the error budget (requests over the SLO
add a spare replica), and the pieces they use from autoscaler.metrics and the
simulator (fraction_over, batch_size). Unless a case says otherwise: ScalingSpec() =
SLO p95 100 ms (target 80 % = 80 ms, half of it 40 ms for a batch), target duty 0.7,
target concurrency 4, max 8 replicas; PolicyConfig() defaults."""

from __future__ import annotations

import math

import pytest

from autoscaler.loop import policy_table
from autoscaler.metrics import (
    batch_window,
    fraction_over,
    learn_batch_latency,
    parse_replica_metrics,
)
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import (
    DEFAULT_CONFIG,
    Budget,
    PolicyConfig,
    PolicyState,
    _budget_sample,
    _duty_sample,
    _rate_sample,
    batch_budget_s,
    decide,
    estimate_need,
    full_batch,
)
from autoscaler.simulator import batch_size
from functions.spec import ScalingSpec

SPEC = ScalingSpec()
CFG = DEFAULT_CONFIG
RESNET = ((1.0, 0.004), (8.0, 0.006), (32.0, 0.014))  # rows, seconds per batch
WHISPER = ((1.0, 0.030), (4.0, 0.045))


def snap(ready=1, rps=0.0, inflight=0.0, p95=None, service=None, batch=(), over=0.0, at=0.0, duty=None,
         answered=None):
    """`answered`: the gateway's answered rate; the replicas' rps unless given."""
    return MetricsSnapshot("f", at, ready=ready, inflight=inflight, rps=rps, p95_s=p95, service_s=service,
                           duty=(0.0,) * ready if duty is None else duty, batch_latency_s=batch, over_slo=over,
                           answered_rps=rps if answered is None else answered)


# ---------------------------------------------------------------------- full_batch

FULL_BATCH_CASES = [
    # id, latencies, budget s, expected (rows, seconds) or None
    ("no-batching-one-size", ((1.0, 0.004),), 0.040, None),
    ("unknown", (), 0.040, None),
    ("all-fit-take-the-largest", RESNET, 0.040, (32.0, 0.014)),
    # 8 + (10 - 6) / (14 - 6) x 24 = 20 rows, 6 + (20 - 8) / 24 x 8 = 10 ms
    ("interpolated-whole", RESNET, 0.010, (20.0, 0.010)),
    # 8 + (7 - 6) / 8 x 24 = 11 rows, 6 + 3 / 24 x 8 = 7 ms
    ("interpolated-11", RESNET, 0.007, (11.0, 0.007)),
    ("exactly-the-middle-size", RESNET, 0.006, (8.0, 0.006)),
    # under 8's 6 ms: 1 + (5 - 4) / (6 - 4) x 7 = 4.5 -> 4 rows, 4 + 3 / 7 x 2 = 4.857 ms
    ("between-1-and-8", RESNET, 0.005, (4.0, 0.004 + 3 / 7 * 0.002)),
    ("slower-than-budget-runs-one", RESNET, 0.002, (1.0, 0.004)),
    ("whisper-in-200-ms", WHISPER, 0.200, (4.0, 0.045)),
]


@pytest.mark.parametrize("latency, budget, expected", [c[1:] for c in FULL_BATCH_CASES],
                         ids=[c[0] for c in FULL_BATCH_CASES])
def test_full_batch(latency, budget, expected):
    got = full_batch(latency, budget)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


# ---------------------------------------------------------------------- the need of a batching model

BATCH_NEED_CASES = [
    # id, snapshot, expected replicas, view
    # 1,000/s at 32 rows per 14 ms: 1000 x 0.014 / 32 = 0.4375 busy s per s; p95 unknown: / 0.7 = 0.625
    ("resnet-1000-per-s", snap(rps=1000, batch=RESNET), 0.4375 / 0.7, "work"),
    # the duty of replicas running small batches reads high; it is not the work: (0.95 x 4) / 0.7 would be 5.4
    ("duty-ignored-for-batchers", snap(ready=4, rps=1000, batch=RESNET, duty=(0.95,) * 4), 0.4375 / 0.7, "work"),
    # p95 20 ms <= 40 ms: max duty 0.9: 0.4375 / 0.9
    ("resnet-with-headroom", snap(rps=1000, batch=RESNET, p95=0.020), 0.4375 / 0.9, "work"),
    # whisper 1,000/s, SLO 500 ms (target 400, half 200): 4 rows in 45 ms: 11.25 / 0.7 = 16.07
    ("whisper", snap(rps=1000, batch=WHISPER), 11.25 / 0.7, "work"),
    # one replica finishes 32 rows per 14 ms x 80 ms = 182.9 within the target: 400 in flight / 182.9 = 2.19
    ("backlog-drained-at-full-batches", snap(rps=1000, inflight=400, batch=RESNET), 400 / (32 * 0.080 / 0.014),
     "concurrency"),
    # 100 in flight: 0.55 < 0.625: work
    ("small-backlog-is-no-need", snap(rps=1000, inflight=100, batch=RESNET), 0.4375 / 0.7, "work"),
    # p95 120 ms over 80: the SLO boost x1.5 on the work view: 0.625 x 1.5
    ("slo-boost-applies", snap(rps=1000, batch=RESNET, p95=0.120), 0.4375 / 0.7 * 1.5, "slo"),
    # no rate: the non-batching views (duty 0.35 / 0.7 = 0.5)
    ("no-rate-falls-back", snap(batch=RESNET, duty=(0.35,)), 0.5, "work"),
    # at zero, 700 held through a cold start: served in batches too, 700 / 182.9 = 3.83 (by the
    # spec's 4 per replica it would be 175, more than a 100-GPU cluster of 1/4 slices has room for)
    ("held-at-zero-in-batches", MetricsSnapshot("f", 0.0, activator_queue=700, batch_latency_s=RESNET),
     700 / (32 * 0.080 / 0.014), "concurrency"),
]


@pytest.mark.parametrize("snapshot, replicas, by", [c[1:] for c in BATCH_NEED_CASES],
                         ids=[c[0] for c in BATCH_NEED_CASES])
def test_batching_need(snapshot, replicas, by):
    spec = ScalingSpec(slo_p95_ms=500.0) if snapshot.batch_latency_s == WHISPER else SPEC
    need = estimate_need(snapshot, spec, CFG)
    assert need.replicas == pytest.approx(replicas)
    assert need.by == by
    assert need.detail


def test_a_batching_model_from_zero_starts_what_its_backlog_needs_in_batches():
    """decide() at zero replicas with 700 requests held: ceil(700 / 182.9) = 4 replicas."""
    held = MetricsSnapshot("f", 0.0, activator_queue=700, batch_latency_s=RESNET)
    decision, _ = decide(held, ScalingSpec(max_replicas=500), PolicyState(), 0.0, CFG)
    assert (decision.desired, decision.reason) == (4, "COLD_START")


def test_batching_needs_fewer_replicas_than_duty_would():
    """The trap the batching view avoids: resnet at 1,000/s spread over 7 replicas runs
    batches of 1 (4 ms each, 143/s each: duty 0.57), so duty says 7 x 0.57 / 0.7 = 5.7
    replicas; at full batches the same load needs 0.625."""
    spread = snap(ready=7, rps=1000, service=0.004, duty=(1000 / 7 * 0.004,) * 7)
    without = estimate_need(spread, SPEC, CFG)
    with_profile = estimate_need(spread._replace(batch_latency_s=RESNET), SPEC, CFG)
    assert without.replicas == pytest.approx(4.0 / 0.7)
    assert with_profile.replicas == pytest.approx(0.625)


# ---------------------------------------------------------------------- the averaged rate

RATE_CASES = [
    # id, state (rate_avg, inflight_avg, rate_at), rps and in flight now, now, config,
    # expected (rate_avg, inflight_avg, rate_at); both time constants 5 s by default
    ("first-sample-as-is", (None, None, None), (700.0, 7.0), 3.0, CFG, (700.0, 7.0, 3.0)),
    # 1000 + 1000 x (1 - e^-0.2) = 1181.27; 10 + 10 x (1 - e^-0.2) = 11.81
    ("one-second-later", (1000.0, 10.0, 0.0), (2000.0, 20.0), 1.0, CFG,
     (1000 + 1000 * (1 - math.exp(-0.2)), 10 + 10 * (1 - math.exp(-0.2)), 1.0)),
    # 5 s later (one time constant): 1000 + 1000 x (1 - e^-1) = 1632.1
    ("one-tau-later", (1000.0, 10.0, 0.0), (2000.0, 10.0), 5.0, CFG, (1000 + 1000 * (1 - math.exp(-1)), 10.0, 5.0)),
    ("same-instant-unchanged", (1000.0, 10.0, 4.0), (2000.0, 50.0), 4.0, CFG, (1000.0, 10.0, 4.0)),
    ("falls-too", (1000.0, 10.0, 0.0), (0.0, 0.0), 1.0, CFG, (1000 * math.exp(-0.2), 10 * math.exp(-0.2), 1.0)),
    # concurrency_window_s 0: in flight as it is
    ("in-flight-instant", (1000.0, 10.0, 0.0), (1000.0, 40.0), 1.0, PolicyConfig(concurrency_window_s=0.0),
     (1000.0, 40.0, 1.0)),
]


@pytest.mark.parametrize("before, now_values, now, config, expected", [c[1:] for c in RATE_CASES],
                         ids=[c[0] for c in RATE_CASES])
def test_rate_sample(before, now_values, now, config, expected):
    state = PolicyState(rate_avg=before[0], inflight_avg=before[1], rate_at=before[2])
    rps, inflight = now_values
    assert _rate_sample(state, snap(rps=rps, inflight=inflight), now, config) == pytest.approx(expected)


def test_one_busy_second_moves_the_work_view_by_its_weight():
    """Steady 1,000/s for 10 s, then one second of 2,000: the work view reads 1,181/s, not
    2,000 (CV-4 traffic swings this much second to second without a change of load)."""
    state = PolicyState()
    for t in range(11):
        _, state = decide(snap(rps=1000.0, batch=RESNET, at=float(t)), SPEC, state, float(t))
    _, state = decide(snap(rps=2000.0, batch=RESNET, at=11.0), SPEC, state, 11.0)
    assert state.rate_avg == pytest.approx(1000 + 1000 * (1 - math.exp(-0.2)))
    assert state.needs[-1].replicas == pytest.approx(state.rate_avg * 0.014 / 32 / 0.7)


# ---------------------------------------------------------------------- the error budget

BUDGET_CASES = [
    # id, state before (budget, served, served_over, last look at[, held_max, released, released_until]),
    # snapshot, now,
    # expected (budget, served, served_over)
    ("first-look-opens-a-window", (None, 0.0, 0.0, None), snap(rps=100), 5.0, (Budget(5.0), 0.0, 0.0)),
    # 1,000/s for 1 s since the last look, 1 % over: counted, the window (30 s) not over
    ("counts-inside-the-window", (Budget(0.0), 1000.0, 0.0, 9.0), snap(rps=1000, over=0.01), 10.0,
     (Budget(0.0), 2000.0, 10.0)),
    ("no-ready-replica-counts-nothing", (Budget(0.0), 1000.0, 0.0, 9.0), snap(ready=0, rps=1000, over=0.5), 10.0,
     (Budget(0.0), 1000.0, 0.0)),
    # the replicas' rate: a first scrape has none, so the 12 the gateway answered count nothing
    ("a-first-window-unread-counts-nothing", (Budget(0.0), 1000.0, 0.0, 9.0),
     snap(rps=0, answered=12, over=1.0), 10.0, (Budget(0.0), 1000.0, 0.0)),
    # window over at 30: (10 + 1000 x 0.01 = 20) / 30,000 = 0.067 % <= 0.1 %, >= 0.025 %: clean count reset
    ("inside-the-budget", (Budget(0.0, spare=1, clean=3), 29000.0, 10.0, 29.0), snap(rps=1000, over=0.01), 30.0,
     (Budget(30.0, spare=1, clean=0, last_over=20 / 30000), 0.0, 0.0)),
    # (50 + 10) / 30,000 = 0.2 % > 0.1 %: a spare replica
    ("over-the-budget-adds-one", (Budget(0.0), 29000.0, 50.0, 29.0), snap(rps=1000, over=0.01), 30.0,
     (Budget(30.0, spare=1, last_over=60 / 30000), 0.0, 0.0)),
    ("spare-capped", (Budget(0.0, spare=4), 29000.0, 50.0, 29.0), snap(rps=1000, over=0.01), 30.0,
     (Budget(30.0, spare=4, last_over=60 / 30000), 0.0, 0.0)),
    # 0 / 30,000 < 0.025 %: a clean window; the 40th in a row (budget_clean_windows) takes a spare away
    ("clean-window-counted", (Budget(0.0, spare=2, clean=3), 29000.0, 0.0, 29.0), snap(rps=1000), 30.0,
     (Budget(30.0, spare=2, clean=4), 0.0, 0.0)),
    ("fortieth-clean-window-lets-one-go", (Budget(0.0, spare=2, clean=39), 29000.0, 0.0, 29.0), snap(rps=1000), 30.0,
     (Budget(30.0, spare=1, clean=0), 0.0, 0.0)),
    ("no-spare-to-let-go", (Budget(0.0, clean=39), 29000.0, 0.0, 29.0), snap(rps=1000), 30.0,
     (Budget(30.0, clean=40), 0.0, 0.0)),
]


SKIPS = PolicyConfig(budget_skips_starts=True)
SKIP_CASES = [
    # budget_skips_starts: the gateway's answered rate, a start from zero's answers left out
    # the gateway's count, not the replicas' rps: a pre-warmed replica's first window is unread
    # (rps 0) while the gateway answered 12 requests in the second since, 3 of them late
    ("a-first-window-unread-counts", (Budget(0.0), 1000.0, 0.0, 9.0),
     snap(rps=0, answered=12, over=0.25), 10.0, (Budget(0.0), 1012.0, 3.0)),
    # the look after a start from zero (31 were held at the last look): its answers are the
    # requests held through the cold start, the keep-alive's to price, not the budget's
    ("after-a-start-from-zero-counts-nothing", (Budget(0.0), 1000.0, 0.0, 9.0, 31.0),
     snap(rps=0, answered=31, over=1.0), 10.0, (Budget(0.0), 1000.0, 0.0)),
    # nor the next look: the replica was ready just before the last one, its batch answered after it
    ("nor-the-look-after-that", (Budget(0.0), 1000.0, 0.0, 9.0, 0.0, 1),
     snap(rps=12, answered=12, over=1.0), 10.0, (Budget(0.0), 1000.0, 0.0)),
    # nor a look inside the window its rates are read over (PromQL's 30 s: until 38.5)
    ("nor-inside-a-long-window", (Budget(0.0), 1000.0, 0.0, 9.0, 0.0, 0, 38.5),
     snap(rps=12, answered=12, over=1.0), 10.0, (Budget(0.0), 1000.0, 0.0)),
    # a warm function's last replica lost: no replica ready, its requests answered 503, misses
    ("no-replica-ready-after-a-warm-one-counts", (Budget(0.0), 1000.0, 0.0, 9.0),
     snap(ready=0, answered=4, over=1.0), 10.0, (Budget(0.0), 1004.0, 4.0)),
]


@pytest.mark.parametrize("before, snapshot, now, expected", [c[1:] for c in BUDGET_CASES],
                         ids=[c[0] for c in BUDGET_CASES])
def test_budget_sample(before, snapshot, now, expected, config=CFG):
    budget, served, served_over, at, held_max, released, until = (before + (0.0, 0, -math.inf))[:7]
    state = PolicyState(budget=budget, served=served, served_over=served_over, rate_at=at, held_max=held_max,
                        released=released, released_until=until)
    got, got_served, got_over = _budget_sample(state, snapshot, now, config)
    want, want_served, want_over = expected
    assert (got.since, got.spare, got.clean) == (want.since, want.spare, want.clean)
    assert (got.last_over, got_served, got_over) == pytest.approx((want.last_over, want_served, want_over))


@pytest.mark.parametrize("before, snapshot, now, expected", [c[1:] for c in SKIP_CASES],
                         ids=[c[0] for c in SKIP_CASES])
def test_budget_sample_skipping_starts(before, snapshot, now, expected):
    test_budget_sample(before, snapshot, now, expected, SKIPS)


def test_misses_over_the_budget_add_a_replica_with_its_reason():
    """resnet at 1,000/s needs 0.625 -> 1 replica. 0.5 % of requests over the SLO for a
    whole 30-s window: a spare replica, 0.625 + 1 -> 2, reason SLO with the numbers."""
    state, ready, decisions = PolicyState(), 1, []
    for t in range(32):
        decision, state = decide(snap(ready=ready, rps=1000.0, batch=RESNET, over=0.005, at=float(t)), SPEC, state,
                                 float(t))
        decisions.append(decision)
        ready = decision.desired
    assert [d.desired for d in decisions[:30]] == [1] * 30
    assert decisions[30].desired == 2 and decisions[30].reason == "SLO"
    assert "1 spare" in decisions[30].detail and "0.50% of requests over the SLO" in decisions[30].detail


@pytest.mark.parametrize("config, from_zero, late_at, window_s, spare", [
    (SKIPS, True, (2,), 1.0, 0), (SKIPS, True, (3,), 1.0, 0), (SKIPS, False, (2,), 1.0, 1),
    (SKIPS, True, (3, 10), 1.0, 1), (SKIPS, True, (3,), 30.0, 0), (SKIPS, True, (3, 40), 30.0, 1),
    # the default (the replicas' rps): the same start adds a spare or not by the phase
    (CFG, True, (2,), 1.0, 0), (CFG, True, (3,), 1.0, 1)],
    ids=["from-zero-answered-on-the-first-ready-look", "from-zero-answered-a-look-later", "warm",
         "from-zero-then-late-when-warm", "promql-window", "promql-then-late-when-warm",
         "by-rps-answered-on-the-first-ready-look", "by-rps-answered-a-look-later"])
def test_a_start_from_zeros_late_requests_hold_no_spare_at_any_phase(config, from_zero, late_at, window_s, spare):
    """12 requests held through a start from zero (8 held at the look at 1 s), all answered
    late, read by the look that first sees the replica ready (2 s: no rate of the replica's
    yet) or by the next (3 s), as the tick's phase falls; and 5/s within the SLO. Neither
    adds a spare when the budget's window closes at 30 s: a spare cannot prevent the next
    start from zero's misses (the keep-alive prices them). The same 12 late answers from a
    warm replica do (12 / (12 + 5 x 28) = 8 % over, more than 0.1 %), and so do 12 late at
    10 s, once the start's looks are over. Rates read over 30 s (PromQL; `window_s` 30) show
    12 answered at 2-3 s in every look from 3 to 32 s, 0.4/s: those looks are left out, and
    12 late at 39-40 s, shown from 40 s, add a spare when the window closes at 60 s. All with
    budget_skips_starts; by the default, the replicas' rps, the start adds a spare at one
    phase and not at the other (off by the bench's rule: docs/benchmarks.md)."""
    state, decisions = PolicyState(), []
    for t in range(62):
        if from_zero and t < 2:
            s = MetricsSnapshot("f", float(t), starting=1, activator_queue=4 * (t + 1), window_s=window_s)
        else:
            late = sum(12.0 / window_s for at in late_at if at <= t < at + window_s)
            # the first ready look has no rate of the new replica yet (its first scrape); the next has
            s = MetricsSnapshot("f", float(t), ready=1, rps=0.0 if from_zero and t == 2 else 5.0 + late,
                                answered_rps=5.0 + late, over_slo=late / (5.0 + late), p95_s=0.05, service_s=0.01,
                                duty=(0.05,), window_s=window_s)
        decision, state = decide(s, SPEC, state, float(t), config)
        decisions.append(decision)
        if t == 4:
            assert state.released == 0  # the start's two looks are over
    assert state.budget.spare == spare, [(d.desired, d.reason) for d in decisions[28:]]


def test_budget_config_is_validated():
    with pytest.raises(ValueError, match="miss_budget"):
        PolicyConfig(miss_budget=1.5)
    with pytest.raises(ValueError, match="batch_latency_share"):
        PolicyConfig(batch_latency_share=0.0)


# ---------------------------------------------------------------------- fraction_over

FRACTION_CASES = [
    # id, cumulative buckets, bound, expected fraction over it
    ("none", (), 0.1, 0.0),
    ("empty", ((0.1, 0.0), (math.inf, 0.0)), 0.1, 0.0),
    ("on-a-bound", ((0.1, 90.0), (0.25, 99.0), (math.inf, 100.0)), 0.1, 0.10),
    # 90 + 9 x (0.2 - 0.1) / (0.25 - 0.1) = 96 under -> 4 %
    ("interpolated", ((0.1, 90.0), (0.25, 99.0), (math.inf, 100.0)), 0.2, 0.04),
    # inside the first bucket: 90 x 0.05 / 0.1 = 45 under -> 55 %
    ("first-bucket", ((0.1, 90.0), (0.25, 99.0), (math.inf, 100.0)), 0.05, 0.55),
    ("past-the-last-finite", ((0.1, 90.0), (0.25, 99.0), (math.inf, 100.0)), 0.5, 0.01),
    ("all-under", ((0.1, 100.0), (math.inf, 100.0)), 0.2, 0.0),
]


@pytest.mark.parametrize("buckets, bound, expected", [c[1:] for c in FRACTION_CASES], ids=[c[0] for c in FRACTION_CASES])
def test_fraction_over(buckets, bound, expected):
    assert fraction_over(buckets, bound) == pytest.approx(expected)


# ---------------------------------------------------------------------- the simulator's batcher

def interp(profile):
    return lambda b: float(__import__("numpy").interp(b, [r for r, _ in profile], [s for _, s in profile]))


BATCH_SIZE_CASES = [
    # id, rate per replica, profile, max batch, expected rows
    ("idle", 0.0, RESNET, 32, 1),
    # ceil(100 x .004 / .8) = 1 (50 % occupied)
    ("light", 100.0, RESNET, 32, 1),
    # ceil(250 x .004 / .8) = 2, lat(2) = 4.286 ms, ceil(1.34) = 2 (54 %; batch 1 would be 100 %)
    ("docstring-250", 250.0, RESNET, 32, 2),
    # ceil(1000 x .004 / .8) = 5, lat(5) = 5.143, ceil(6.43) = 7, lat(7) = 5.714, ceil(7.14) = 8,
    # lat(8) = 6, ceil(7.5) = 8
    ("resnet-1000", 1000.0, RESNET, 32, 8),
    ("capped-at-max", 10000.0, RESNET, 32, 32),
    # whisper 77/s: ceil(77 x .030 / .8) = 3, lat(3) = 40 ms, ceil(3.85) = 4 = max
    ("whisper-13-replicas", 77.0, WHISPER, 4, 4),
]


@pytest.mark.parametrize("rate, profile, max_batch, expected", [c[1:] for c in BATCH_SIZE_CASES],
                         ids=[c[0] for c in BATCH_SIZE_CASES])
def test_batch_size(rate, profile, max_batch, expected):
    assert batch_size(rate, interp(profile), max_batch) == expected


def test_batch_size_never_leaves_a_replica_over_its_fill_below_max():
    """Whatever the rate: rate x lat(b) / b <= 0.8, unless b is the largest batch."""
    latency = interp(RESNET)
    for rate in range(0, 5000, 7):
        b = batch_size(float(rate), latency, 32)
        assert b == 32 or rate * latency(b) / b <= 0.8 + 1e-9
        if b > 1:  # and no smaller batch would have done
            assert rate * latency(b - 1) / (b - 1) > 0.8 - 1e-9 or rate * latency(b - 1) / 0.8 > b - 1 - 1e-9


# ---------------------------------------------------------------------- learning batch latencies in the controller

LEARN_CASES = [
    # id, table before, window's (mean rows, seconds per batch), expected table
    ("first", (), (1.0, 0.004), ((1.0, 0.004),)),
    ("new-bucket", ((1.0, 0.004),), (7.6, 0.0059), ((1.0, 0.004), (7.6, 0.0059))),
    # bucket 8 again: (7.6 + .25 x (8.4 - 7.6), 5.9 + .25 x (6.1 - 5.9) ms) = (7.8, 5.95 ms)
    ("same-bucket-moves-a-quarter", ((1.0, 0.004), (7.6, 0.0059)), (8.4, 0.0061), ((1.0, 0.004), (7.8, 0.00595))),
    # 1.3 rows -> log2 0.38 -> bucket 0, with 1: (1 + .25 x .3, 4 + .25 x .4 ms)
    ("near-one", ((1.0, 0.004),), (1.3, 0.0044), ((1.075, 0.0041),)),
    ("kept-in-row-order", ((8.0, 0.006),), (2.0, 0.0045), ((2.0, 0.0045), (8.0, 0.006))),
    ("nothing-measured", ((1.0, 0.004),), (0.0, 0.0), ((1.0, 0.004),)),
    ("nan-ignored", ((1.0, 0.004),), (float("nan"), 0.004), ((1.0, 0.004),)),
]


@pytest.mark.parametrize("table, window, expected", [c[1:] for c in LEARN_CASES], ids=[c[0] for c in LEARN_CASES])
def test_learn_batch_latency(table, window, expected):
    got = learn_batch_latency(table, *window)
    assert len(got) == len(expected)
    for (r, s), (er, es) in zip(got, expected):
        assert (r, s) == pytest.approx((er, es))


BATCH_METRICS = """# HELP shoal_replica_batch_size Rows per executed batch
# TYPE shoal_replica_batch_size histogram
shoal_replica_batch_size_bucket{function="f",le="1.0"} 10.0
shoal_replica_batch_size_bucket{function="f",le="8.0"} 40.0
shoal_replica_batch_size_bucket{function="f",le="+Inf"} 40.0
shoal_replica_batch_size_count{function="f"} 40.0
shoal_replica_batch_size_sum{function="f"} 190.0
# HELP shoal_replica_busy_seconds_total Executor busy seconds
# TYPE shoal_replica_busy_seconds_total counter
shoal_replica_busy_seconds_total{function="f"} 0.2
"""


def test_batches_are_read_from_the_batch_size_histogram():
    """40 batches of 190 rows in 0.2 busy seconds: 4.75 rows a batch, 5 ms a batch."""
    stat = parse_replica_metrics(BATCH_METRICS, "r1", at=1.0)
    assert (stat.batches, stat.batch_rows, stat.busy_s) == (40.0, 190.0, 0.2)
    table = learn_batch_latency((), stat.batch_rows / stat.batches, stat.busy_s / stat.batches)
    assert len(table) == 1 and table[0] == pytest.approx((4.75, 0.005))


BATCH_WINDOW_CASES = [
    # id, (batches, requests answered, busy s), expected (requests per batch, seconds per batch)
    # 40 batches answered 190 requests in 0.2 s: 4.75 a batch, 5 ms each
    ("batching", (40.0, 190.0, 0.2), (4.75, 0.005)),
    # 1,000-row requests run one at a time: 50 batches, 50 requests: size 1, however many rows
    ("many-rows-one-request", (50.0, 50.0, 0.25), (1.0, 0.005)),
    ("no-batch", (0.0, 0.0, 0.0), None),
    ("no-request", (3.0, 0.0, 0.1), None),
]


@pytest.mark.parametrize("window, expected", [c[1:] for c in BATCH_WINDOW_CASES],
                         ids=[c[0] for c in BATCH_WINDOW_CASES])
def test_batch_window(window, expected):
    got = batch_window(*window)
    assert got == (None if expected is None else pytest.approx(expected))


def test_large_requests_one_at_a_time_are_no_batching():
    """A model fed 8-row requests, then 1,000-row ones, one request per batch: by rows the
    table would hold sizes 8 and 1,000 and the policy would take it for a batcher that
    finishes 1,000 x 80 / 5 = 16,000 requests within its target; by requests it is one size,
    so the spec's target concurrency stands: 32 in flight / 1 = 32 replicas needed."""
    table = learn_batch_latency((), *batch_window(10.0, 10.0, 0.01))  # 8-row requests, 1 ms each
    table = learn_batch_latency(table, *batch_window(50.0, 50.0, 0.25))  # 1,000-row ones, 5 ms each
    assert len(table) == 1
    need = estimate_need(MetricsSnapshot("f", 0.0, ready=1, inflight=32.0, duty=(1.0,), rps=200.0, service_s=0.005,
                                         batch_latency_s=table if len(table) > 1 else ()),
                         ScalingSpec(target_concurrency=1.0), CFG)
    assert (need.by, need.replicas) == ("concurrency", 32.0)


# ---------------------------------------------------------------------- what a batcher with no queue delay teaches

POLICY_TABLE_CASES = [
    # id, learned table, the function's max batch, the table decide() reads
    ("nothing-learned", (), 8, ()),
    ("one-size-says-nothing", ((1.0, 0.040),), 8, ()),
    # the largest learned is the max batch: as learned
    ("up-to-the-max", ((1.0, 0.040), (8.0, 0.120)), 8, ((1.0, 0.040), (8.0, 0.120))),
    # learned 1 and 1.5 rows (40, 45.7 ms): 11.4 ms a row carried on to 8: 45.7 + 6.5 x 11.4 = 119.8 ms
    ("carried-to-the-max", ((1.0, 0.040), (1.5, 0.0457)), 8, ((1.0, 0.040), (1.5, 0.0457), (8.0, 0.1198))),
    # resnet's 1 and 8 learned (4, 6 ms), max 32: 2/7 ms a row -> 6 + 24 x 2/7 = 12.86 ms (the profile: 14)
    ("resnet-from-8", RESNET[:2], 32, RESNET[:2] + ((32.0, 0.006 + 24 * 0.002 / 7),)),
    # a larger batch that ran no slower (noise) says nothing of how a batch grows: as learned,
    # not 8 rows in 39 ms
    ("no-growth-seen", ((1.0, 0.040), (2.0, 0.039)), 8, ((1.0, 0.040), (2.0, 0.039))),
    ("flat", ((1.0, 0.040), (1.42, 0.040)), 8, ((1.0, 0.040), (1.42, 0.040))),
    # batches of half the largest ran (a queue formed): read as learned
    ("half-the-max-is-learned", ((1.0, 0.040), (4.0, 0.074)), 8, ((1.0, 0.040), (4.0, 0.074))),
    ("just-under-half", ((1.0, 0.040), (3.9, 0.073)), 8, ((1.0, 0.040), (3.9, 0.073), (8.0, 0.073 + 4.1 * 0.033 / 2.9))),
]


@pytest.mark.parametrize("table, max_rows, expected", [c[1:] for c in POLICY_TABLE_CASES],
                         ids=[c[0] for c in POLICY_TABLE_CASES])
def test_policy_table_carries_the_learned_sizes_to_the_largest_batch(table, max_rows, expected):
    got = policy_table(table, max_rows)
    assert len(got) == len(expected)
    for (r, s), (er, es) in zip(got, expected):
        assert r == pytest.approx(er) and s == pytest.approx(es)


def test_a_batching_model_is_hot_by_its_work_at_full_batches_not_its_duty():
    """The slice hint's duty sample: 700 requests/s on 2 replicas that read 0.9 busy, running
    small batches; at full batches of resnet's 32 rows in 14 ms (within the 40 ms budget) the
    load is 700 x 0.014 / 32 / 2 = 0.153 of each: the sample. Without a table, the duty."""
    state = PolicyState()
    full = full_batch(RESNET, batch_budget_s(SPEC, CFG))
    assert full == (32.0, 0.014)
    busy = snap(ready=2, rps=700.0, duty=(0.9, 0.9), batch=RESNET)
    avg, since, last = _duty_sample(state, busy, full, 10.0, CFG)
    assert avg == pytest.approx(700 * 0.014 / 32 / 2) and since == last == 10.0
    unknown = snap(ready=2, rps=700.0, duty=(0.9, 0.9))
    assert _duty_sample(state, unknown, None, 10.0, CFG)[0] == pytest.approx(0.9)
    # a replica busier than its load at full batches would be is read as it is: the lower of the two
    light = snap(ready=1, rps=100.0, duty=(0.01,), batch=RESNET)
    assert _duty_sample(state, light, full, 10.0, CFG)[0] == pytest.approx(0.01)
    # decide() gives it the full batch: a hot duty on a batching model does not make a hot average
    _, after = decide(busy, SPEC, state, 10.0, CFG)
    assert after.duty_avg == pytest.approx(700 * 0.014 / 32 / 2)
