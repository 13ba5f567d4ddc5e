"""Benchmark: how tightly and how fast placement packs slices onto devices.

    python -m loadtests.bench.placement [--seed 0] [--decisions 20000] [--json OUT]

In one run, in this process:
- packing: for several random mixes of slices (1/8, 1/4, 1/2 and 1 of an 80 GiB
  device, each with its own memory), the devices `plan()` (best-fit decreasing on
  a SliceCluster) uses, over `lower_bound()`, the fewest any packing could use;
- decision latency: `SliceCluster.place` on 1,000 devices that fill up and then
  churn (replicas leave at random while new ones arrive), p50/p99 over 20,000
  decisions, placed and unplaceable alike, timed with perf_counter_ns around
  `place()` alone (the one placement: the plugins in one compiled pass).
Prints the ratios and the issue's targets.

Unlike the other benchmarks this one calls Shoal's code directly: a placement
decision has no HTTP surface, it is a pure function of the inventory
(DESIGN.md section 7), and its cost is the microseconds measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from fractions import Fraction

import numpy as np

from autoscaler.placement import Demand, Placement, SliceCluster, lower_bound, plan
from loadtests.bench.replica import report

DEVICE_MIB = 80 * 1024
SIZES = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1))

# name -> (relative weight of each size in SIZES, memory as a share of the slice's share of the device, demands)
MIXES: dict[str, tuple[tuple[float, ...], tuple[float, float], int]] = {
    "even sizes, memory = its share": ((1, 1, 1, 1), (1.0, 1.0), 2000),
    "mostly small, memory 50-100% of share": ((6, 3, 1, 0.5), (0.5, 1.0), 5000),
    "memory-heavy, 100-150% of share": ((4, 2, 1, 0.5), (1.0, 1.5), 10000),
    "mixed, memory 25-150% of share": ((3, 3, 2, 1), (0.25, 1.5), 20000),
}
CHURN_MIX = "mixed, memory 25-150% of share"
FUNCTIONS = 300  # demands name this many functions, so the warm-cache scorer has something to say


def demands(rng: random.Random, mix: str, count: int | None = None, start: int = 0) -> list[Demand]:
    weights, (low, high), default = MIXES[mix]
    out = []
    for i in range(start, start + (count or default)):
        fraction = rng.choices(SIZES, weights)[0]
        memory = min(DEVICE_MIB, round(float(fraction) * DEVICE_MIB * rng.uniform(low, high)))
        out.append(Demand(f"r{i}", f"fn{rng.randrange(FUNCTIONS)}", fraction, memory, ("gpu",)))
    return out


def packing(rng: random.Random, mix: str) -> dict:
    batch = demands(rng, mix)
    bound = lower_bound(batch, 1, DEVICE_MIB)
    cluster = SliceCluster.uniform(int(bound * 1.3) + 8, DEVICE_MIB)
    began = time.perf_counter()
    result = plan(batch, cluster)
    seconds = time.perf_counter() - began
    return {"demands": len(batch), "devices": len(cluster.devices), "lower_bound": bound,
            "used": result.devices_used, "ratio": result.devices_used / bound,
            "unplaceable": len(result.unplaceable), "plan_s": seconds}


def churn(rng: random.Random, devices: int, decisions: int) -> dict:
    """Fill, then keep the cluster about 90 % allocated: above it, every step releases
    a random replica before placing; below it, one step in five does. Each decision is
    timed; `decisions_sha256` digests where each went (-1: unplaceable), to compare runs."""
    cluster = SliceCluster.uniform(devices, DEVICE_MIB)
    live: list[str] = []
    placed_ns: list[int] = []
    refused_ns: list[int] = []
    chosen: list[int] = []
    for demand in demands(rng, CHURN_MIX, decisions):
        leave_p = 1.0 if cluster.allocated_fraction() > 0.9 else 0.2
        if live and rng.random() < leave_p:
            cluster.release(live.pop(rng.randrange(len(live))))
        began = time.perf_counter_ns()
        result = cluster.place(demand)
        took = time.perf_counter_ns() - began
        if isinstance(result, Placement):
            placed_ns.append(took)
            live.append(demand.replica)
            chosen.append(int(result.device.id.split(":")[1]))
        else:
            refused_ns.append(took)
            chosen.append(-1)
    every = np.asarray(placed_ns + refused_ns) / 1000.0
    placed = np.asarray(placed_ns) / 1000.0
    return {"devices": devices, "decisions": decisions, "placed": len(placed_ns), "unplaceable": len(refused_ns),
            "allocated_at_end": cluster.allocated_fraction(), "devices_in_use_at_end": cluster.devices_in_use(),
            "p50_us": float(np.percentile(every, 50)), "p99_us": float(np.percentile(every, 99)),
            "max_us": float(every.max()), "placed_p50_us": float(np.percentile(placed, 50)),
            "placed_p99_us": float(np.percentile(placed, 99)),
            "decisions_sha256": hashlib.sha256(np.array(chosen, np.int32).tobytes()).hexdigest()[:16]}


def run(seed: int = 0, decisions: int = 20000, devices: int = 1000) -> dict:
    rng = random.Random(seed)
    mixes = {}
    for mix in MIXES:
        mixes[mix] = packing(rng, mix)
        print(f"  packed {mix}: {mixes[mix]['used']} devices, lower bound {mixes[mix]['lower_bound']}", flush=True)
    latency = churn(rng, devices, decisions)
    worst = max(m["ratio"] for m in mixes.values())
    return {
        "seed": seed, "packing": mixes, "latency": latency,
        "targets": {
            "devices used / lower bound <= 1.05 on every mix": worst <= 1.05,
            f"place() p99 <= 100 us on {devices} devices": latency["p99_us"] <= 100.0,
        },
    }


def render(s: dict) -> str:
    lines = ["| mix | demands | lower bound | devices used | used / bound | plan() s |", "|---|---|---|---|---|---|"]
    for mix, m in s["packing"].items():
        lines.append(f"| {mix} | {m['demands']} | {m['lower_bound']} | {m['used']} | {m['ratio']:.3f} "
                     f"| {m['plan_s']:.2f} |")
    lat = s["latency"]
    lines += ["",
              f"SliceCluster.place on {lat['devices']} devices, {lat['decisions']} decisions "
              f"({lat['placed']} placed, {lat['unplaceable']} unplaceable; "
              f"{lat['allocated_at_end']:.0%} allocated at the end):",
              f"p50 {lat['p50_us']:.1f} us, p99 {lat['p99_us']:.1f} us, max {lat['max_us']:.0f} us "
              f"(placed only: p50 {lat['placed_p50_us']:.1f} us, p99 {lat['placed_p99_us']:.1f} us; "
              f"decisions sha256 {lat['decisions_sha256']})", ""]
    lines += [f"- target {'met' if ok else 'MISSED'}: {name}" for name, ok in s["targets"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decisions", type=int, default=20000, help="place() calls in the latency run")
    p.add_argument("--devices", type=int, default=1000, help="devices in the latency run")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    summary = run(args.seed, args.decisions, args.devices)
    report(render(summary), summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
