"""The simulator's prediction of a many-small-functions run (`loadtests.manyfunctions`): the same
arrivals (the load test's `longtail` schedule is the simulator's `zipf` trace, so one seed gives
the same requests), the same fleet (an emulated model of 20 ms a request, a 1 s load, SLO 500 ms,
slice 1/8 declaring 1 GiB), the same number of devices, every function at zero when the load
starts, the controller's 1 s tick and the gateway's 30 s hold, no warm-up. With a live run's
folder its outcome is shown beside: the functions, rate, duration, seed and Zipf exponent are
that run's (its summary.json), the cold start its median (create to ready), and a run of other
slices or other requests is refused. Every device here is emulated or simulated: no figure is a
GPU measurement.

    python -m loadtests.bench.manysim --functions 60 --devices 4 --rate 100 --duration 120 \\
        [--seed 0] [--time-share-busy 0]
    python -m loadtests.bench.manysim --devices 4 --live DIR [--time-share-busy 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from autoscaler.simulator import Profile, ShoalPolicy, SimConfig, Simulation
from autoscaler.traces import make_trace
from deploy.cli.simulate import SPAWN_S

HOLD_TIMEOUT_S = 30.0  # shoal up's: how long the gateway holds a request for a cold start
SLICE = "1/8:1024"  # the fleet's slice, as manyfunctions --slice gives it


def fleet_profile(cold_start_s: float, latency_ms: float = 20.0, slo_ms: float = 500.0) -> Profile:
    """manyfunctions.Fleet's model as the simulator's Profile: batch 1 only, slice 1/8 and 1 GiB."""
    return Profile("emulated-small", ((1, latency_ms),), 0.125, 0.125, cold_start_s=cold_start_s, slo_ms=slo_ms,
                   target_concurrency=4.0, memory_mib=1024)


def simulate(functions: int, devices: int, rate: float, duration_s: float, *, seed: int = 0, zipf: float = 1.1,
             cold_start_s: float = 1.0 + SPAWN_S, time_share_busy: float | None = None) -> dict[str, Any]:
    """One run of Shoal's policy and controller in the simulator, as manyfunctions.outcome's numbers."""
    trace = make_trace("zipf", functions=functions, seconds=duration_s, seed=seed, total_rate=rate, zipf=zipf)
    config = SimConfig(gpus=devices, timeout_s=HOLD_TIMEOUT_S)
    if time_share_busy is not None:
        config = SimConfig(gpus=devices, timeout_s=HOLD_TIMEOUT_S, time_share_busy=time_share_busy)
    record = Simulation(trace, [fleet_profile(cold_start_s)] * functions, ShoalPolicy(), config).run()
    return {"requests": record["requests"], "answered": record["requests"] - record["timed_out"],
            "slo_attainment": record["slo_attainment"], "p95_ms": record["p95_ms"],
            "cold_starts": record["cold_starts"], "takebacks": sum(record["takebacks"].values()),
            "time_shared": record["time_shared"], "replica_slice_seconds": record["replica_slice_seconds"],
            "cold_start_s": cold_start_s}


def live_outcome(folder: Path) -> dict[str, Any]:
    """A manyfunctions run's many.json, with the median create-to-ready of its replica starts
    and what the run was (`run`: functions, rate, duration, seed, zipf, slices)."""
    outcome = json.loads((folder / "many.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    starts = (summary.get("cold_starts") or {}).get("replica_starts", [])
    ready = [s["ready_s"] for s in starts if s.get("ready_s") is not None]
    outcome["cold_start_s"] = statistics.median(ready) if ready else None
    params = summary.get("params", {})
    outcome["run"] = {"functions": len(summary["functions"]), "rate": params.get("rate"),
                      "duration_s": summary.get("duration_s"), "seed": params.get("seed", 0),
                      "zipf": params.get("zipf_s", 1.1), "slices": sorted(set((params.get("slices") or {}).values()))}
    return outcome


ROWS = (("requests", "{:,}"), ("answered", "{:,}"), ("slo_attainment", "{:.2%}"), ("p95_ms", "{:.1f}"),
        ("cold_starts", "{:,}"), ("takebacks", "{:,}"), ("time_shared", "{:,}"), ("replica_slice_seconds", "{:.1f}"),
        ("cold_start_s", "{:.2f}"))


def render(sim: dict[str, Any], live: dict[str, Any] | None) -> str:
    lines = [f"{'':<22} {'simulated':>12}" + (f" {'live (emulated)':>16}" if live else "")]
    for key, fmt in ROWS:
        cells = [sim.get(key)] + ([live.get(key)] if live else [])
        text = ["-" if v is None else fmt.format(v) for v in cells]
        lines.append(f"{key:<22} {text[0]:>12}" + (f" {text[1]:>16}" if live else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.manysim", description=__doc__.splitlines()[0])
    p.add_argument("--functions", type=int, default=60)
    p.add_argument("--devices", type=int, default=4, help="simulated devices of 80 GiB (default 4)")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second in all (default 100)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=0, help="the load test's --seed (default 0, as manyfunctions')")
    p.add_argument("--time-share-busy", type=float, help="the controller's (default: shoal up's); 0: off")
    p.add_argument("--live", type=Path, help="a manyfunctions run's folder (its --out): shown beside, its cold start used")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    live = live_outcome(args.live) if args.live else None
    if live:
        run = live["run"]
        if run["slices"] != [SLICE]:
            print(f"manysim: the run's slices are {run['slices']}; this comparison models {SLICE} "
                  f"(manyfunctions --slice {SLICE})", file=sys.stderr)
            return 2
        args.functions, args.rate, args.duration = run["functions"], run["rate"], run["duration_s"]
        args.seed, args.zipf = run["seed"], run["zipf"]
    cold = live["cold_start_s"] if live and live.get("cold_start_s") else 1.0 + SPAWN_S
    sim = simulate(args.functions, args.devices, args.rate, args.duration, seed=args.seed, zipf=args.zipf,
                   cold_start_s=cold, time_share_busy=args.time_share_busy)
    if live and live.get("requests") != sim["requests"]:
        print(f"manysim: the run sent {live.get('requests')} requests, its schedule here gives {sim['requests']}: "
              "not the same requests (a run of the former longtail arrivals?)", file=sys.stderr)
        return 2
    print(f"{args.functions} functions at slice 1/8 on {args.devices} devices, Zipf {args.zipf:g}, {args.rate:g} "
          f"requests/s for {args.duration:g} s, seed {args.seed} (simulated; live: emulated devices)")
    print(render(sim, live))
    if args.json:
        args.json.write_text(json.dumps({"simulated": sim, "live": live}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
