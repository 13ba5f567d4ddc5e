"""Where 99.9 % within the SLO is out of reach without foresight, in numbers, for the traces of
the policy bench (loadtests.bench.policy, the same traces, clusters, profiles and warm start):
- forced: the requests that find their function cold under any policy that cannot see the
  future (autoscaler.simulator.forced_cold: a function's first request, when the common warm
  start gives it no replica and its cold start is longer than its SLO);
- held-max: a yardstick that knows every past second's exact need and holds the most replicas
  any past second needed, one tick late, never fewer (autoscaler.simulator.held_max_policy):
  its SLO attainment and slice-seconds. What it misses comes with a need larger than any
  before it, rising within a cold start: only foresight, or holding more than the trace ever
  needed before, serves it.
Every GPU here is simulated: no figure is a GPU measurement.

    python -m loadtests.bench.bound --seed 1 [--traces spike,real-4x] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoscaler.simulator import (
    Profile, Simulation, assign_profiles, forced_cold, held_max_policy, oracle_counts, warm_start,
)
from autoscaler.traces import make_trace
from deploy.cli.simulate import load_profile
from loadtests.bench.policy import scenarios


def bound(trace, profiles: list[Profile], config) -> dict:
    counts = oracle_counts(trace, profiles, config.tick_s)
    initial = warm_start(trace, profiles, counts)
    record = Simulation(trace, profiles, held_max_policy(counts, initial), config, initial).run()
    counted = record["requests"]
    forced = forced_cold(trace, profiles, initial, config.warmup_s)
    return {"requests": counted, "forced_cold": forced, "forced_share": forced / max(1, counted),
            "best_without_forced": 1.0 - forced / max(1, counted),
            "held_max_slo": record["slo_attainment"], "held_max_slice_s": record["replica_slice_seconds"],
            "held_max_timed_out": record["timed_out"], "held_max_unplaceable": record["unplaceable"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.bound", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--traces", help="comma-separated names of the policy bench's traces (default: all)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out = {}
    for name, options, config in scenarios(False):
        if args.traces and name not in args.traces.split(","):
            continue
        options = dict(options)
        kind, profile = options.pop("kind"), options.pop("profile", None)
        trace = make_trace(kind, seed=args.seed, **options)
        if profile is not None:
            profile = profile if isinstance(profile, Profile) else load_profile(Path(profile))
        profiles = [profile] * len(trace.functions) if profile is not None else assign_profiles(trace, args.seed)
        r = out[name] = bound(trace, profiles, config)
        print(f"{name} (seed {args.seed}): {r['requests']:,} requests counted; forced cold {r['forced_cold']:,} "
              f"({r['forced_share']:.3%}: at best {r['best_without_forced']:.3%}); held-max {r['held_max_slo']:.3%} "
              f"at {r['held_max_slice_s']:,.0f} slice-s ({r['held_max_timed_out']:,} timed out, "
              f"{r['held_max_unplaceable']:,} unplaceable)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "traces": out, "simulated": True}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
