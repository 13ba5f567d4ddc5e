"""Where 99.9 % within the SLO is out of reach, in numbers, for the traces of the policy bench
(loadtests.bench.policy: the same traces, clusters, profiles and warm start):
- forced cold: the requests that find their function cold under any policy that keeps no
  function warm before its first request (autoscaler.simulator.forced_cold);
- held-max: a yardstick that knows every past second's exact need and holds `factor` times the
  most replicas any past second needed, one tick late, never fewer
  (autoscaler.simulator.held_max_policy). At factor 1 what it misses comes with a need larger
  than any before it, rising within a cold start. Where that stays under 99.9 %, the smallest
  factor that reaches it (of 1.5, 2, 3, 4, 6, 8, 12) says how much more than any past need a
  policy without foresight must hold, at what cost, beside static's (which knows each peak
  from the start). Held-max never scales down: where it does not fit on the cluster (a replica
  unplaceable) it says nothing, and the output says so;
- window-max (`--window-max`): held-max with a memory of W seconds (held_max_policy's
  window_ticks): it holds k times the most any of the last W seconds needed and scales down as
  that falls, each start a cold start. Over a grid of W and k, the cheapest setting at 99.9 %
  and, with `--against`, the cheapest at the SLO attainment Shoal reached there, each against
  the oracle's slice-seconds: what holding on a sliding window of exact past needs costs beside
  what foresight costs (issue 19's "Gamma CV 4 at most 1.2x the oracle"). The best setting is
  chosen after the fact, and each need is known exactly, so it flatters the family;
- the memoryless floor (traces whose functions are Poisson streams: `azure`, `poisson`): the
  fewest slice-seconds any policy without foresight must hold, in expectation, to reach 99.9 %,
  even knowing each function's rate (memoryless_floor), for a policy that keeps each
  function's slice and for one that may hold a replica on a smaller one (down to Shoal's
  min_slice, where a request alone meets the SLO).
Every GPU here is simulated: no figure is a GPU measurement.

    python -m loadtests.bench.bound --seed 1 [--traces spike,real-4x] [--batcher exact] [--json OUT]
        [--against POLICY_BENCH_JSON] [--window-max]

`--batcher exact`: batches formed as `shoal up`'s batcher forms them (SimConfig.batcher), the
needs counted for it (oracle_counts), as `python -m loadtests.bench.policy --batcher exact`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from autoscaler.policy import DEFAULT_CONFIG
from autoscaler.simulator import (
    BATCHERS, Profile, Simulation, assign_profiles, forced_cold, held_max_policy, oracle_counts, oracle_slice_seconds,
    warm_start,
)
from loadtests.bench.policy import traces

FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
WINDOWS_S = (2, 5, 10, 20, 30, 60, 120)  # window-max's grid, fixed before its reported runs
WINDOW_FACTORS = (1.0, 1.1, 1.25)
TARGET = 0.999
MIN_SLICE = DEFAULT_CONFIG.min_slice  # the least slice Shoal's policy asks for (1/8)
RESIZING = ("shoal",)  # the bench's policies that may hold a replica on a smaller slice than deployed
MEMORYLESS_KINDS = ("azure", "poisson")  # traces whose functions (timers aside) are Poisson streams
TIMER_MAX_CV = 0.1  # a function whose gaps vary less than this (a timer's vary by its jitter) may be foreseen


def held_slice(profile: Profile, min_slice: float | None) -> float:
    """The slice a replica held for a function's next request may have: its own (a policy that
    keeps the slice it deployed, `min_slice` None), or down to `min_slice` (a policy that
    resizes, Shoal's PolicyConfig.min_slice) where a request alone still meets the SLO there (a
    replica of slice x runs ref_slice / x times the profile's time, as in the simulator). E.g.
    whisper-tiny, 30 ms at 1/2, SLO 500 ms: 1/8 runs it in 120 ms, so 1/8."""
    if min_slice is None or min_slice >= profile.slice_fraction:
        return profile.slice_fraction
    alone_ms = profile.latency_ms[0][1] * profile.ref_slice
    return max(min_slice, min(profile.slice_fraction, alone_ms / profile.slo_ms))


def memoryless_floor(trace, profiles: list[Profile], config, initial: dict[int, int], target: float = TARGET,
                     min_slice: float | None = None, requests: int | None = None) -> dict | None:
    """The fewest slice-seconds of replicas held that reach `target` within the SLO, in
    expectation, for any policy without foresight that knew each function's rate; None for a
    trace of another kind. A request that finds its function with no replica at all (starting or
    ready) waits at least a cold start; where that is over the SLO it misses. The arrivals of a
    Poisson function do not depend on what a policy did (which cannot depend on arrivals still to
    come), so they find it with none as often as it has none (Poisson arrivals see time
    averages): in expectation at least rate x (L - H / slice) of its requests miss, L the counted
    seconds, H the slice-seconds it held one or more replicas (`held_slice`: the function's own
    slice, or the least a resizing policy may hold it on). Whatever a policy does between
    requests, each miss it avoids costs slice / rate slice-seconds of holding, so the least for a
    budget of misses ((1 - target) x `requests`, by default those arriving in L) holds whole the
    functions of least slice / rate (a fractional knapsack: the first left out held in part), and
    the last one held prices a miss. Free: timers (gaps that vary by less than TIMER_MAX_CV of
    their mean: a policy may foresee them), functions with fewer than 3 gaps (not told apart)
    and those whose cold start is within their SLO; of these only the first requests miss, where
    the warm start gives no replica (forced cold). A floor, not a policy: each rate is the count
    over L (the azure kind's rates swing by a few percent over half an hour), which a controller
    learns from the requests it sees; replicas beyond one (a busy function's) and the cold
    starts' own seconds are not counted. E.g. two functions at 1/4 of a GPU, 0.01 and 0.1
    requests a second over 1,000 s (10 and 100 requests), a budget of 10 misses: hold the second
    throughout (2.5 slice-s a miss avoided, 250 slice-s), the first none (25 a miss): 10 misses,
    250 slice-s."""
    if trace.kind not in MEMORYLESS_KINDS:
        return None
    start, L = config.warmup_s, trace.duration_s - config.warmup_s
    times, fids = trace.times, trace.fids.astype(np.int64)
    arrived = int((times >= start).sum())
    budget = (1.0 - target) * (arrived if requests is None else requests)
    counts, slices = {}, {}  # of the memoryless functions: requests in L, the slice each is held on
    free_forced = 0
    order = np.argsort(fids, kind="stable")  # each function's arrivals, in time order, in one pass
    present, first = np.unique(fids[order], return_index=True)
    for fid, t in zip(present.tolist(), np.split(times[order], first[1:])):
        p = profiles[fid]
        gaps = np.diff(t)
        slow = p.cold_start_s > p.slo_ms / 1000.0
        if slow and len(gaps) >= 3 and gaps.std() > TIMER_MAX_CV * gaps.mean():
            counts[fid] = int((t >= start).sum())
            slices[fid] = held_slice(p, min_slice)
        elif slow and not initial.get(fid) and t[0] >= start:
            free_forced += 1
    misses = float(free_forced + sum(counts.values()))  # none held: each request misses
    held, price = 0.0, None
    for fid in sorted((f for f in counts if counts[f]), key=lambda f: slices[f] * L / counts[f]):
        if misses <= budget:
            break
        cost = slices[fid] * L / counts[fid]  # slice-s a miss avoided: slice / rate
        avoid = min(counts[fid], misses - budget)
        held += cost * avoid
        misses -= avoid
        price = cost
    capacity = config.gpus * L  # the cluster's slice-seconds: what holding cannot pass
    return {"target": target, "requests": arrived, "budget_misses": round(budget, 1), "min_slice": min_slice,
            "memoryless_functions": len(counts), "memoryless_requests": sum(counts.values()),
            "forced_cold_others": free_forced, "floor_slice_s": round(held, 1),
            "price_slice_s": None if price is None else round(price, 1), "misses_at_floor": round(misses, 1),
            "cluster_slice_s": round(capacity, 1), "reachable": misses <= budget + 1e-9 and held <= capacity}


def held_max(trace, profiles: list[Profile], config, counts, initial, factor: float = 1.0) -> dict:
    """One run of held_max_policy; it fits when every function holds at the end what it asked
    for (it never scales down and does not ask again for a replica it could not place)."""
    policy = held_max_policy(counts, initial, factor)
    sim = Simulation(trace, profiles, policy, config, initial)
    record = sim.run()
    fits = all(int(sim.n_srv[fid]) == n for fid, n in policy.final.items())
    return {"factor": factor, "slo": record["slo_attainment"], "slice_s": record["replica_slice_seconds"],
            "timed_out": record["timed_out"], "fits": fits, "requests": record["requests"]}


def window_max(trace, profiles: list[Profile], config, counts, initial, window_s: float, factor: float) -> dict:
    """One run of held_max_policy with a memory of `window_s` (a whole number of ticks, at least
    one). It fits when no replica it asked for was unplaceable: it scales down and asks again
    each tick, so what it holds at the end (held_max's test) says nothing."""
    record = Simulation(trace, profiles, held_max_policy(counts, initial, factor, round(window_s / config.tick_s)),
                        config, initial).run()
    return {"window_s": window_s, "factor": factor, "slo": record["slo_attainment"],
            "slice_s": record["replica_slice_seconds"], "unplaceable": record["unplaceable"],
            "fits": record["unplaceable"] == 0}


def cheapest(runs: list[dict], slo: float) -> dict | None:
    """The run that fits with the fewest slice-seconds at `slo` or better; None if none."""
    good = [r for r in runs if r["fits"] and r["slo"] >= slo]
    return min(good, key=lambda r: (r["slice_s"], r["window_s"], r["factor"])) if good else None


def window_sweep(trace, profiles: list[Profile], config, shoal: dict | None = None,
                 windows: tuple[float, ...] = WINDOWS_S, factors: tuple[float, ...] = WINDOW_FACTORS,
                 counts: dict[int, dict[int, int]] | None = None) -> dict:
    """window-max at every (W, k) of the grid; the cheapest at 99.9 % and, given Shoal's record
    of a bench run on the same trace (`shoal`), at the attainment it reached, each x the
    oracle's slice-seconds, Shoal's beside. A record of another trace, seed or batcher (its
    oracle's slice-seconds not these) is refused. `counts`: the trace's oracle_counts, if made."""
    counts = counts if counts is not None else oracle_counts(trace, profiles, config.tick_s, config.batcher)
    oracle = oracle_slice_seconds(counts, profiles, config)
    if shoal is not None and abs(shoal["oracle_replica_slice_seconds"] - oracle) > 0.01:
        raise ValueError(f"Shoal's record has an oracle of {shoal['oracle_replica_slice_seconds']:,.3f} slice-s, this "
                         f"trace {oracle:,.3f}: a run of another trace, seed or batcher")
    initial = warm_start(trace, profiles, counts)
    runs = [window_max(trace, profiles, config, counts, initial, w, k) for w in windows for k in factors]

    def x(run: dict | None) -> dict | None:
        return None if run is None else {**run, "x_oracle": round(run["slice_s"] / oracle, 3) if oracle else None}

    out = {"oracle_slice_s": round(oracle, 1), "runs": [x(r) for r in runs], "at_target": x(cheapest(runs, TARGET))}
    if shoal is not None:
        out["shoal"] = {"slo": shoal["slo_attainment"], "slice_s": shoal["replica_slice_seconds"],
                        "x_oracle": round(shoal["replica_slice_seconds"] / oracle, 3) if oracle else None}
        out["at_shoal"] = x(cheapest(runs, shoal["slo_attainment"]))
    return out


def describe_sweep(name: str, seed: int, r: dict) -> str:
    def times(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}x"  # None: an oracle of no slice-seconds

    def one(run: dict | None, what: str) -> str:
        return (f"none of the grid reaches {what}" if run is None else
                f"at {what} the cheapest is W {run['window_s']:g} s x{run['factor']:g}: {run['slo']:.3%} at "
                f"{run['slice_s']:,.0f} slice-s, {times(run['x_oracle'])} the oracle")
    text = (f"{name} (seed {seed}) window-max, oracle {r['oracle_slice_s']:,.0f} slice-s: "
            f"{one(r['at_target'], f'{TARGET:.1%}')}")
    if "shoal" in r:
        shoal = r["shoal"]
        at_shoal = one(r["at_shoal"], f"Shoal's {shoal['slo']:.3%}")
        text += f"; {at_shoal}; Shoal {shoal['slice_s']:,.0f} slice-s, {times(shoal['x_oracle'])}"
    unfit = sum(1 for run in r["runs"] if not run["fits"])
    return text + (f" ({unfit} of {len(r['runs'])} settings left a replica unplaceable)" if unfit else "")


def bound(trace, profiles: list[Profile], config, factors: tuple[float, ...] = FACTORS,
          counts: dict[int, dict[int, int]] | None = None) -> dict:
    counts = counts if counts is not None else oracle_counts(trace, profiles, config.tick_s, config.batcher)
    initial = warm_start(trace, profiles, counts)
    at_1 = held_max(trace, profiles, config, counts, initial)
    forced = forced_cold(trace, profiles, initial, config.warmup_s)
    counted = at_1["requests"]  # those at or after the warm-up (and any held across it)
    # static's cost: each function's peak count held over the counted time (static_policy)
    static = sum(max(per.values()) * profiles[fid].slice_fraction for fid, per in counts.items()) \
        * (trace.duration_s - config.warmup_s)
    out = {"requests": counted, "forced_cold": forced, "forced_share": forced / max(1, counted),
           "held_max": at_1, "static_slice_s": round(static, 1), "enough": None, "tried": [],
           "memoryless_floor": memoryless_floor(trace, profiles, config, initial, requests=counted),
           "memoryless_floor_resized": memoryless_floor(trace, profiles, config, initial, min_slice=MIN_SLICE,
                                                        requests=counted)}
    if at_1["fits"] and at_1["slo"] < TARGET:
        for factor in factors:
            run = held_max(trace, profiles, config, counts, initial, factor)
            out["tried"].append(run)
            if not run["fits"]:
                break
            if run["slo"] >= TARGET:
                out["enough"] = run
                break
    return out


def against(trace, profiles: list[Profile], config, policies: dict,
            counts: dict[int, dict[int, int]] | None = None) -> dict:
    """Each reactive policy of a bench run (its record in `policies`) beside the memoryless floor
    for the SLO attainment it reached, over that run's requests: how many times the least a
    policy without foresight must hold for it, knowing each rate, it held; for a policy that
    resizes slices (RESIZING) the floor of one that may hold a replica on min_slice."""
    counts = counts if counts is not None else oracle_counts(trace, profiles, config.tick_s, config.batcher)
    initial = warm_start(trace, profiles, counts)
    out = {}
    for policy, record in policies.items():
        if policy in ("static", "oracle"):  # static knows each peak, the oracle foresees
            continue
        floor = memoryless_floor(trace, profiles, config, initial, target=record["slo_attainment"],
                                 min_slice=MIN_SLICE if policy in RESIZING else None, requests=record["requests"])
        out[policy] = {"slo": record["slo_attainment"], "slice_s": record["replica_slice_seconds"],
                       "resized": policy in RESIZING, "floor_slice_s": floor["floor_slice_s"],
                       "price_slice_s": floor["price_slice_s"],
                       "x_floor": round(record["replica_slice_seconds"] / floor["floor_slice_s"], 3)
                       if floor["floor_slice_s"] else None}
    return out


def describe(name: str, seed: int, r: dict) -> str:
    h = r["held_max"]
    text = (f"{name} (seed {seed}): {r['requests']:,} requests counted; forced cold {r['forced_cold']:,} "
            f"({r['forced_share']:.3%}); ")
    for key, how in (("memoryless_floor", "each on its slice"), ("memoryless_floor_resized", "down to min_slice")):
        m = r.get(key)
        if m:
            text += (f"memoryless floor for {m['target']:.1%}, {how} ({m['memoryless_functions']} Poisson "
                     f"functions, {m['memoryless_requests']:,} requests): " + (
                         f"at least {m['floor_slice_s']:,.0f} slice-s held in expectation, a miss priced at "
                         f"{m['price_slice_s'] or 0:,.1f} slice-s at the margin (cluster {m['cluster_slice_s']:,.0f})"
                         if m["reachable"] else
                         f"out of reach: {m['misses_at_floor']:,.0f} misses at least, holding "
                         f"{m['floor_slice_s']:,.0f} slice-s, over the budget of {m['budget_misses']:,.0f}") + "; ")
    if not h["fits"]:
        return text + "held-max does not fit on the cluster (says nothing)"
    text += f"held-max {h['slo']:.3%} at {h['slice_s']:,.0f} slice-s"
    if h["slo"] < TARGET:
        tried = ", ".join(f"x{t['factor']:g} " + (f"{t['slo']:.3%} at {t['slice_s']:,.0f}" if t["fits"] else "does not fit")
                          for t in r["tried"])
        e = r["enough"]
        text += (f"; {TARGET:.1%} needs x{e['factor']:g} the largest past need" if e
                 else f"; no factor that fits reaches {TARGET:.1%}") + f" ({tried}; static, knowing each peak: " \
            f"{r['static_slice_s']:,.0f} slice-s)"
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.bound", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--traces", help="comma-separated names of the policy bench's traces (default: all)")
    p.add_argument("--json", type=Path)
    p.add_argument("--batcher", choices=BATCHERS, default="rule", help="how batching replicas form batches")
    p.add_argument("--against", type=Path, help="a policy bench JSON of the same seed (python -m "
                   "loadtests.bench.policy --json): each policy's slice-s beside the memoryless floor at the "
                   "SLO attainment it reached")
    p.add_argument("--window-max", action="store_true", help="also window-max over its grid (WINDOWS_S x "
                   "WINDOW_FACTORS); with --against, at Shoal's SLO attainment there too")
    args = p.parse_args(argv)
    out = {}
    bench = {}
    if args.against:
        run = json.loads(args.against.read_text())
        if run.get("batcher", "rule") != args.batcher:
            p.error(f"--against {args.against} was run with --batcher {run.get('batcher')}, not {args.batcher}")
        bench = run["traces"]
    for name, trace, profiles, config in traces(False, args.seed, args.traces):
        profiles = profiles or assign_profiles(trace, args.seed)
        config = replace(config, batcher=args.batcher)
        counts = oracle_counts(trace, profiles, config.tick_s, config.batcher)  # once per trace, for each reading
        out[name] = bound(trace, profiles, config, counts=counts)
        print(f"{describe(name, args.seed, out[name])} [batcher {args.batcher}]", flush=True)
        if args.window_max:
            shoal = bench[name]["policies"]["shoal"] if name in bench else None
            try:
                out[name]["window_max"] = window_sweep(trace, profiles, config, shoal, counts=counts)
            except ValueError as e:
                p.error(f"--against {args.against}, {name}: {e}")
            print(f"  {describe_sweep(name, args.seed, out[name]['window_max'])}", flush=True)
        if out[name]["memoryless_floor"] is not None and name in bench:
            out[name]["against"] = against(trace, profiles, config, bench[name]["policies"], counts)
            for policy, a in out[name]["against"].items():
                x = "-" if a["x_floor"] is None else f"{a['x_floor']:.3f}x"
                print(f"  {policy}: {a['slo']:.3%} at {a['slice_s']:,.0f} slice-s, {x} the floor for that attainment"
                      f"{' down to min_slice' if a['resized'] else ''} ({a['floor_slice_s']:,.0f}; a miss at "
                      f"{a['price_slice_s'] or 0:,.1f} slice-s)")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "batcher": args.batcher, "traces": out, "simulated": True}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
