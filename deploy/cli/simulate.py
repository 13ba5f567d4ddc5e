"""`shoal simulate`: every policy on the same trace, in the cluster simulator. Prints one line per
policy and writes the JSON `{"policies": {...}, "trace": {...}, "cluster": {...}}`. The GPUs and
latency profiles are simulated: nothing it prints is a GPU measurement.

    shoal simulate --trace gamma --cv 4 --policy shoal,kpa,kpa-tuned,ray,ray-tuned,static,oracle \\
        --gpus 8 --functions 20 --seconds 600 --seed 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# option name on the command line -> trace option
TRACE_OPTIONS = {
    "rate": ("requests per second per function", float),
    "cv": ("gamma: coefficient of variation of inter-arrival times", float),
    "step_at_s": ("step: when the rate steps up", float),
    "step_x": ("step: the factor it steps by", float),
    "spike_at_s": ("spike: when it starts", float),
    "spike_s": ("spike: how long it lasts", float),
    "spike_x": ("spike: the factor", float),
    "period_s": ("diurnal/azure: the period of the daily swing", float),
    "swing": ("diurnal: peak / trough", float),
    "mmpp_x": ("mmpp: high rate / low rate", float),
    "low_s": ("mmpp: mean time in the low state", float),
    "high_s": ("mmpp: mean time in the high state", float),
    "total_rate": ("azure: total mean requests per second", float),
    "path": ("csv: file of timestamps, or timestamp,function", str),
}


def parser() -> argparse.ArgumentParser:
    from autoscaler.simulator import POLICIES
    from autoscaler.traces import TRACE_KINDS

    p = argparse.ArgumentParser(prog="shoal simulate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, choices=TRACE_KINDS, help="arrival process")
    p.add_argument("--policy", default=",".join(POLICIES), help=f"comma-separated: {','.join(POLICIES)}")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0)
    p.add_argument("--functions", type=int, default=10, help="functions in the trace (default 10)")
    p.add_argument("--seconds", type=float, default=600.0, help="simulated seconds (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-s", type=float, default=1.0, help="decision interval (default 1 s, the controller's)")
    p.add_argument("--warmup-s", type=float, default=60.0,
                   help="simulated but not counted: functions start at zero (default 60 s)")
    p.add_argument("--json", type=Path, help="write the comparison here")
    for name, (help_, kind) in TRACE_OPTIONS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=help_)
    return p


def main(argv: list[str]) -> int:
    from autoscaler.simulator import SimConfig, simulate
    from autoscaler.traces import make_trace

    args = parser().parse_args(argv)
    options = {name: getattr(args, name) for name in TRACE_OPTIONS if getattr(args, name) is not None}
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    try:
        config = SimConfig(gpus=args.gpus, gpu_memory_mib=int(args.gpu_memory_gib * 1024), tick_s=args.tick_s,
                           warmup_s=args.warmup_s)
        trace = make_trace(args.trace, functions=args.functions, seconds=args.seconds, seed=args.seed, **options)
        result = simulate(trace, policies, config, seed=args.seed)
    except (ValueError, OSError) as exc:
        print(f"shoal simulate: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def render(result: dict) -> str:
    trace = result["trace"]
    lines = [f"trace {trace.get('kind')}: {trace.get('requests')} requests, {trace.get('functions')} "
             f"functions, {trace.get('duration_s')} s (simulated GPUs: {result['cluster']['gpus']})",
             f"{'policy':<10} {'SLO met':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>9} {'slice-s':>11} {'x oracle':>8} "
             f"{'GPU-s':>9} {'cold':>6} {'timeout':>8} {'wall s':>7}"]
    for name, r in result["policies"].items():
        lines.append(f"{name:<10} {r['slo_attainment'] * 100:>8.3f}% {_ms(r['p50_ms']):>8} {_ms(r['p95_ms']):>8} "
                     f"{_ms(r['p99_ms']):>9} {r['replica_slice_seconds']:>11.1f} {_x(r.get('vs_oracle')):>8} "
                     f"{r['whole_gpu_seconds']:>9.0f} {r['cold_starts']:>6} {r['timed_out']:>8} {r['wall_s']:>7.2f}")
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"
