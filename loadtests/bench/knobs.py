"""Benchmark: Shoal's policy knobs, one setting at a time, on the policy bench's traces. Shoal alone
runs every trace of loadtests/bench/policy.py at each given seed, once with PolicyConfig's defaults
and once per setting (`--set NAME=knob:value[,knob:value]`), with `kpa-tuned` and `ray-tuned` beside
it. Each setting is judged against the defaults on the synthetic cells (the real trace is printed,
not judged: it was tuned on), by four clauses: cells at or above 99.9 % within the SLO, and cells
where Shoal holds fewer slice-seconds than both tuned peers at an SLO as good, must not fall in
number; the mean SLO (cells named in `--leave-out` left out) may fall by at most `--slo-slack`
points; the slice-seconds summed over the same cells must fall by at least `--min-saving`. It is
how Shoal's own defaults face the check the baselines got (loadtests/bench/calibrate.py): on seeds
that are not reported. Simulated, no GPU figure; results: docs/policy-changes.md, "Shoal's knobs".

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
from typing import Any

from autoscaler.policy import DEFAULT_CONFIG, PolicyConfig
from autoscaler.simulator import BATCHERS, simulate
from loadtests.bench.policy import scenarios, traces

PEERS = ("kpa-tuned", "ray-tuned")
RESERVED = ("defaults", "peers")  # the jobs' own names
SLO_BAR = 0.999


def parse_setting(text: str) -> tuple[str, dict[str, Any]]:
    """'sdd15=scale_down_delay_s:15' -> ('sdd15', {'scale_down_delay_s': 15.0}); a whole-number
    knob gets an int. Raises ValueError, saying why, for a name the bench uses itself, an unknown
    or repeated knob, a switch, or a value PolicyConfig refuses."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise ValueError(f"{text!r}: NAME=knob:value[,knob:value]")
    if name in RESERVED:
        raise ValueError(f"{text!r}: the names {', '.join(RESERVED)} are the bench's own")
    known = {f.name for f in fields(PolicyConfig) if f.init}
    over: dict[str, Any] = {}
    for item in spec.split(","):
        knob, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"{text!r}: {item!r} has no ':value'")
        if knob not in known:
            raise ValueError(f"{text!r}: {knob!r} is not a knob of PolicyConfig")
        if knob in over:
            raise ValueError(f"{text!r}: {knob} set twice")
        default = getattr(DEFAULT_CONFIG, knob)
        if isinstance(default, bool):
            raise ValueError(f"{text!r}: {knob} is a switch; only numeric knobs are set here")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{text!r}: {value!r} is not a number") from None
        if isinstance(default, int) and not number.is_integer():
            raise ValueError(f"{text!r}: {knob} takes whole numbers")
        over[knob] = int(number) if isinstance(default, int) else number
    replace(DEFAULT_CONFIG, **over)  # PolicyConfig's own checks
    return name, over


def synthetic_traces() -> list[str]:
    """The bench's traces that are judged: all but the real trace's."""
    return [name for name, _, _ in scenarios(False) if not name.startswith("real-")]


def parse_cells(text: str, seeds: list[int]) -> set[tuple[str, int]]:
    """'gamma-cv4-40:3, spike:4' -> {('gamma-cv4-40', 3), ('spike', 4)}: synthetic cells of this
    run. Raises ValueError for a malformed item, an unknown trace or real trace, or a seed not run."""
    synthetic = set(synthetic_traces())
    cells = set()
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, sep, seed = item.partition(":")
        if not sep or not seed.strip().lstrip("-").isdigit():
            raise ValueError(f"--leave-out {item!r}: trace:seed")
        if name not in synthetic:
            raise ValueError(f"--leave-out {item!r}: {name!r} is not a synthetic trace of the bench")
        if int(seed) not in seeds:
            raise ValueError(f"--leave-out {item!r}: seed {int(seed)} is not run (--seeds)")
        cells.add((name, int(seed)))
    return cells


def run(job: tuple[int, str, str, dict[str, Any] | None]) -> tuple[int, str, dict[str, dict]]:
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
    if not mean_cells:
        raise ValueError("every synthetic cell is left out: no mean to judge")
    dominates = sum(all(shoal[c]["slice_s"] < peers[c][p]["slice_s"] and shoal[c]["slo"] >= peers[c][p]["slo"]
                        for p in PEERS) for c in cells)
    return {"at_bar": sum(shoal[c]["slo"] >= SLO_BAR for c in cells), "dominates": dominates,
            "mean_slo_pct": sum(100.0 * shoal[c]["slo"] for c in mean_cells) / len(mean_cells),
            "slice_s": sum(shoal[c]["slice_s"] for c in mean_cells)}


def passes(candidate: dict[str, float], defaults: dict[str, float], slo_slack: float, min_saving: float) -> list[bool]:
    return [candidate["at_bar"] >= defaults["at_bar"], candidate["dominates"] >= defaults["dominates"],
            candidate["mean_slo_pct"] >= defaults["mean_slo_pct"] - slo_slack,
            candidate["slice_s"] <= (1.0 - min_saving) * defaults["slice_s"]]


def render(scores: dict[str, dict[str, float]], verdicts: dict[str, list[bool]],
           cells: dict[str, dict[tuple[str, int], dict]], seed: int) -> list[str]:
    """One line per setting: the four figures against the defaults', the clauses, and the real
    trace at `seed` (not judged)."""
    base = scores["defaults"]
    lines = []
    for name, s in scores.items():
        ok = verdicts.get(name)
        clauses = "".join("1234"[i] if v else "-" for i, v in enumerate(ok)) if ok else ""
        real = " ".join(f"{x:g}x {100 * v['slo']:.3f} %/{v['slice_s']:,.0f}" for x, v in sorted(
            ((float(c[0][5:-1]), v) for c, v in cells[name].items() if c[0].startswith("real-") and c[1] == seed),
            key=lambda xv: xv[0]))
        lines.append(
            f"  {name:10} >= 99.9 %: {s['at_bar']:2}, dominates both tuned: {s['dominates']:2}, "
            f"mean SLO {s['mean_slo_pct']:.4f} % ({s['mean_slo_pct'] - base['mean_slo_pct']:+.4f}), "
            f"{s['slice_s']:,.0f} slice-s ({s['slice_s'] / base['slice_s']:.3f}x)"
            + (f"  clauses {clauses}: {'passes' if all(ok) else 'fails'}" if ok else "")
            + f"  [real, not judged: {real}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.knobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="3,4", help="comma-separated (default 3,4: tuning seeds, not reported)")
    p.add_argument("--batcher", choices=BATCHERS, default="rule")
    p.add_argument("--set", action="append", default=[], metavar="NAME=knob:value[,knob:value]")
    p.add_argument("--leave-out", default="gamma-cv4-40:3",
                   help="trace:seed cells left out of the mean SLO and the slice-seconds (default gamma-cv4-40:3, "
                        "whose phase alone moves it 1.75 points: docs/policy-changes.md, \"The ticks' phase\")")
    p.add_argument("--slo-slack", type=float, default=0.01, help="points the mean SLO may fall (default 0.01)")
    p.add_argument("--min-saving", type=float, default=0.02, help="share of slice-seconds to save (default 0.02)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        seeds = sorted({int(s) for s in args.seeds.split(",")})
        parsed = [parse_setting(s) for s in args.set]
        leave_out = parse_cells(args.leave_out, seeds)
    except ValueError as e:
        p.error(str(e))
    settings = dict(parsed)
    if len(settings) < len(parsed):
        p.error("--set: each NAME once")
    if not settings:
        p.error("--set: at least one setting to judge against the defaults")
    if len(leave_out) >= len(synthetic_traces()) * len(seeds):
        p.error("--leave-out: every synthetic cell; nothing would be judged")
    jobs = [(seed, args.batcher, name, over) for seed in seeds
            for name, over in [("peers", None), ("defaults", {}), *settings.items()]]
    by_name: dict[str, dict[tuple[str, int], dict]] = {}
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        for seed, name, cells in pool.map(run, jobs):
            for trace_name, result in cells.items():
                by_name.setdefault(name, {})[(trace_name, seed)] = result if name == "peers" else result["shoal"]
    peers = by_name.pop("peers")
    scores = {name: score(cells, peers, leave_out) for name, cells in by_name.items()}
    verdicts = {name: passes(s, scores["defaults"], args.slo_slack, args.min_saving)
                for name, s in scores.items() if name != "defaults"}
    judged = sum(1 for c in by_name["defaults"] if not c[0].startswith("real-"))
    print(f"Shoal's knobs, the {args.batcher} batcher, seeds {','.join(map(str, seeds))} (simulated); judged on "
          f"{judged} synthetic cells, the mean and slice-seconds without {sorted(leave_out) or 'none'}")
    print("\n".join(render(scores, verdicts, by_name, seeds[0])))
    passing = sorted((scores[n]["slice_s"], n) for n, ok in verdicts.items() if all(ok))
    print(f"  passing, least slice-seconds first: {', '.join(n for _, n in passing) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({
            "batcher": args.batcher, "seeds": seeds, "simulated": True, "settings": settings, "scores": scores,
            "passes": {"defaults": None, **{n: all(ok) for n, ok in verdicts.items()}},
            "cells": {n: {f"{t}:{s}": v for (t, s), v in cells.items()} for n, cells in by_name.items()},
            "peers": {f"{t}:{s}": v for (t, s), v in peers.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
