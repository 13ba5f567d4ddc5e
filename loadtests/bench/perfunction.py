"""Per function, where Shoal's slice-seconds and late requests go on one trace of the policy bench:
after the warm-up, each tick's replicas of the function times their slice, beside the oracle's
count for that tick times the function's slice, how many replicas Shoal held over the oracle's
count, tick by tick, and its requests answered past their SLO (the record's `timed_out` also
counts those never answered). A diagnostic for a bench row that moved (docs/benchmarks.md);
simulated, no GPU figure.

    python -m loadtests.bench.perfunction gamma-cv4 --seed 3 [--batcher exact]
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from autoscaler import simulator as S
from loadtests.bench import policy as bench


class Row(NamedTuple):
    function: str
    shoal_slice_s: float
    oracle_slice_s: float
    over: dict[int, int]  # replicas over the oracle's count -> ticks
    late: int  # requests answered past the SLO


def per_function(trace_name: str, seed: int, batcher: str = "rule") -> tuple[dict, list[Row]]:
    """Shoal's bench result on `trace_name` and, per function, its slice-seconds after the warm-up
    beside the oracle's, its replicas over the oracle's count, tick by tick, and its requests
    answered past the SLO after the warm-up (counted where the record counts them)."""
    ((name, trace, profiles, config),) = bench.traces(False, seed, trace_name)
    config = replace(config, batcher=batcher)
    profiles = profiles if profiles is not None else S.assign_profiles(trace, seed)
    counts = S.oracle_counts(trace, profiles, config.tick_s, config.batcher)
    warm = round(config.warmup_s / config.tick_s)
    held: collections.Counter = collections.Counter()  # function -> slice-seconds
    over: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    late = np.zeros(len(profiles), np.int64)

    class Counted(S.Simulation):
        def _reset_counts(self) -> None:
            super()._reset_counts()
            late[:] = 0

        def _account(self, f, latency, s, n_f) -> None:
            super()._account(f, latency, s, n_f)
            late[:] += np.bincount(f[latency > self.slo_s[f]], minlength=len(late))

        def _decide_all(self, t1: float) -> None:
            super()._decide_all(t1)
            tick = int(round(t1)) - 1
            if tick < warm:
                return
            servers = self.servers
            for fid in range(len(self.profiles)):
                mine = servers.alive & (servers.fid == fid)
                held[fid] += float(servers.slice[mine].sum()) * config.tick_s
                over[fid][int(mine.sum()) - counts.get(fid, {}).get(tick, 0)] += 1

    result = Counted(trace, profiles, S.ShoalPolicy(), config, S.warm_start(trace, profiles, counts)).run()
    rows = [Row(f"f{fid} {profile.name}", held[fid],
                sum(c for tick, c in counts.get(fid, {}).items() if tick >= warm) * profile.slice_fraction * config.tick_s,
                dict(sorted(over[fid].items())), int(late[fid]))
            for fid, profile in enumerate(profiles)]
    return result, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench.perfunction", description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a trace of the policy bench, e.g. gamma-cv4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batcher", choices=("rule", "exact"), default="rule")
    args = parser.parse_args(argv)
    result, rows = per_function(args.trace, args.seed, args.batcher)
    print(f"{args.trace}, seed {args.seed}, {args.batcher} batcher: Shoal {100 * result['slo_attainment']:.3f} % "
          f"within the SLO, {result['replica_slice_seconds']:.1f} slice-s")
    for row in rows:
        ratio = row.shoal_slice_s / row.oracle_slice_s if row.oracle_slice_s else float("nan")
        print(f"{row.function:16s} shoal {row.shoal_slice_s:9.1f} oracle {row.oracle_slice_s:9.1f} x{ratio:.3f}  "
              f"late {row.late:6d}  replicas over the oracle's, ticks: {sorted(row.over.items())}")
    print(f"{'all':16s} shoal {sum(r.shoal_slice_s for r in rows):9.1f} oracle {sum(r.oracle_slice_s for r in rows):9.1f}"
          f"         late {sum(r.late for r in rows):6d}")


if __name__ == "__main__":
    main()
