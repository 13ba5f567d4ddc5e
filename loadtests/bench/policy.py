"""Benchmark: Shoal's policy (with and without slice resizing) against Knative's KPA and Ray
Serve (as published, and tuned by the rule of autoscaler/baselines/tuned.py), static and the oracle.

    python -m loadtests.bench.policy [--quick] [--seed 1] [--json OUT]

In one run, every policy on the same traces in the cluster simulator
(autoscaler/simulator.py, the same policy and placement code as `shoal up`):
- Gamma renewal arrivals with CV 1, 2 and 4; a 10x spike; a diurnal swing
  (8 functions, 1,000 req/s each, 32 simulated GPUs);
- the Azure-Functions-like population, 1,000 functions on 100 simulated GPUs;
- a saturated cluster (40 functions on 15 GPUs); more functions than slices (60 small
  functions at 1/8 on 4 GPUs, Zipf popularity: lending and time-sharing); the real trace;
then the scale run (Shoal alone, one simulated hour of 10,000 functions on 1,000
GPUs, its wall time: with policy.py compiled by mypyc at 1 s and 2 s ticks, and at
1 s with policy.py interpreted, the reference, side by side: the same record, and the
ratio of wall times) and the placement benchmark (packing over the lower bound,
decision p99 on 1,000 devices).

Prints, per trace, each policy's SLO attainment, replica-slice-seconds and its
ratio to the oracle and to Shoal, and whether the issue's targets hold. Every GPU
and latency profile here is simulated: no figure is a GPU measurement.

Like the placement benchmark, this one calls Shoal's code directly: a simulation
has no HTTP surface.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from autoscaler.simulator import (
    BATCHERS, ROUTINGS, Profile, Simulation, ShoalPolicy, SimConfig, assign_profiles, simulate, warm_start,
)
from autoscaler.traces import make_trace
from deploy.cli.simulate import SPAWN_S, load_profile, render
from loadtests.bench.manysim import fleet_profile

POLICIES = ["shoal", "shoal-fixed", "kpa", "kpa-tuned", "ray", "ray-tuned", "static", "oracle"]
WARMUP_S = 60.0
SATURATED_GPUS = 15


def saturated_gpus(trace, profiles, tick_s: float = 1.0, share: float = 0.85) -> tuple[float, int]:
    """The oracle's peak slice use (GPUs: the most replicas x slice it holds in any tick) and the
    GPUs of which that is about `share`: how the saturated scenario's cluster was sized."""
    from autoscaler.simulator import oracle_counts

    use: dict[int, float] = {}
    for fid, per_tick in oracle_counts(trace, profiles, tick_s).items():
        for tick, count in per_tick.items():
            use[tick] = use.get(tick, 0.0) + count * profiles[fid].slice_fraction
    peak = max(use.values())
    return peak, round(peak / share)


SYNTHETIC = ("gamma-cv1", "gamma-cv2", "gamma-cv4", "spike", "diurnal")  # the calibration's shapes
REAL_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "AzureLLMInferenceTrace_code.csv"
REAL_PROFILE = Path(__file__).resolve().parents[2] / "functions" / "examples" / "emulated_code.yaml"
# the functions of `loadtests.manyfunctions` (its Fleet): 20 ms a request, no batching, a 1 s model
# load (+ 0.5 s to spawn: deploy.cli.simulate.SPAWN_S), SLO 500 ms, slice 1/8 declaring 1 GiB
SMALL_PROFILE = fleet_profile(1.0 + SPAWN_S)


def scenarios(quick: bool) -> list[tuple[str, dict, SimConfig]]:
    """(name, trace options with `kind`, cluster). A `profile` option gives every function that
    emulated profile (SLO 200 ms, slice 1/4), instead of the built-in mix."""
    seconds = 300.0 if quick else 900.0
    base = dict(functions=8, seconds=seconds, rate=1000.0)
    small = SimConfig(gpus=32, warmup_s=WARMUP_S)
    azure_s = 600.0 if quick else 1800.0
    out = [
        ("gamma-cv1", dict(kind="gamma", cv=1.0, **base), small),
        ("gamma-cv2", dict(kind="gamma", cv=2.0, **base), small),
        ("gamma-cv4", dict(kind="gamma", cv=4.0, **base), small),
        # the same 8,000 req/s spread over 40 functions (a population of tens, issue 19)
        ("gamma-cv4-40", dict(kind="gamma", cv=4.0, functions=40, seconds=seconds, rate=200.0), small),
        ("spike", dict(kind="spike", spike_x=10.0, spike_s=30.0, **{**base, "rate": 200.0}), small),
        ("diurnal", dict(kind="diurnal", swing=4.0, **base), small),
        ("azure-1000", dict(kind="azure", functions=1000, seconds=azure_s), SimConfig(gpus=100, warmup_s=WARMUP_S)),
        # a cluster too small for the load: 40 functions at 50 req/s each, Gamma CV 4 (seed 1): the
        # oracle's peak slice use (saturated_gpus) is 12.6 GPUs at 300 s, 13.1 at 600 s: 84-88 % of 15
        ("saturated", dict(kind="gamma", cv=4.0, functions=40, seconds=seconds if quick else 600.0, rate=50.0),
         SimConfig(gpus=SATURATED_GPUS, warmup_s=WARMUP_S)),
        # more functions than slices (issue 18's many small functions): 60 at 1/8 on 4 GPUs (32
        # slices), Zipf 1.1 popularity, 100 req/s in all; Shoal lends idle slices and time-shares
        # a quiet device for a first replica (also shown with time-sharing off: shoal-no-share)
        ("many-small", dict(kind="zipf", functions=60, seconds=seconds, total_rate=100.0, zipf=1.1,
                            profile=SMALL_PROFILE), SimConfig(gpus=4, warmup_s=WARMUP_S)),
    ]
    if REAL_TRACE.exists():  # one real hour, as one function, as it came and compressed 4x and 10x
        out.extend(real_scenario(REAL_TRACE, x) for x in (1, 4, 10))
    return out


def real_scenario(path: Path, compress: float) -> tuple[str, dict, SimConfig]:
    """The real trace's cell for the arrivals of the CSV at `path` (a TIMESTAMP column) compressed
    `compress` times: one function with the emulated code-completion profile on 8 GPUs."""
    return (f"real-{compress:g}x", dict(kind="csv", path=str(path), compress=float(compress), profile=str(REAL_PROFILE)),
            SimConfig(gpus=8, warmup_s=WARMUP_S))


def trace_of(options: dict, seed: int):
    """(trace, profiles) of a scenario's trace options; profiles None for the built-in mix."""
    options = dict(options)
    kind, profile = options.pop("kind"), options.pop("profile", None)
    trace = make_trace(kind, seed=seed, **options)
    if profile is not None:
        profile = profile if isinstance(profile, Profile) else load_profile(Path(profile))
    return trace, None if profile is None else [profile] * len(trace.functions)


def traces(quick: bool, seed: int, names: str | None = None):
    """(name, trace, profiles, cluster) of each scenario (only `names`, comma-separated, when
    given); profiles None for the built-in mix (assign_profiles by the seed)."""
    for name, options, config in scenarios(quick):
        if names and name not in names.split(","):
            continue
        trace, profiles = trace_of(options, seed)
        yield name, trace, profiles, config


def verdicts(name: str, result: dict) -> list[str]:
    p = result["policies"]
    shoal = p["shoal"]
    lines = []
    for other in ("kpa", "kpa-tuned", "ray", "ray-tuned"):
        fewer = shoal["replica_slice_seconds"] < p[other]["replica_slice_seconds"]
        as_good = shoal["slo_attainment"] >= p[other]["slo_attainment"]
        ratio = shoal["replica_slice_seconds"] / p[other]["replica_slice_seconds"]
        lines.append(f"  shoal vs {other}: {ratio:.2f}x the slice-seconds at SLO {shoal['slo_attainment']:.4%} vs "
                     f"{p[other]['slo_attainment']:.4%}: {'met' if fewer and as_good else 'NOT met'}")
    if name == "saturated":
        gap = p["oracle"]["slo_attainment"] - shoal["slo_attainment"]
        short = sum(shoal.get("held_short", {}).values())
        lines.append(f"  target on a saturated cluster: SLO within 1 point of the oracle's ({shoal['slo_attainment']:.4%} "
                     f"vs {p['oracle']['slo_attainment']:.4%}): {'met' if gap <= 0.01 else 'NOT met'}; "
                     f"{short} replica(s) held short, {sum(shoal.get('takebacks', {}).values())} taken back")
    if name == "many-small":  # time-shared slices hold more than the devices: what they cost is the GPUs
        gpu_s = {k: p[k]["whole_gpu_seconds"] for k in ("shoal", "kpa-tuned", "ray-tuned")}
        lines.append(f"  whole GPU-seconds (time-shared slices count beyond the devices): shoal {gpu_s['shoal']:,.0f}, "
                     f"kpa-tuned {gpu_s['kpa-tuned']:,.0f}, ray-tuned {gpu_s['ray-tuned']:,.0f}; "
                     f"time-shared first replicas {shoal.get('time_shared', 0)} after the warm-up, "
                     f"{shoal.get('time_shared_with_warmup', 0)} with it")
    if name.startswith("gamma-cv4"):
        ok = shoal["slo_attainment"] >= 0.999 and shoal["vs_oracle"] <= 1.2
        lines.append(f"  target at CV 4: SLO >= 99.9 % ({shoal['slo_attainment']:.4%}) and <= 1.2x the oracle "
                     f"({shoal['vs_oracle']:.2f}x): {'met' if ok else 'NOT met'}")
    lines.append(f"  shoal at >= 99.9 % within the SLO ({shoal['slo_attainment']:.4%}): "
                 f"{'met' if shoal['slo_attainment'] >= 0.999 else 'NOT met'}")
    if not name.startswith("real-"):
        return lines
    # the real trace (issue 18): no policy a controller could run (the oracle foresees) as good in SLO and cheaper
    better = [other for other, r in p.items() if other not in ("shoal", "oracle")
              and r["slo_attainment"] >= shoal["slo_attainment"]
              and r["replica_slice_seconds"] < shoal["replica_slice_seconds"]]
    lines.append(f"  no other policy as good in SLO and cheaper: {'met' if not better else 'NOT met: ' + ', '.join(better)}")
    return lines


def scale_run(tick_s: float, seconds: float, compiled: bool = True) -> dict:
    """Shoal alone on the Azure-like population of 10,000 functions on 1,000 GPUs; with
    `compiled`, decide() is policy.py compiled by mypyc (the default; `engine` says if it
    fell back), else policy.py interpreted (the reference)."""
    trace = make_trace("azure", functions=10000, seconds=seconds, seed=0)
    profiles = assign_profiles(trace, 0)
    started = time.perf_counter()
    policy = ShoalPolicy(compiled=compiled)
    sim = Simulation(trace, profiles, policy, SimConfig(gpus=1000, tick_s=tick_s), warm_start(trace, profiles))
    record = sim.run()
    record["wall_with_setup_s"] = round(time.perf_counter() - started, 2)
    return {"tick_s": tick_s, "seconds": seconds, "functions": 10000, "gpus": 1000, "compiled": compiled,
            "engine": policy.engine, **record}


def same_record(a: dict, b: dict) -> bool:
    """The same simulation, every number but the wall times."""
    def strip(r: dict) -> dict:
        return {k: v for k, v in r.items() if "wall" not in k and k not in ("compiled", "engine")}

    return strip(a) == strip(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter traces (a smoke run, not for the record)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="where to write the results (default "
                        "loadtests/bench/results/policy.json, policy-exact.json with --batcher exact)")
    parser.add_argument("--traces", help="comma-separated names: only these traces")
    parser.add_argument("--no-scale", action="store_true", help="the traces only: no scale run, no placement")
    parser.add_argument("--batcher", choices=BATCHERS, default="rule",
                        help="how batching replicas form batches (SimConfig.batcher; default rule)")
    parser.add_argument("--routing", choices=ROUTINGS, default=SimConfig().routing,
                        help="with --batcher exact, how requests reach a function's replicas (SimConfig.routing; "
                             "default fewest, as shoal up's gateway; queue: one queue per function)")
    args = parser.parse_args(argv)
    if args.json is None:
        args.json = Path("loadtests/bench/results") / ("policy.json" if args.batcher == "rule" else "policy-exact.json")
    # the traces' batcher; the scale run and the placement bench run the default ("rule")
    out: dict = {"traces": {}, "simulated": True, "batcher": args.batcher}  # each trace's routing: its "cluster"
    for name, trace, profiles, config in traces(args.quick, args.seed, args.traces):
        config = replace(config, batcher=args.batcher, routing=args.routing)
        result = simulate(trace, POLICIES, config, seed=args.seed, profiles=profiles)
        if name == "many-small":  # what time-sharing adds: the same policy without it
            off = simulate(trace, ["shoal"], replace(config, time_share_busy=0.0), seed=args.seed, profiles=profiles)
            result["policies"]["shoal-no-share"] = off["policies"]["shoal"]
        out["traces"][name] = result
        print(f"\n== {name}")
        print(render(result))
        print("\n".join(verdicts(name, result)), flush=True)
    if args.no_scale:
        return _write(out, args.json)
    seconds = 600.0 if args.quick else 3600.0
    from loadtests.bench import decide

    # how fast this machine is right now (wall times on this shared VM have varied 1.7x from day
    # to day): one steady look timed alone, the kind of work the scale run does ~2.5 million times
    out["decide_us_per_look"] = round(decide.best_us(20000, 5), 2)
    fast = decide.compiled()
    out["decide_compiled_us_per_look"] = round(decide.best_us(20000, 5, fast), 2) if fast is not None else None
    scale_run(1.0, 10.0)  # builds policy.py with mypyc (or loads it from its cache) outside the timed runs
    out["scale"] = [scale_run(tick, seconds) for tick in (1.0, 2.0)]
    reference = scale_run(1.0, seconds, compiled=False)
    out["scale_reference"] = reference
    out["scale_same_record"] = same_record(out["scale"][0], reference)
    print("\n== scale: Shoal, 10,000 functions (azure-like), 1,000 simulated GPUs")
    print(f"  this machine now: one steady look (snapshot + decide(), loadtests.bench.decide) "
          f"{out['decide_us_per_look']:.2f} us interpreted, "
          f"{out['decide_compiled_us_per_look'] or math.nan:.2f} us compiled")
    print(f"  decide(): {out['scale'][0]['engine']}")
    for s in out["scale"]:
        met = s["wall_s"] <= 60 * seconds / 3600
        print(f"  tick {s['tick_s']:.0f} s: {s['seconds']:.0f} simulated s, {s['requests']:,} requests in "
              f"{s['wall_s']:.1f} s of wall time (target <= 60 s for an hour: {'met' if met else 'NOT met'}); "
              f"SLO {s['slo_attainment']:.4%}")
    print(f"  reference (policy.py interpreted), tick 1 s: {reference['wall_s']:.1f} s; compiled / reference "
          f"{out['scale'][0]['wall_s'] / reference['wall_s']:.2f}x, "
          f"{'the same record' if out['scale_same_record'] else 'RECORDS DIFFER'}")
    from loadtests.bench import placement

    out["placement"] = placement.run(seed=args.seed)
    print("\n== placement")
    print(placement.render(out["placement"]))
    return _write(out, args.json)


def _write(out: dict, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
