"""Benchmark: does Shoal's standing against a tuned peer depend on where the peer was set? Each
peer family runs every trace of loadtests/bench/policy.py at each given seed at every setting of
a grid fixed in advance (the published policy, and the tuned rule of autoscaler/baselines/tuned.py
at each headroom and, for Ray, each downscale delay), beside Shoal at its defaults. A setting beats
Shoal in a cell when it holds fewer slice-seconds at an SLO as good, or a better SLO at no more;
Shoal is on the family's frontier there when no setting beats it. Beside each verdict: the family's
fewest slice-seconds at Shoal's SLO or better, and its best SLO at Shoal's slice-seconds or fewer.
The peers get their whole grid on the reported seeds, each cell its best setting after the fact,
which no user could choose in advance: a reading of the comparison that favours them, not a
tuning. Simulated, no GPU figure; results: docs/policy-changes.md, "Every peer setting beside Shoal".

    python -m loadtests.bench.frontier --seeds 1,2 [--batcher exact] [--traces real-4x] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

from autoscaler.simulator import BATCHERS, Profile, SimPolicy, kpa_tuned_policy, ray_tuned_policy, simulate
from loadtests.bench import calibrate
from loadtests.bench.policy import scenarios, traces

# the grid, fixed before the reported runs: calibration's headrooms (the share of the SLO
# concurrency a target asks for: tuned.kpa_config, tuned.ray_config) widened from well below its
# lowest (0.05, where kpa-tuned froze) to a whole replica's: 0.01 ... 1.0, 11 values; Ray's
# downscale delays in cold starts, calibration's three
HEADROOMS = tuple(sorted({0.01, 0.02, 0.03, *calibrate.HEADROOMS, 1.0}))
RAY_DELAYS = calibrate.RAY_DELAYS
FAMILIES = ("kpa", "ray")
Maker = Callable[[list[Profile]], SimPolicy]


def grid(family: str) -> list[dict[str, Maker]]:
    """The family's settings as `simulate(extra=...)` chunks: {name: maker}; the published policy
    runs by its own name beside the first chunk. E.g. 'kpa-tuned@0.05', 'ray-tuned@0.2/100'."""
    if family == "kpa":
        return [{f"kpa-tuned@{h:g}": lambda profiles, h=h: kpa_tuned_policy(profiles, h) for h in HEADROOMS}]
    if family == "ray":
        return [{f"ray-tuned@{h:g}/{d:g}": lambda profiles, h=h, d=d: ray_tuned_policy(profiles, h, d)
                 for h in HEADROOMS} for d in RAY_DELAYS]
    raise ValueError(f"unknown family {family!r}: expected one of {', '.join(FAMILIES)}")


def run(job: tuple[int, str, str, int, str]) -> tuple[int, str, str, dict[str, dict]]:
    """One simulate() call: Shoal alone (family 'shoal'), or one chunk of a family's grid (the
    published policy beside chunk 0). Returns (seed, trace, family, {setting: record})."""
    seed, name, family, chunk, batcher = job
    for trace_name, trace, profiles, cluster in traces(False, seed, name):
        config = replace(cluster, batcher=batcher)
        if family == "shoal":
            result = simulate(trace, ["shoal"], config, seed=seed, profiles=profiles)
        else:
            result = simulate(trace, [family] if chunk == 0 else [], config, seed=seed, profiles=profiles,
                              extra=grid(family)[chunk])
        return seed, trace_name, family, {k: {"slo_attainment": r["slo_attainment"],
                                              "replica_slice_seconds": r["replica_slice_seconds"]}
                                          for k, r in result["policies"].items()}
    raise ValueError(f"no trace {name!r}")


def beats(setting: dict, shoal: dict) -> bool:
    """Fewer slice-seconds at an SLO as good, or a better SLO at no more."""
    s, c = setting["slo_attainment"], setting["replica_slice_seconds"]
    t, d = shoal["slo_attainment"], shoal["replica_slice_seconds"]
    return (s >= t and c < d) or (s > t and c <= d)


def judge(shoal: dict, settings: dict[str, dict]) -> dict:
    """The family against Shoal in one cell: which settings beat it; the cheapest at Shoal's SLO or
    better (None when none reaches it); the best SLO at Shoal's slice-seconds or fewer (None when
    every setting holds more). A setting at exactly Shoal's slice-seconds and a better SLO beats it
    without being cheaper: then the cheapest named may be a tie."""
    beaten = sorted((k for k, r in settings.items() if beats(r, shoal)),
                    key=lambda k: settings[k]["replica_slice_seconds"])
    reach = [k for k, r in settings.items() if r["slo_attainment"] >= shoal["slo_attainment"]]
    cheapest = min(reach, key=lambda k: settings[k]["replica_slice_seconds"]) if reach else None
    within = [k for k, r in settings.items() if r["replica_slice_seconds"] <= shoal["replica_slice_seconds"]]
    best = max(within, key=lambda k: settings[k]["slo_attainment"]) if within else None
    return {"frontier": not beaten, "beaten_by": beaten, "cheapest_as_good": cheapest, "best_within_cost": best}


def cell_line(shoal: dict, settings: dict[str, dict], verdict: dict) -> str:
    """E.g. "on the frontier; cheapest at Shoal's SLO or better: kpa-tuned@0.08 at 1.13x Shoal's
    slice-s (99.993%); every setting dearer"."""
    parts = ["on the frontier" if verdict["frontier"] else f"beaten by {len(verdict['beaten_by'])}"]
    k = verdict["cheapest_as_good"]
    if k is None:
        parts.append("no setting reaches Shoal's SLO (best "
                     f"{max(r['slo_attainment'] for r in settings.values()):.3%})")
    else:
        ratio = settings[k]["replica_slice_seconds"] / shoal["replica_slice_seconds"]
        parts.append(f"cheapest at Shoal's SLO or better: {k} at {ratio:.2f}x Shoal's slice-s "
                     f"({settings[k]['slo_attainment']:.3%})")
    k = verdict["best_within_cost"]
    parts.append("every setting dearer" if k is None else
                 f"best SLO at Shoal's slice-s or fewer: {k} {settings[k]['slo_attainment']:.3%}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2", help="comma-separated (default 1,2: the reported seeds)")
    parser.add_argument("--traces", help="comma-separated names: only these traces (default: every trace)")
    parser.add_argument("--batcher", choices=BATCHERS, default="rule")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="where to write every setting's figures and the verdicts")
    args = parser.parse_args(argv)
    try:
        seeds = list(dict.fromkeys(int(s) for s in args.seeds.split(",")))  # each once, in order
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: comma-separated whole numbers")
    known = [name for name, _, _ in scenarios(False)]
    names = list(dict.fromkeys(n.strip() for n in args.traces.split(","))) if args.traces else known
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown trace {unknown[0]!r}: expected some of {', '.join(known)}")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    jobs = [(seed, name, "shoal", 0, args.batcher) for seed in seeds for name in names]
    jobs += [(seed, name, family, chunk, args.batcher) for seed in seeds for name in names
             for family in FAMILIES for chunk in range(len(grid(family)))]
    cells: dict[str, dict[str, dict[str, dict]]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for seed, name, family, records in pool.map(run, jobs):
            cell = cells.setdefault(f"{name}/{seed}", {"shoal": {}, **{f: {} for f in FAMILIES}})
            cell[family].update(records)
            print(f"{name} seed {seed}: {family} done ({len(records)} setting(s))", file=sys.stderr, flush=True)
    out: dict = {"simulated": True, "batcher": args.batcher, "seeds": seeds,
                 "grid": {"headrooms": HEADROOMS, "ray_delays_cold_starts": RAY_DELAYS}, "cells": {}}
    print(f"\nBy the {args.batcher} batcher; simulated GPUs and profiles, no GPU figure.")
    for key, cell in cells.items():
        shoal = cell["shoal"]["shoal"]
        out["cells"][key] = {"shoal": shoal, "families": {}}
        print(f"\n== {key}: shoal {shoal['slo_attainment']:.3%} at {shoal['replica_slice_seconds']:,.0f} slice-s")
        for family in FAMILIES:
            verdict = judge(shoal, cell[family])
            out["cells"][key]["families"][family] = {"settings": cell[family], **verdict}
            print(f"  {family}: {cell_line(shoal, cell[family], verdict)}")
    on = sum(v["frontier"] for c in out["cells"].values() for v in c["families"].values())
    both = sum(all(v["frontier"] for v in c["families"].values()) for c in out["cells"].values())
    print(f"\nShoal on the family's frontier in {on} of {len(out['cells']) * len(FAMILIES)} (cell, family) pairs; "
          f"on both in {both} of {len(out['cells'])} cells")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
