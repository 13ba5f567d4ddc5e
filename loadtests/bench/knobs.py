"""Benchmark: Shoal's policy knobs, one setting at a time, on the policy bench's traces. Shoal alone
runs every trace of loadtests/bench/policy.py at each given seed, once with PolicyConfig's defaults
and once per setting (`--set NAME=knob:value[,knob:value]`), with `kpa-tuned` and `ray-tuned` beside
it. Each setting is judged against the defaults on the synthetic cells (the real trace is printed,
not judged: it was tuned on), by four clauses: cells at or above 99.9 % within the SLO, and cells
where Shoal holds fewer slice-seconds than both tuned peers at an SLO as good, must not fall in
number; the mean SLO (cells named in `--leave-out` left out) may fall by at most `--slo-slack`
points; the slice-seconds summed over the same cells must fall by at least `--min-saving`. It is
how Shoal's own defaults face the check the baselines' got (loadtests/bench/calibrate.py): on seeds
that are not reported. Simulated, no GPU figure; results: docs/benchmarks.md, "Shoal's knobs".

    python -m loadtests.bench.knobs --seeds 3,4 --set sdd15=scale_down_delay_s:15 --set md95=max_duty:0.95 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace
from pathlib import Path

from autoscaler.policy import DEFAULT_CONFIG, PolicyConfig
from autoscaler.simulator import simulate
from loadtests.bench.policy import traces

PEERS = ("kpa-tuned", "ray-tuned")
SLO_BAR = 0.999


def parse_setting(text: str) -> tuple[str, dict[str, float]]:
    """'sdd15=scale_down_delay_s:15' -> ('sdd15', {'scale_down_delay_s': 15.0}); a whole-number
    knob gets an int. Raises ValueError, saying why, for an unknown knob or a value PolicyConfig
    refuses."""
    name, sep, spec = text.partition("=")
    if not sep or not name or name == "defaults" or not spec:
        raise ValueError(f"{text!r}: NAME=knob:value[,knob:value], NAME not 'defaults'")
    known = {f.name for f in fields(PolicyConfig) if f.init}
    over: dict[str, float] = {}
    for item in spec.split(","):
        knob, sep, value = item.partition(":")
        if not sep or knob not in known:
            raise ValueError(f"{text!r}: {knob!r} is not a knob of PolicyConfig")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{text!r}: {value!r} is not a number") from None
        default = getattr(DEFAULT_CONFIG, knob)
        if isinstance(default, bool) or (isinstance(default, int) and not number.is_integer()):
            raise ValueError(f"{text!r}: {knob} takes {type(default).__name__} values")
        over[knob] = int(number) if isinstance(default, int) else number
    replace(DEFAULT_CONFIG, **over)  # PolicyConfig's own checks
    return name, over


def run(job: tuple[int, str, str, dict[str, float] | None]) -> tuple[int, str, dict[str, dict]]:
    """One (seed, batcher, setting name, overrides) over every trace: {trace: {policy: {slo, slice_s}}}.
    Overrides None: the tuned peers, not Shoal."""
    seed, batcher, name, over = job
    policies = list(PEERS) if over is None else ["shoal"]
    config = DEFAULT_CONFIG if over is None else replace(DEFAULT_CONFIG, **over)
    cells: dict[str, dict] = {}
    for trace_name, trace, profiles, cluster in traces(False, seed):
        result = simulate(trace, policies, replace(cluster, batcher=batcher), seed=seed, profiles=profiles,
                          shoal_config=config)["policies"]
        cells[trace_name] = {p: {"slo": r["slo_attainment"], "slice_s": r["replica_slice_seconds"]}
                             for p, r in result.items()}
    return seed, name, cells


def score(shoal: dict[tuple[str, int], dict], peers: dict[tuple[str, int], dict],
          leave_out: set[tuple[str, int]]) -> dict[str, float]:
    """The four clauses' figures of one setting over the synthetic cells (trace, seed)."""
    cells = [c for c in shoal if not c[0].startswith("real-")]
    mean_cells = [c for c in cells if c not in leave_out]
    dominates = sum(all(shoal[c]["slice_s"] < peers[c][p]["slice_s"] and shoal[c]["slo"] >= peers[c][p]["slo"]
                        for p in PEERS) for c in cells)
    return {"at_bar": sum(shoal[c]["slo"] >= SLO_BAR for c in cells), "dominates": dominates,
            "mean_slo_pct": sum(100.0 * shoal[c]["slo"] for c in mean_cells) / len(mean_cells),
            "slice_s": sum(shoal[c]["slice_s"] for c in mean_cells)}


def passes(candidate: dict[str, float], defaults: dict[str, float], slo_slack: float, min_saving: float) -> list[bool]:
    return [candidate["at_bar"] >= defaults["at_bar"], candidate["dominates"] >= defaults["dominates"],
            candidate["mean_slo_pct"] >= defaults["mean_slo_pct"] - slo_slack,
            candidate["slice_s"] <= (1.0 - min_saving) * defaults["slice_s"]]


def _real_order(item: tuple[tuple[str, int], dict]) -> float:
    """real-1x, real-4x, real-10x in that order (the other cells are not printed there)."""
    name = item[0][0]
    return float(name[5:-1]) if name.startswith("real-") else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.knobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="3,4", help="comma-separated (default 3,4: tuning seeds, not reported)")
    p.add_argument("--batcher", choices=("rule", "exact"), default="rule")
    p.add_argument("--set", action="append", default=[], metavar="NAME=knob:value[,knob:value]")
    p.add_argument("--leave-out", default="gamma-cv4-40:3",
                   help="trace:seed cells left out of the mean SLO and the slice-seconds (default gamma-cv4-40:3, "
                        "whose phase alone moves it 1.75 points: docs/benchmarks.md, \"The ticks' phase\")")
    p.add_argument("--slo-slack", type=float, default=0.01, help="points the mean SLO may fall (default 0.01)")
    p.add_argument("--min-saving", type=float, default=0.02, help="share of slice-seconds to save (default 0.02)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        settings = dict(parse_setting(s) for s in args.set)
        leave_out = {(c.split(":")[0], int(c.split(":")[1])) for c in args.leave_out.split(",") if c}
    except (ValueError, IndexError) as e:
        p.error(str(e))
    if not settings:
        p.error("--set: at least one setting to judge against the defaults")
    jobs = [(seed, args.batcher, name, over) for seed in seeds
            for name, over in [("peers", None), ("defaults", {}), *settings.items()]]
    by_name: dict[str, dict[tuple[str, int], dict]] = {}
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        for seed, name, cells in pool.map(run, jobs):
            for trace_name, result in cells.items():
                by_name.setdefault(name, {})[(trace_name, seed)] = result if name == "peers" else result["shoal"]
    peers = by_name.pop("peers")
    scores = {name: score(cells, peers, leave_out) for name, cells in by_name.items()}
    base = scores["defaults"]
    print(f"Shoal's knobs, the {args.batcher} batcher, seeds {args.seeds} (simulated); judged on "
          f"{sum(1 for c in by_name['defaults'] if not c[0].startswith('real-'))} synthetic cells, mean and "
          f"slice-seconds without {sorted(leave_out)}")
    verdicts = {}
    for name, s in scores.items():
        ok = passes(s, base, args.slo_slack, args.min_saving) if name != "defaults" else []
        verdicts[name] = all(ok) if ok else None
        real = " ".join(f"{c[0][5:]} {100 * v['slo']:.3f} %/{v['slice_s']:,.0f}" for c, v in sorted(by_name[name].items(), key=_real_order)
                        if c[0].startswith("real-") and c[1] == seeds[0])
        print(f"  {name:10} >= 99.9 %: {s['at_bar']:2}, dominates both tuned: {s['dominates']:2}, mean SLO "
              f"{s['mean_slo_pct']:.4f} % ({s['mean_slo_pct'] - base['mean_slo_pct']:+.4f}), {s['slice_s']:,.0f} slice-s "
              f"({s['slice_s'] / base['slice_s']:.3f}x)"
              + (f"  clauses {''.join('1234'[i] if v else '-' for i, v in enumerate(ok))}: "
                 f"{'passes' if all(ok) else 'fails'}" if ok else "") + f"  [real, not judged: {real}]")
    passing = sorted((scores[n]["slice_s"], n) for n, v in verdicts.items() if v)
    print(f"  passing, least slice-seconds first: {', '.join(n for _, n in passing) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({
            "batcher": args.batcher, "seeds": seeds, "simulated": True, "settings": settings, "scores": scores,
            "passes": verdicts, "cells": {n: {f"{t}:{s}": v for (t, s), v in cells.items()} for n, cells in by_name.items()},
            "peers": {f"{t}:{s}": v for (t, s), v in peers.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
