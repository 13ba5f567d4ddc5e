"""Benchmark: how far the ticks' phase alone moves one cell of the policy bench. Shoal's policy (or
each of `--policies`, side by side on the same arrivals) runs on one trace of
loadtests/bench/policy.py at one seed and batcher, its arrivals shifted later by each of the given
milliseconds (Trace.shifted: the same traffic at another phase of the controller's ticks), and
the SLO attainment and slice-seconds of each are printed with their range and mean. A change
judged on a cell whose own range is wider than the change's effect has not been judged on it.
Simulated, no GPU figure; results: docs/policy-changes.md, "The ticks' phase", and
docs/benchmarks.md, "At every tick phase".

    python -m loadtests.bench.phase TRACE [--seed 3] [--batcher rule|exact] [--shifts-ms 0,1,2,5,10,20,50]
        [--policies shoal,kpa-tuned,...] [--json OUT]
    python -m loadtests.bench.phase csv --path ARRIVALS.csv [--compress 4] ...   # the real trace's cell, other arrivals
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from autoscaler.simulator import BATCHERS, POLICIES, simulate
from loadtests.bench.policy import real_scenario, scenarios, trace_of, traces


def run(name: str, seed: int, batcher: str, shifts_ms: list[float], policies: tuple[str, ...] = ("shoal",),
        csv: tuple[Path, float] | None = None) -> list[dict]:
    """Each policy on trace `name` at each shift, in that order: {"policy", "shift_ms", "slo",
    "slice_s", "requests", "wall_s"} (wall_s: the shift's run of every policy). With `csv` (a
    path and a compression) the real trace's cell on that CSV's arrivals instead."""
    if csv is None:
        ((_, trace, profiles, config),) = traces(False, seed, name)
    else:
        _, options, config = real_scenario(*csv)
        trace, profiles = trace_of(options, seed)
    config = replace(config, batcher=batcher)
    rows = []
    for shift in shifts_ms:
        started = time.perf_counter()
        result = simulate(trace.shifted(shift / 1000.0), list(policies), config, seed=seed, profiles=profiles)
        wall_s = round(time.perf_counter() - started, 1)
        for policy in policies:
            record = result["policies"][policy]
            rows.append({"policy": policy, "shift_ms": shift, "slo": record["slo_attainment"],
                         "slice_s": record["replica_slice_seconds"], "requests": record["requests"], "wall_s": wall_s})
    return rows


def summary(rows: list[dict]) -> str:
    """One policy's rows in a line: the SLO's range and mean, the slice-seconds' range and mean.
    E.g. 99.0 % and 99.5 % at 100 and 120 slice-s: "SLO 99.000-99.500 % (range 0.500 points,
    mean 99.250); slice-s 100.0-120.0 (1.200x, mean 110.0)"."""
    slo = [100 * r["slo"] for r in rows]
    cost = [r["slice_s"] for r in rows]
    return (f"SLO {min(slo):.3f}-{max(slo):.3f} % (range {max(slo) - min(slo):.3f} points, mean {statistics.mean(slo):.3f}); "
            f"slice-s {min(cost):,.1f}-{max(cost):,.1f} ({max(cost) / min(cost):.3f}x, mean {statistics.mean(cost):,.1f})")


def main(argv: list[str] | None = None) -> int:
    names = [name for name, _, _ in scenarios(False)]
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.phase", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", choices=names + ["csv"], help="a cell of the policy bench, or csv (with --path)")
    p.add_argument("--path", type=Path, help="csv: the arrivals (a TIMESTAMP column), run as the real trace's cell")
    p.add_argument("--compress", type=float, help="csv: compressed this many times (default 1)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--batcher", choices=BATCHERS, default="rule")
    p.add_argument("--shifts-ms", default="0,1,2,5,10,20,50", help="comma-separated, each >= 0 (default 0,1,2,5,10,20,50)")
    p.add_argument("--policies", default="shoal", help=f"comma-separated, of {', '.join(POLICIES)} (default shoal)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    policies = tuple(dict.fromkeys(x.strip() for x in args.policies.split(",")))
    unknown = [x for x in policies if x not in POLICIES]  # an empty one too ("" or "a,,b")
    if unknown:
        p.error(f"--policies {args.policies!r}: {', '.join(map(repr, unknown))} unknown; "
                f"expected comma-separated names of {', '.join(POLICIES)}")
    try:
        shifts = [float(s) for s in args.shifts_ms.split(",")]
    except ValueError:
        p.error(f"--shifts-ms {args.shifts_ms!r}: comma-separated numbers")
    if not shifts or any(not 0 <= s < 1000 for s in shifts):
        p.error(f"--shifts-ms {args.shifts_ms!r}: each must be >= 0 and under 1000")
    if (args.trace == "csv") != (args.path is not None):
        p.error("--path is for the trace csv, and csv needs it")
    if args.compress is not None and args.trace != "csv":
        p.error("--compress is for the trace csv")
    if args.path is not None and not args.path.is_file():
        p.error(f"--path {str(args.path)!r}: no such file")
    compress = 1.0 if args.compress is None else args.compress
    if not compress > 0:
        p.error(f"--compress {compress!r}: must be > 0")
    csv = (args.path, compress) if args.path is not None else None
    rows = run(args.trace, args.seed, args.batcher, shifts, policies, csv)
    alone = "Shoal alone" if policies == ("shoal",) else ", ".join(policies)
    what = f"{args.path.name} compressed {compress:g}x" if csv else args.trace
    print(f"{what}, seed {args.seed}, the {args.batcher} batcher, {alone} (simulated):")
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        if len(policies) > 1:
            print(f" {policy}:")
        for r in mine:  # wall_s is the shift's run of every policy: printed where it is one's
            took = f", {r['wall_s']:.0f} s" if len(policies) == 1 else ""
            print(f"  shifted {r['shift_ms']:g} ms: {100 * r['slo']:.3f} % at {r['slice_s']:,.1f} slice-s "
                  f"({r['requests']:,} requests{took})")
        print(f"  {summary(mine)}")
    if len(policies) > 1:
        print(f" {sum(r['wall_s'] for r in rows if r['policy'] == policies[0]):.0f} s for every policy at every shift")
    if args.json:
        args.json.write_text(json.dumps({"trace": what, "seed": args.seed, "batcher": args.batcher,
                                         "policies": list(policies), "simulated": True, "rows": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
