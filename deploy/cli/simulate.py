"""`shoal simulate`: every policy on the same trace, in the cluster simulator. Prints one line per
policy and writes the JSON `{"policies": {...}, "trace": {...}, "cluster": {...}}`. The GPUs and
latency profiles are simulated: nothing it prints is a GPU measurement.

    shoal simulate --trace gamma --cv 4 --policy shoal,shoal-fixed,kpa,kpa-tuned,ray,ray-tuned,static,oracle \\
        --gpus 8 --functions 20 --seconds 600 --seed 1 --start warm --json out.json
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
    "path": ("csv: file of timestamps, or timestamp,function (or a header naming a timestamp column)", str),
    "compress": ("csv: divide the file's times by this (4: four times the rate)", float),
}


def parser() -> argparse.ArgumentParser:
    from autoscaler.simulator import BATCHERS, POLICIES, ROUTINGS, STARTS, SimConfig
    from autoscaler.traces import TRACE_KINDS

    p = argparse.ArgumentParser(prog="shoal simulate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, choices=TRACE_KINDS, help="arrival process")
    p.add_argument("--policy", default=",".join(POLICIES), help=f"comma-separated: {','.join(POLICIES)}")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0)
    p.add_argument("--functions", type=int, default=10, help="functions in the trace (default 10)")
    p.add_argument("--seconds", type=float, help="simulated seconds (default 600; csv: up to the last timestamp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-s", type=float, default=1.0, help="decision interval (default 1 s, the controller's)")
    p.add_argument("--warmup-s", type=float, default=60.0,
                   help="simulated but not counted (default 60 s)")
    p.add_argument("--start", choices=STARTS, default="warm",
                   help="every reactive policy starts warm (replicas as if it had been running) or cold "
                        "(every function at zero); default warm")
    p.add_argument("--batcher", choices=BATCHERS, default="rule",
                   help="how batching replicas form batches: rule (the occupancy rule, an idealized batcher; "
                        "the default) or exact (shoal up's batcher, no queue delay)")
    p.add_argument("--routing", choices=ROUTINGS, default=SimConfig().routing,
                   help="how the exact batcher's requests reach a function's replicas: fewest (as shoal up's "
                        "gateway, each to the ready replica with the fewest outstanding; the default) or queue "
                        "(one queue per function)")
    p.add_argument("--json", type=Path, help="write the comparison here")
    p.add_argument("--profile", type=Path,
                   help="a `kind: profile` YAML (e.g. functions/examples/emulated_code.yaml) every function "
                        "gets, instead of the built-in mix")
    p.add_argument("--slo-ms", type=float, default=200.0, help="with --profile: the SLO (default 200 ms)")
    p.add_argument("--slice", type=float, default=0.25, help="with --profile: the slice of a GPU (default 1/4)")
    p.add_argument("--cold-start-s", type=float,
                   help="with --profile: the cold start (default: the profile's load_s + 0.5 s to spawn)")
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
                           warmup_s=args.warmup_s, batcher=args.batcher, routing=args.routing)
        trace = make_trace(args.trace, functions=args.functions, seconds=args.seconds, seed=args.seed, **options)
        profiles = None if args.profile is None else [profile_from(args)] * len(trace.functions)
        result = simulate(trace, policies, config, seed=args.seed, profiles=profiles, start=args.start)
    except (ValueError, OSError) as exc:
        print(f"shoal simulate: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


SPAWN_S = 0.5  # a replica's process start before its model loads, on top of load_s


def profile_from(args: argparse.Namespace):
    """The simulator's Profile from the command line's --profile, --slo-ms, --slice, --cold-start-s."""
    return load_profile(args.profile, args.slo_ms, args.slice, args.cold_start_s)


def load_profile(path: Path, slo_ms: float = 200.0, slice_fraction: float = 0.25, cold_start_s: float | None = None):
    """The simulator's Profile from a `kind: profile` YAML, read by the emulated model's own
    parser (serving/models/profile.py), with the SLO, slice and cold start given (by default
    the profile's load_s + SPAWN_S)."""
    import yaml

    from autoscaler.simulator import Profile
    from serving.models.base import LoadError
    from serving.models.profile import parse_profile

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        parsed = parse_profile(doc, str(path))
    except (yaml.YAMLError, LoadError) as exc:
        raise ValueError(str(exc)) from None
    cold = parsed["load_s"] + SPAWN_S if cold_start_s is None else cold_start_s
    if cold < 0 or slo_ms <= 0:
        raise ValueError(f"--cold-start-s ({cold}) must be >= 0 and --slo-ms ({slo_ms}) > 0")
    return Profile(path.stem, tuple(parsed["points"]), slice_fraction, slice_fraction, cold_start_s=cold,
                   slo_ms=slo_ms)


def render(result: dict) -> str:
    trace = result["trace"]
    cluster = result["cluster"]
    lines = [f"trace {trace.get('kind')}: {trace.get('requests')} requests, {trace.get('functions')} "
             f"functions, {trace.get('duration_s')} s (simulated GPUs: {cluster['gpus']}; reactive policies "
             f"start {cluster.get('start', 'warm')}; cold: starts from zero a request waited for)",
             f"{'policy':<11} {'SLO met':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>9} {'slice-s':>11} {'x oracle':>8} "
             f"{'GPU-s':>9} {'cold':>6} {'starts':>7} {'timeout':>8} {'wall s':>7}"]
    for name, r in result["policies"].items():
        lines.append(f"{name:<11} {r['slo_attainment'] * 100:>8.3f}% {_ms(r['p50_ms']):>8} {_ms(r['p95_ms']):>8} "
                     f"{_ms(r['p99_ms']):>9} {r['replica_slice_seconds']:>11.1f} {_x(r.get('vs_oracle')):>8} "
                     f"{r['whole_gpu_seconds']:>9.0f} {r['cold_starts']:>6} {r.get('replica_starts', '-'):>7} "
                     f"{r['timed_out']:>8} {r['wall_s']:>7.2f}")
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"
