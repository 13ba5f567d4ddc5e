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
  unplaceable) it says nothing, and the output says so.
Every GPU here is simulated: no figure is a GPU measurement.

    python -m loadtests.bench.bound --seed 1 [--traces spike,real-4x] [--batcher exact] [--json OUT]

`--batcher exact`: batches formed as `shoal up`'s batcher forms them (SimConfig.batcher), the
needs counted for it (oracle_counts), as `python -m loadtests.bench.policy --batcher exact`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from autoscaler.simulator import (
    BATCHERS, Profile, Simulation, assign_profiles, forced_cold, held_max_policy, oracle_counts, warm_start,
)
from loadtests.bench.policy import traces

FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
TARGET = 0.999


def held_max(trace, profiles: list[Profile], config, counts, initial, factor: float = 1.0) -> dict:
    """One run of held_max_policy; it fits when every function holds at the end what it asked
    for (it never scales down and does not ask again for a replica it could not place)."""
    policy = held_max_policy(counts, initial, factor)
    sim = Simulation(trace, profiles, policy, config, initial)
    record = sim.run()
    fits = all(int(sim.n_srv[fid]) == n for fid, n in policy.final.items())
    return {"factor": factor, "slo": record["slo_attainment"], "slice_s": record["replica_slice_seconds"],
            "timed_out": record["timed_out"], "fits": fits, "requests": record["requests"]}


def bound(trace, profiles: list[Profile], config, factors: tuple[float, ...] = FACTORS) -> dict:
    counts = oracle_counts(trace, profiles, config.tick_s, config.batcher)
    initial = warm_start(trace, profiles, counts)
    at_1 = held_max(trace, profiles, config, counts, initial)
    forced = forced_cold(trace, profiles, initial, config.warmup_s)
    counted = at_1["requests"]  # those at or after the warm-up (and any held across it)
    # static's cost: each function's peak count held over the counted time (static_policy)
    static = sum(max(per.values()) * profiles[fid].slice_fraction for fid, per in counts.items()) \
        * (trace.duration_s - config.warmup_s)
    out = {"requests": counted, "forced_cold": forced, "forced_share": forced / max(1, counted),
           "held_max": at_1, "static_slice_s": round(static, 1), "enough": None, "tried": []}
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


def describe(name: str, seed: int, r: dict) -> str:
    h = r["held_max"]
    text = (f"{name} (seed {seed}): {r['requests']:,} requests counted; forced cold {r['forced_cold']:,} "
            f"({r['forced_share']:.3%}); ")
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
    args = p.parse_args(argv)
    out = {}
    for name, trace, profiles, config in traces(False, args.seed, args.traces):
        out[name] = bound(trace, profiles or assign_profiles(trace, args.seed), replace(config, batcher=args.batcher))
        print(f"{describe(name, args.seed, out[name])} [batcher {args.batcher}]", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "batcher": args.batcher, "traces": out, "simulated": True}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
